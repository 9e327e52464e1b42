"""GPU: what is live at the peak of one step, under each backend.

For each zoo model and mode, each variant (eager, Inductor, fuse) is compiled, run once, then run
once more with PyTorch's allocator recording every allocation and free with its Python stack
(``torch.cuda.memory._record_memory_history``). The events are replayed to find the moment the
most memory was allocated, and the blocks live then are listed, largest first, each with the line
of generated code (fuse's wrapper, Inductor's output code) or of the model that allocated it:

    PYTHONPATH=. python -m benchmarks.studies.memory_study --models resnet,convnext --top 12

Blocks allocated before the step (weights, inputs, eager's reference outputs) are counted in the
peak but listed as one line, "before the step".

In ``--mode train`` each variant's line also gives what its forward keeps for the backward: the
memory still allocated once the loss is computed, and the distinct storages saved through autograd
(``torch.autograd.graph.saved_tensors_hooks``), the model's parameters and buffers left out.
"""

from __future__ import annotations

import argparse
import collections
import linecache
from typing import Any, Sequence

import torch

import fusebackend
from benchmarks.harness import fresh_caches
from benchmarks.zoo.registry import ZOO
from benchmarks.zoo.run import _compiler, _inference_step, _reset, _train_step
from benchmarks.zoo.spec import narrow

_MIB = float(1 << 20)
_OURS = ("wrapper_", "/torchinductor_", "inductor-cache", "/inductor/")


def _where(frames: Sequence[dict[str, Any]]) -> str:
    """The first frame in generated code, else the first outside torch and the standard library."""
    for frame in frames:
        name = frame.get("filename", "")
        if any(tag in name for tag in _OURS) or "/fx_graph" in name:
            line = linecache.getline(name, frame.get("line", 0)).strip()
            return f"{name.rsplit('/', 1)[-1]}:{frame.get('line')}: {line[:110]}"
    for frame in frames:
        name = frame.get("filename", "")
        if "/torch/" not in name and "/python3" not in name and "<" not in name:
            return f"{name.rsplit('/', 2)[-1]}:{frame.get('line')} {frame.get('name')}"
    return "?"


def live_at_peak(step: Any, device: torch.device) -> tuple[float, float, list[tuple[int, str]]]:
    """Peak MiB, base MiB and the blocks the step allocated that were live at the peak."""
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=1_000_000)
    out = step()
    torch.cuda.synchronize(device)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    del out
    events = [e for trace in snapshot["device_traces"] for e in trace]
    live: dict[int, tuple[int, str]] = {}
    total, best, at_best = 0, 0, {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], _where(e.get("frames", [])))
            total += e["size"]
        elif e["action"] in ("free_requested",) and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
        if total > best:
            best, at_best = total, dict(live)
    return (base + best) / _MIB, base / _MIB, sorted(at_best.values(), reverse=True)


def saved_for_backward(built: Any, call: Any, device: torch.device) -> str:
    """What a training step's forward keeps for its backward: the MiB allocated after the forward
    (the loss computed, before the backward) above before it, and the MiB of the distinct storages
    saved through autograd (``saved_tensors_hooks``; the model's own parameters and buffers left
    out, since every variant holds those anyway), with how many tensors were saved."""
    owned = {t.untyped_storage().data_ptr() for t in list(built.model.parameters()) + list(built.model.buffers())}
    storages: dict[int, int] = {}
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        ptr = t.untyped_storage().data_ptr()
        if ptr not in owned:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    for p in built.model.parameters():
        p.grad = None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = built.loss(call(**built.train_inputs))
    torch.cuda.synchronize(device)
    held = (torch.cuda.memory_allocated(device) - before) / _MIB
    loss.backward()
    return f"held after forward {held:.1f} MiB; saved {sum(storages.values()) / _MIB:.1f} MiB in {count} tensors"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.memory_study", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet")
    parser.add_argument("--mode", default="inference", choices=("inference", "train"))
    parser.add_argument("--variants", default="eager,inductor,fuse")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    summary = []
    with fresh_caches(True):
        for name in args.models.split(","):
            _reset()
            built = narrow(ZOO[name].build("real", device, torch.bfloat16), args.batch, args.seq)
            built.model.train(args.mode == "train")
            make = _train_step if args.mode == "train" else _inference_step
            for variant in args.variants.split(","):
                fusebackend.metrics.reset()
                call = _compiler(variant)(built.model)
                step = make(built, call)
                step()  # compile
                step()
                peak, base, blocks = live_at_peak(step, device)
                saved = ""
                if args.mode == "train":
                    saved = saved_for_backward(built, call, device)
                summary.append((name, variant, peak, base, saved))
                print(f"\n== {name} ({args.mode}, {built.shapes}) {variant}: peak {peak:.1f} MiB, "
                      f"before the step {base:.1f} MiB" + (f", {saved}" if saved else ""))
                grouped: collections.Counter[str] = collections.Counter()
                for size, where in blocks:
                    grouped[where] += size
                for where, size in grouped.most_common(args.top):
                    print(f"  {size / _MIB:8.1f} MiB  {where}")
                if variant == "fuse":
                    plans = [a.wrapper.splitlines()[1] for a in fusebackend.history()]
                    for line in plans:
                        print(f"  {line}")
                del step
            del built
            _reset()
            torch.cuda.empty_cache()
    print("\nmodel, variant, peak MiB, before the step MiB, saved for backward")
    for row in summary:
        print(f"{row[0]:22s} {row[1]:10s} {row[2]:9.1f} {row[3]:9.1f}  {row[4]}")


if __name__ == "__main__":
    main()
