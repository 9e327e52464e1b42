"""A graph's flat pointwise kernels relaunched alone at other block sizes and warps: what the
elements a thread hold change.

A flat kernel's launch (``runtime.pointwise_config``) holds 2048 bf16 elements by 4 warps, 16 a
thread, so that its contiguous loads and its store are 16-byte vectors. Triton gives every load
of a kernel the elements a thread of its widest access (its coalescing pass: "for loads, we can
expect that the gaps won't matter due to the L1 cache"), so a load that cannot be a vector (a
window's tap at an odd offset, a load under a mask that varies element by element) is issued one
element at a time, with the lanes of a warp 8 elements apart: each such warp-wide load touches
four or five 128-byte lines where one or two hold its 64 bytes. A depthwise window issues nine of
them an element. This study measures whether fewer elements a thread (the lanes then adjacent)
make such kernels faster.

For each graph (the padded depthwise layers of ``padded_window_study`` and, with ``--models``,
zoo models at real sizes), the compiled graph is called once while every kernel launch is
recorded (the kernel, its arguments cloned before the launch, its outputs after it). Each flat
kernel (one XBLOCK, no other block) is then launched alone on the clones, replayed 20 times in a
CUDA graph, at its own config and, for the slowest ``--top`` of them, at each of ``CONFIGS``;
each relaunch's outputs must equal the recorded ones bit for bit (the same code). A table row per
kernel: us at its own config, then each config's us, and its loads and the vector loads among
them (from the source: a load whose index is ``xindex`` plus a multiple of 8 and no mask). For
the models, their tiled kernels (XBLOCK by YBLOCK) follow, each at ``tile_configs``, and with
``--reductions`` their persistent reductions at other XBLOCK and warps (``study_reductions``).

    PYTHONPATH=. python -m benchmarks.studies.flat_configs_study [--models mobilenet_v2,efficientnet]   # GPU
    PYTHONPATH=. python -m benchmarks.studies.flat_configs_study --check    # the relaunches' outputs, any device
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from typing import Any, Callable

import torch

if not torch.cuda.is_available():  # the kernels run in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fusebackend  # noqa: E402
from benchmarks.timing import graph_replay_us, study_parser, study_setup  # noqa: E402
from fusebackend.kernels import runtime  # noqa: E402

# (XBLOCK, warps): 16, 8, 4, 2 and 1 elements a thread at 4 warps; 4, 2 and 1 at 8
CONFIGS = ((2048, 4), (1024, 4), (512, 4), (256, 4), (128, 4), (1024, 8), (512, 8), (256, 8))


@dataclasses.dataclass
class Launch:
    name: str
    kernel: Any  # the JITFunction
    launch: dict[str, int]
    args: list[Any]  # tensors cloned before the launch
    outputs: dict[int, torch.Tensor]  # argument position -> the tensor as the launch left it
    grid: int = 0  # programs (0: given per call)


def record(fn: Callable[[], Any]) -> list[Launch]:
    """Every kernel launch of one call of ``fn`` (a compiled graph's first call, which launches
    each kernel through Triton's path)."""
    launches: list[Launch] = []
    original = runtime.Launcher._through_triton

    def through(self: runtime.Launcher, stream: Any, *args: Any) -> None:
        names = self.kernel.arg_names
        clones = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        original(self, stream, *args)
        outs = {i: args[i].clone() for i, n in enumerate(names[:len(args)])
                if n.startswith("out_ptr") and isinstance(args[i], torch.Tensor)}
        launches.append(Launch(self.kernel.fn.__name__, self.kernel, dict(self.launch), clones, outs,
                               0 if self.per_call else self.grid[0]))

    runtime.Launcher._through_triton = through
    try:
        with fusebackend.config.patch(graph_cache=False):
            fn()
    finally:
        runtime.Launcher._through_triton = original
    return launches


def is_flat(launch: Launch) -> bool:
    names = launch.kernel.arg_names
    return ("XBLOCK" in launch.launch and not {"RBLOCK", "YBLOCK"} & set(launch.launch)
            and "xnumel" in names and not launch.launch.get("debug"))


def tile_extents(launch: Launch) -> tuple[int, int] | None:
    """A tiled kernel's extents along x and y (its source's ``x_tiles = N // XBLOCK`` and
    ``y_tiles = M // YBLOCK``), or None for any other kernel."""
    if set(launch.launch) - {"num_warps"} != {"XBLOCK", "YBLOCK"} or "xnumel" not in launch.kernel.arg_names:
        return None
    source = inspect.getsource(launch.kernel.fn)
    x = re.search(r"x_tiles = (\d+) // XBLOCK", source)
    y = re.search(r"y_tiles = (\d+) // YBLOCK", source)
    return (int(x.group(1)), int(y.group(1))) if x and y else None


def tile_configs(launch: Launch) -> list[tuple[int, int, int]]:
    """(XBLOCK, YBLOCK, warps) around a tiled kernel's own: its YBLOCK a quarter, half, as is and
    doubled at 2, 4 and 8 warps; its XBLOCK halved and doubled at 4; those dividing the extents."""
    xb, yb = launch.launch["XBLOCK"], launch.launch["YBLOCK"]
    inner, rows = tile_extents(launch) or (0, 0)
    wanted = [(xb, y, w) for y in (yb // 4, yb // 2, yb, yb * 2) for w in (2, 4, 8)]
    wanted += [(xb // 2, yb, 4), (xb * 2, yb, 4)]
    return [(x, y, w) for x, y, w in wanted if x >= 1 and y >= 1 and inner % x == 0 and rows % y == 0]


def relaunch(launch: Launch, xblock: int, warps: int | None, yblock: int | None = None,
             rblock: int | None = None) -> tuple[Callable[[], None], bool]:
    """A call of the kernel alone at ``xblock`` (``yblock``, ``rblock``, ``warps``) on fresh
    outputs, and whether its outputs equal the recorded ones."""
    names = launch.kernel.arg_names
    args = [torch.empty_like(launch.outputs[i]) if i in launch.outputs else a for i, a in enumerate(launch.args)]
    xnumel = args[names.index("xnumel")]
    options = {k: v for k, v in launch.launch.items() if k not in ("XBLOCK", "YBLOCK", "RBLOCK", "num_warps")}
    options["XBLOCK"] = xblock
    if yblock is not None:
        options["YBLOCK"] = yblock
    if rblock is not None:
        options["RBLOCK"] = rblock
    if warps is not None:
        options["num_warps"] = warps
    grid = (-(-xnumel // (xblock * (yblock or 1))),)

    def call() -> None:
        launch.kernel[grid](*args, **options)

    call()
    same = all(torch.equal(args[i], want) or bool(torch.isnan(want).any())
               for i, want in launch.outputs.items())
    return call, same


def loads(source: str) -> tuple[int, int]:
    """A kernel's loads, and those that Triton can make vectors: an index of ``xindex`` plus a
    multiple of 8, without a mask (a rough reading of the source)."""
    found = re.findall(r"tl\.load\(([^\n]*)\)", source)
    vector = [f for f in found if re.fullmatch(r"in_ptr\d+ \+ \(xindex( [+-] \d+)?\)", f.strip())
              and int((re.findall(r"[+-] (\d+)\)", f) or ["0"])[0]) % 8 == 0]
    return len(found), len(vector)


def own_times(title: str, launches: list[Launch], timed: bool) -> list[tuple[float, Launch]]:
    """Each launch relaunched alone at its own blocks and warps, checked against its recorded
    outputs and timed (0 untimed): (us, launch), the slowest first."""
    rows = []
    for l in launches:
        blocks = {k: v for k, v in l.launch.items() if k in ("YBLOCK", "RBLOCK")}
        call, same = relaunch(l, l.launch["XBLOCK"], l.launch.get("num_warps"),
                              blocks.get("YBLOCK"), blocks.get("RBLOCK"))
        if not same:
            raise AssertionError(f"{title}: {l.name} relaunched gives other outputs")
        rows.append((graph_replay_us(call) if timed else 0.0, l))
    return sorted(rows, key=lambda r: -r[0])


def study(title: str, fn: Callable[[], Any], top: int, timed: bool) -> None:
    launches = [l for l in record(fn) if is_flat(l)]
    rows = own_times(title, launches, timed)
    total = sum(us for us, _ in rows)
    print(f"\n{title}: {len(rows)} flat kernels, {total:.1f} us at their own configs")
    print(f"{'kernel':52s} {'own':>14s}" + "".join(f" {f'{b}/{w}':>8s}" for b, w in CONFIGS) + "  loads (vectors)")
    for us, l in rows[:top]:
        xnumel = l.args[l.kernel.arg_names.index("xnumel")]
        cells = []
        for b, w in CONFIGS:
            if xnumel % b or b > runtime._next_pow2(xnumel):
                cells.append(f" {'-':>8s}")
                continue
            call, same = relaunch(l, b, w)
            if not same:
                raise AssertionError(f"{title}: {l.name} at {b}/{w} gives other outputs")
            cells.append(f" {graph_replay_us(call) if timed else 0.0:8.1f}")
        own = f"{us:.1f} {l.launch['XBLOCK']}/{l.launch.get('num_warps', '-')}"
        n, vec = loads(inspect.getsource(l.kernel.fn))
        print(f"{l.name[:52]:52s} {own:>14s}" + "".join(cells) + f"  {n} ({vec})", flush=True)


def study_tiles(title: str, fn: Callable[[], Any], top: int, timed: bool) -> None:
    """The same for a graph's tiled kernels, at ``tile_configs``."""
    launches = [l for l in record(fn) if tile_extents(l) is not None]
    rows = own_times(title, launches, timed)
    print(f"\n{title}: {len(rows)} tiled kernels, {sum(us for us, _ in rows):.1f} us at their own configs")
    for us, l in rows[:top]:
        inner, ysize = tile_extents(l) or (0, 0)
        own = f"{l.launch['XBLOCK']}x{l.launch['YBLOCK']}/{l.launch.get('num_warps', '-')}"
        cells = []
        for x, y, w in tile_configs(l):
            call, same = relaunch(l, x, w, y)
            cells.append(f"{x}x{y}/{w} {graph_replay_us(call) if timed else 0.0:.1f}" + ("" if same else " (other outputs)"))
        n, _ = loads(inspect.getsource(l.kernel.fn))
        print(f"{l.name[:52]}: {ysize} rows of {inner}, {n} loads; own {own} {us:.1f} us; " + ", ".join(cells), flush=True)


def is_persistent_reduction(launch: Launch) -> bool:
    """A reduction whose rows each sit in one block (its source says so), one program a block of
    XBLOCK rows: it can be launched at any XBLOCK dividing its rows."""
    names = launch.kernel.arg_names
    if set(launch.launch) - {"num_warps"} != {"XBLOCK", "RBLOCK"} or "xnumel" not in names:
        return False
    xnumel = launch.args[names.index("xnumel")]
    return ("# persistent: each row in one block" in inspect.getsource(launch.kernel.fn)
            and launch.grid * launch.launch["XBLOCK"] == xnumel)


def study_reductions(title: str, fn: Callable[[], Any], top: int, timed: bool) -> None:
    """A graph's persistent reductions at XBLOCK halved, as is, doubled and quadrupled, by 4, 8
    and 16 warps (RBLOCK as chosen), those dividing the rows."""
    launches = [l for l in record(fn) if is_persistent_reduction(l)]
    rows = own_times(title, launches, timed)
    print(f"\n{title}: {len(rows)} persistent reductions, {sum(us for us, _ in rows):.1f} us at their own configs")
    for us, l in rows[:top]:
        xb, rb = l.launch["XBLOCK"], l.launch["RBLOCK"]
        xnumel = l.args[l.kernel.arg_names.index("xnumel")]
        cells = []
        for x in (xb // 2, xb, xb * 2, xb * 4):
            for w in (4, 8, 16):
                if x < 1 or xnumel % x or x * rb > 1 << 16:
                    continue
                call, same = relaunch(l, x, w, rblock=rb)
                cells.append(f"{x}/{w} {graph_replay_us(call) if timed else 0.0:.1f}" + ("" if same else " (other outputs)"))
        print(f"{l.name[:52]}: {xnumel} rows of {rb}; own {xb}/{l.launch.get('num_warps', '-')} {us:.1f} us; "
              + ", ".join(cells), flush=True)


def main() -> None:
    parser = study_parser(__doc__)
    parser.add_argument("--models", default="", help="zoo models at real sizes, inference")
    parser.add_argument("--top", type=int, default=3, help="kernels a graph relaunched at every config")
    parser.add_argument("--models-only", action="store_true", help="the models alone, not the padded layers")
    parser.add_argument("--reductions", action="store_true", help="the models' persistent reductions too")
    args, device, bandwidth = study_setup(parser)
    gpu, timed = device.type == "cuda", bandwidth > 0
    from benchmarks.studies.padded_window_study import CASES, PaddedDepthwise

    for c, h, stride, pad in () if args.models_only else CASES if gpu else CASES[:1]:
        n = 64 if gpu else 2
        if not gpu:  # 4096 elements: every config divides them
            h, c = 16, 8
        torch.manual_seed(0)
        module = PaddedDepthwise(c, stride, pad).to(device).eval().to(torch.bfloat16)
        x = torch.randn(n, c, h, h, device=device, dtype=torch.bfloat16)
        torch._dynamo.reset()
        compiled = torch.compile(module, backend=fusebackend.fuse)
        with torch.no_grad():
            study(f"b{n} {c}x{h}x{h} 3x3 /{stride} pad {pad}", lambda: compiled(x), args.top, timed)
    if args.models:
        from benchmarks.zoo import registry

        zoo = {m.name: m for m in registry._MODELS}
        for name in args.models.split(","):
            built = zoo[name].build("real" if gpu else "tiny", device.type, torch.bfloat16 if gpu else torch.float32)
            model = built.model.eval()
            torch._dynamo.reset()
            compiled = torch.compile(model, backend=fusebackend.fuse)
            with torch.no_grad():
                study(f"{name} {built.shapes}", lambda: compiled(**built.inputs), args.top, timed)
                torch._dynamo.reset()
                compiled = torch.compile(model, backend=fusebackend.fuse)
                study_tiles(f"{name} {built.shapes}", lambda: compiled(**built.inputs), args.top, timed)
                if args.reductions:
                    torch._dynamo.reset()
                    compiled = torch.compile(model, backend=fusebackend.fuse)
                    study_reductions(f"{name} {built.shapes}", lambda: compiled(**built.inputs), args.top, timed)


if __name__ == "__main__":
    main()
