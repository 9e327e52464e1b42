"""LLM generation: tokens per second and the bandwidth a decode step reaches, eager against
Inductor and fuse.

Each variant generates greedily from the same random prompt, two ways:

- ``recipe``: transformers' documented recipe, ``model.generate(ids, cache_implementation="static",
  compile_config=CompileConfig(backend=..., mode="reduce-overhead", fullgraph=True))``; transformers
  compiles the decode step and runs the prefill eagerly.
- ``lean``: a loop of our own over a ``StaticCache``: the prefill compiled as one graph, then a
  decode step compiled as another (the next token's argmax inside it), each replayed as a CUDA
  graph on a GPU (``mode="reduce-overhead"``; on a CPU, ``default``).

Per variant it reports tokens per second (batch x new tokens over the whole generation, prefill
included), and for ``lean`` the decode step's median time from CUDA events around each step. A
decode step reads every parameter once (tied embeddings once; an embedding table no product
reads is gathered a row a token, and not counted) and the KV cache up to its position; bytes
over time give GB/s, set against the copy bandwidth measured in the same run (a clone of 1 GiB:
read and write).

Backends: ``eager``, ``inductor``, ``fuse``, and ``fuse-rows<N>``: fuse with products of at most N
rows generated (``FUSE_ROW_PRODUCTS=N``; ``fuse-rows0`` leaves every product to cuBLAS).
``--weights int8`` runs the model again with weight-only int8 products (``Int8Linear``: per
output channel scales, the dequantization written in the model for the compiler to fuse).

Correctness: each variant's tokens against eager's (the count that agree before the first that
does not), and the first decode step's logits against eager's (largest absolute difference);
Inductor's distance from eager is the yardstick in bf16. ``tests/test_generate.py`` checks that
tiny float32 models give eager's exact tokens on the CPU, both ways.

    python -m benchmarks.generate --models llama --batches 1 16 --prompt 64 --new 128 \\
        --backends eager inductor fuse --ways lean recipe --weights model int8 --out DIR

writes ``DIR/generate_<model>.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import os
import statistics
import time
from typing import Any, Callable

import torch

GiB = 1 << 30


@dataclasses.dataclass
class Row:
    model: str
    batch: int
    prompt: int
    new: int
    backend: str
    way: str
    tokens_per_s: float
    first_call_s: float  # the first generation: compiles included
    step_ms: float | None = None  # lean: the decode step's median
    gb_per_s: float | None = None  # lean: bytes a decode step reads over its time
    bandwidth_share: float | None = None  # of the copy bandwidth
    tokens_agree: int | None = None  # leading tokens equal to eager's, per sequence (the least)
    logits_diff: float | None = None  # first decode step's largest |difference| from eager's
    graphs: int | None = None  # fuse: graphs compiled
    weights: str = ""  # the products' weights: the model's dtype, or int8 (weight-only, ``quantize_int8``)


# ---------------------------------------------------------------------------------------------
# models and caches


def build(name: str, size: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The zoo's model of that name (``benchmarks/zoo/registry.py``), in eval mode."""
    from benchmarks.zoo import registry

    model = registry.ZOO[name].build(size, device, dtype).model.eval()
    model.generation_config.pad_token_id = model.generation_config.eos_token_id = None  # run to the end
    return model


def prompt(model: torch.nn.Module, batch: int, length: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    vocab = model.config.get_text_config().vocab_size
    return torch.randint(2, vocab, (batch, length), generator=g).to(device)


def kv_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim)."""
    c = model.config.get_text_config()
    heads = getattr(c, "num_attention_heads", None) or c.n_head
    kv = getattr(c, "num_key_value_heads", None) or heads
    hidden = getattr(c, "hidden_size", None) or c.n_embd
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    layers = getattr(c, "num_hidden_layers", None) or c.n_layer
    return layers, kv, head_dim


def static_cache(model: torch.nn.Module, batch: int, length: int, device: torch.device, dtype: torch.dtype) -> Any:
    """A ``StaticCache`` of ``length`` positions, allocated now (the prefill is compiled)."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=length)
    _, kv, head_dim = kv_shape(model)
    cache.early_initialization(batch, kv, head_dim, dtype, device)
    return cache


def _cache_keyword(model: torch.nn.Module) -> tuple[str, bool]:
    """The forward's name for the cache (``past_key_values`` before transformers 5.2x, ``cache``
    after) and whether it takes ``cache_position``."""
    params = inspect.signature(model.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "cache_position" in params


class Int8Linear(torch.nn.Module):
    """A ``Linear`` with weight-only int8: each output channel's weights rounded to int8 over a
    scale of its own (its largest magnitude over 127), and the product written as a model using
    such weights writes it, ``F.linear(x, weight_int8.to(x.dtype) * scale[:, None], bias)``: the
    dequantization is the compiler's to fuse into the product."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(1).clamp(min=1e-12) / 127
        self.register_buffer("weight_int8", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight_int8.to(x.dtype) * self.scale[:, None], self.bias)


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Every ``Linear`` of ``model`` (the LM head included, untied from the embedding) as an
    ``Int8Linear``, in place; returns ``model``."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, child_name, Int8Linear(child))
    return model


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers a decode step reads, each storage once; an embedding
    table that no product reads (untied, or its LM head quantized) is read a row a token, and
    not counted."""
    gathered = {m.weight.untyped_storage().data_ptr() for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    gathered -= {m.weight.untyped_storage().data_ptr() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    seen: set[int] = set(gathered)
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def kv_bytes(model: torch.nn.Module, batch: int, positions: int, dtype: torch.dtype) -> int:
    """Bytes of keys and values a step reads at ``positions`` cached positions."""
    layers, kv, head_dim = kv_shape(model)
    return 2 * layers * batch * kv * head_dim * positions * dtype.itemsize


# ---------------------------------------------------------------------------------------------
# the two ways to generate


class Lean:
    """Greedy generation with a compiled prefill and a compiled decode step over a static cache."""

    def __init__(self, model: torch.nn.Module, backend: str | Callable | None, mode: str | None) -> None:
        self.model = model
        self.keyword, self.takes_position = _cache_keyword(model)

        def step(ids: torch.Tensor, positions: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
            kwargs = {self.keyword: cache, "position_ids": positions, "use_cache": True, "logits_to_keep": 1}
            if self.takes_position:
                kwargs["cache_position"] = positions[0]
            logits = self.model(input_ids=ids, **kwargs).logits[:, -1, :]
            return logits.argmax(-1, keepdim=True), logits

        if backend is None:
            self.prefill = self.decode = step
        else:  # two compiled functions: each holds its own graph (and CUDA graph)
            options = {"backend": backend, "fullgraph": True}
            if mode is not None:
                options["mode"] = mode
            self.prefill = torch.compile(step, **options)
            self.decode = torch.compile(step, **options)

    def generate(self, ids: torch.Tensor, new: int, events: list | None = None,
                 first_logits: list | None = None) -> torch.Tensor:
        """``new`` tokens after ``ids``; ``events`` collects (start, end) CUDA events per decode
        step, ``first_logits`` the first decode step's logits."""
        batch, length = ids.shape
        device = ids.device
        dtype = next(self.model.parameters()).dtype
        cache = static_cache(self.model, batch, length + new, device, dtype)
        positions = torch.arange(length, device=device).unsqueeze(0).expand(batch, -1)
        mark = getattr(torch.compiler, "cudagraph_mark_step_begin", lambda: None)
        mark()
        token, _ = self.prefill(ids, positions, cache)
        out = [token.clone()]
        position = torch.full((batch, 1), length, device=device, dtype=torch.long)
        for k in range(new - 1):
            mark()
            if events is not None:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            token, logits = self.decode(out[-1], position, cache)
            if events is not None:
                end.record()
                events.append((start, end))
            if first_logits is not None and k == 0:
                first_logits.append(logits.float().clone())
            out.append(token.clone())
            position = position + 1
        return torch.cat([ids] + out, dim=1)


def recipe(model: torch.nn.Module, backend: str | Callable | None, mode: str | None) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """transformers' generate() with a static cache, compiled by ``backend`` (eager: no compile).

    transformers compiles the decode step on a GPU only; on a CPU the config's
    ``_compile_all_devices`` asks it to."""
    from transformers import CompileConfig

    def generate(ids: torch.Tensor, new: int) -> torch.Tensor:
        kwargs: dict[str, Any] = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False,
                                  "use_cache": True, "cache_implementation": "static"}
        if backend is not None:
            config = CompileConfig(backend=backend, mode=mode or "default", fullgraph=True)
            config._compile_all_devices = True
            kwargs["compile_config"] = config
        else:
            kwargs["disable_compile"] = True
        return model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)

    return generate


# ---------------------------------------------------------------------------------------------
# measuring


def copy_bandwidth(device: torch.device) -> float:
    """GB/s of a clone of 1 GiB (read and write), the median of 20."""
    x = torch.empty(GiB // 2, dtype=torch.float16, device=device)
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        x.clone()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return 2 * GiB / (statistics.median(times[5:]) * 1e-3) / 1e9


def agree(tokens: torch.Tensor, reference: torch.Tensor, length: int) -> int:
    """Generated tokens equal to the reference's before the first that is not, the least over the batch."""
    same = (tokens[:, length:] == reference[:, length:]).int()
    return int(same.cumprod(1).sum(1).min())


def backend_of(name: str) -> str | Callable | None:
    """``eager``: no compile; ``fuse`` and ``fuse-rows<N>``: fuse; any other name is torch.compile's."""
    if name == "eager":
        return None
    if name == "fuse" or name.startswith("fuse-rows"):
        import fusebackend

        return fusebackend.fuse
    return name


def settings_of(name: str) -> contextlib.AbstractContextManager:
    """What a variant sets while it compiles and runs (fuse compiles a graph at its first call):
    ``fuse-rows<N>`` generates products of at most N rows (``FUSE_ROW_PRODUCTS=N``)."""
    if not name.startswith("fuse-rows"):
        return contextlib.nullcontext()
    import fusebackend

    return fusebackend.config.patch(row_products=int(name[len("fuse-rows"):]))


def measure(model_name: str, model: torch.nn.Module, batch: int, length: int, new: int, backends: list[str],
            ways: list[str], repeats: int, bandwidth: float | None, profile: bool = False,
            weights: str = "") -> list[Row]:
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    gpu = device.type == "cuda"
    mode = "reduce-overhead" if gpu else None
    ids = prompt(model, batch, length, device)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    rows: list[Row] = []
    reference: dict[str, torch.Tensor] = {}
    reference_logits: list[torch.Tensor] = []
    for way in ways:
        for name in backends:
            torch._dynamo.reset()
            backend = backend_of(name)
            graphs_before = _graphs()
            run: Callable[..., torch.Tensor]
            lean = Lean(model, backend, mode) if way == "lean" else None
            run = lean.generate if lean is not None else recipe(model, backend, mode)
            with torch.no_grad(), settings_of(name):
                t0 = time.perf_counter()
                tokens = run(ids, new)
                sync()
                first = time.perf_counter() - t0
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    tokens = run(ids, new)
                    sync()
                    times.append(time.perf_counter() - t0)
                row = Row(model_name, batch, length, new, name, way, batch * new / statistics.median(times), first,
                          weights=weights)
                if profile and gpu:
                    print(f"{name} {way} kernels:\n{profile_decode(run, ids, new)}", flush=True)
                if lean is not None:
                    events: list = []
                    logits: list = []
                    tokens = lean.generate(ids, new, events if gpu else None, logits)
                    sync()
                    if events:
                        row.step_ms = statistics.median(s.elapsed_time(e) for s, e in events[len(events) // 4:])
                        read = weight_bytes(model) + kv_bytes(model, batch, length + new // 2, dtype)
                        row.gb_per_s = read / (row.step_ms * 1e-3) / 1e9
                        row.bandwidth_share = row.gb_per_s / bandwidth if bandwidth else None
                    if name == "eager":
                        reference_logits[:] = logits
                    elif reference_logits:
                        row.logits_diff = float((logits[0] - reference_logits[0]).abs().max())
            if name == "eager":
                reference[way] = tokens
            ref = reference.get(way, reference.get("lean"))
            if ref is not None:
                row.tokens_agree = agree(tokens, ref, length)
            if name.startswith("fuse"):
                row.graphs = _graphs() - graphs_before
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def profile_decode(run: Callable[[torch.Tensor, int], torch.Tensor], ids: torch.Tensor, new: int, top: int = 12) -> str:
    """The GPU kernels of a generation's decode steps, by total time: launches and microseconds
    per step, heaviest first (``--profile``)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(ids, new)
        torch.cuda.synchronize()
    steps = max(new - 1, 1)
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(e.name, []).append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    total = sum(sum(v) for v in kernels.values())
    lines = [f"  {sum(len(v) for v in kernels.values()) / steps:.0f} kernels and {total / steps:.1f} us of GPU time "
             f"a step (prefill included, over {steps} steps)"]
    for name, times in sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]:
        lines.append(f"  {len(times) / steps:6.1f} x {sum(times) / len(times):8.2f} us = {sum(times) / steps:8.1f} us/step  {name[:110]}")
    return "\n".join(lines)


def _graphs() -> int:
    try:
        from fusebackend import metrics

        return metrics.graphs_compiled
    except Exception:  # fuse not importable: no count
        return 0


def format_row(r: Row) -> str:
    parts = [f"{r.model:8s} {r.weights:8s} b{r.batch:<3d} p{r.prompt} n{r.new} {r.way:6s} {r.backend:11s}",
             f"{r.tokens_per_s:9.1f} tok/s", f"first {r.first_call_s:6.1f} s"]
    if r.step_ms is not None:
        parts.append(f"step {r.step_ms:.3f} ms")
    if r.gb_per_s is not None:
        share = f" ({100 * r.bandwidth_share:.0f}% of copy)" if r.bandwidth_share else ""
        parts.append(f"{r.gb_per_s:.0f} GB/s{share}")
    if r.tokens_agree is not None:
        parts.append(f"agree {r.tokens_agree}/{r.new}")
    if r.logits_diff is not None:
        parts.append(f"logits diff {r.logits_diff:.3g}")
    return "  ".join(parts)


def chart(data: dict[str, Any], path: str) -> str | None:
    """A PNG of tokens/s per way and batch, a bar per backend (``data``: the JSON ``--out`` writes;
    log axis: eager is ten times slower; ``report.bars``)."""
    from benchmarks import report

    rows = data["rows"]
    def group(r: dict[str, Any]) -> tuple[str, str, str, int]:
        return r["model"], r.get("weights", ""), r["way"], r["batch"]

    groups = list(dict.fromkeys(group(r) for r in rows))
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    series = {b: [next((r["tokens_per_s"] for r in rows if group(r) == g and r["backend"] == b), None) for g in groups]
              for b in backends}
    info = data.get("info", {})
    labels = [f"{m}{' ' + w if w else ''} {way}, batch {batch}" for m, w, way, batch in groups]
    return report.bars(labels, series, path,
                       f"generation: {info.get('device', '?')}, {info.get('dtype', '?')}, torch {info.get('torch', '?')}",
                       "tokens/s", log=True, fmt="{:.0f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["llama"])
    p.add_argument("--size", default="real", choices=["real", "tiny"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batches", nargs="+", type=int, default=[1])
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--backends", nargs="+", default=["eager", "inductor", "fuse"])
    p.add_argument("--ways", nargs="+", default=["lean", "recipe"], choices=["lean", "recipe"])
    p.add_argument("--weights", nargs="+", default=["model"], choices=["model", "int8"],
                   help="the products' weights: the model's dtype, and/or weight-only int8 (Int8Linear)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="print each lean variant's decode kernels")
    p.add_argument("--out", default=None, help="folder for generate_<model>.json and its chart")
    p.add_argument("--chart-from", default=None, metavar="JSON", help="run nothing: the chart of a saved run, beside it")
    args = p.parse_args(argv)
    if args.chart_from:
        with open(args.chart_from) as f:
            print(chart(json.load(f), os.path.splitext(args.chart_from)[0] + ".png") or "no chart (matplotlib?)")
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    bandwidth = copy_bandwidth(device) if device.type == "cuda" else None
    if bandwidth:
        print(f"copy bandwidth {bandwidth:.0f} GB/s ({torch.cuda.get_device_name()})")
    for name in args.models:
        rows = []
        read: dict[str, int] = {}
        for weights in args.weights:
            model = build(name, args.size, device, dtype)
            label = args.dtype if weights == "model" else weights
            if weights == "int8":
                quantize_int8(model)
            read[label] = weight_bytes(model)
            for batch in args.batches:
                rows += measure(name, model, batch, args.prompt, args.new, args.backends, args.ways, args.repeats,
                                bandwidth, args.profile, label)
            del model
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "copy_gb_per_s": bandwidth, "dtype": args.dtype,
                    "weights_bytes": read}
            try:
                import transformers
                import triton

                info.update(transformers=transformers.__version__, triton=triton.__version__)
            except ImportError:
                pass
            data = {"info": info, "rows": [dataclasses.asdict(r) for r in rows]}
            with open(os.path.join(args.out, f"generate_{name}.json"), "w") as f:
                json.dump(data, f, indent=1)
            chart(data, os.path.join(args.out, f"generate_{name}.png"))
    print("done")


if __name__ == "__main__":
    main()
