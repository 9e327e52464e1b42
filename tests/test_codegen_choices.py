"""Codegen, scheduling and launch choices that change no value, only what runs: masks left out
where blocks tile the extent exactly, L2 eviction hints on the loads of reductions, launch
configs by the passes a kernel makes over its rows (row blocks by how their loads run are in
``test_reduction_blocks.py``), and programmatic dependent launch (a kernel after one of ours
starts early and waits on the GPU). Every test of generated code that runs compares with eager
too (``check``)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from fusebackend.kernels import runtime
from helpers import check, kernels, without_tails

bf16 = torch.bfloat16


# ------------------------------------------------------------------------- shared values


def _chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(12):  # each value read three times by the next: 3**12 paths through the chain
        x = x * torch.sin(x) + x
    return x


def test_a_value_read_by_several_inlined_consumers_is_rendered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from fusebackend.codegen.body import KernelBody

    renders = []
    render = KernelBody._render
    monkeypatch.setattr(KernelBody, "_render", lambda self, expr, subst: renders.append(expr) or render(self, expr, subst))
    with fusebackend.config.patch(graph_cache=False):
        check(_chain, torch.randn(37) * 0.5)
    (source,) = kernels().values()  # one kernel: every step inlined into the store
    assert source.count("tl_math.sin(") + source.count("tl.sin(") == 12, source
    assert len(renders) < 100, len(renders)  # once per IR expression, not once per path


# ------------------------------------------------------------------------------------ masks


def test_exact_tiles_need_no_masks() -> None:
    # rows of 64 fill RBLOCK, 8 rows fill XBLOCK in the interpreter's config; 256 elements fill XBLOCK
    check(lambda x: torch.softmax(x, -1), torch.randn(8, 64))
    (source,) = kernels().values()
    assert "xmask" not in source and "rmask" not in source and "tl.where" not in source
    assert "no masks" in source
    fusebackend.dump.clear()
    check(lambda x: x * 2 + 1, torch.randn(256))
    (source,) = kernels().values()
    assert "xmask" not in source


def test_ragged_tiles_keep_their_masks() -> None:
    check(lambda x: torch.softmax(x, -1), torch.randn(7, 48))
    (source,) = kernels().values()
    assert "xmask = xindex < xnumel" in source and "rmask = rindex < rnumel" in source
    assert "float(\"-inf\")" in source  # masked lanes cannot win the max
    fusebackend.dump.clear()
    check(lambda x: x * 2 + 1, torch.randn(250))
    (source,) = kernels().values()
    assert "xmask = xindex < xnumel" in source and source.count(", xmask") == 2  # the load and the store


def test_mask_along_one_dim_only() -> None:
    # 6 rows of 64: RBLOCK tiles the row, XBLOCK (8) does not tile the 6 rows
    check(lambda x: x.amax(-1), torch.randn(6, 64))
    (source,) = kernels().values()
    assert "xmask = " in source and "rmask" not in source


# --------------------------------------------------------------------- eviction and passes


def _loads(source: str) -> list[str]:
    return [line.strip() for line in source.splitlines() if "tl.load(" in line]


def test_reduction_reading_each_row_once_streams_it() -> None:
    # nothing full-size is written: the rows are read once and need not stay in L2
    for fn, x in ((lambda x: x.sum(-1), torch.randn(8, 64)), (lambda x: x.sum(0), torch.randn(40, 24))):
        torch._dynamo.reset()  # two lambdas of one line: Dynamo would take the second size as a new one (dynamic)
        fusebackend.dump.clear()
        check(fn, x)
        (source,) = kernels().values()
        (load,) = _loads(source)
        assert "eviction_policy='evict_first'" in load


def test_persistent_kernel_writing_rows_gives_no_hint() -> None:
    # measured slower on an H200 with evict_first on the loads of softmax and RMS norm
    check(lambda x: torch.softmax(x, -1), torch.randn(8, 64))
    (source,) = kernels().values()
    assert "persistent" in source and "eviction_policy" not in source


def test_looped_kernel_keeps_rows_for_its_next_pass() -> None:
    # rows of 20000 are looped in the interpreter's config: a pass for the mean of squares, a
    # pass for the outputs that reads the row again
    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    check(rms, torch.randn(2, 20000), torch.randn(20000))
    (source,) = kernels().values()
    source = without_tails(source)  # each pass's row's last, partial block: the same loads, masked
    assert source.count("for roffset in range(") == 2
    loads = _loads(source)
    x_loads = [l for l in loads if "20000*xindex" in l]
    w_loads = [l for l in loads if "20000*xindex" not in l]
    assert len(x_loads) == 2 and len(w_loads) == 1
    assert "evict_last" in x_loads[0] and "evict_first" in x_loads[1]
    assert "eviction_policy" not in w_loads[0]  # the weight is read by every row


def _loop_bodies(source: str) -> list[str]:
    """The text of each ``for roffset`` loop of a kernel over a pass's whole blocks, in order
    (the loop over the row's last, partial block, the same body masked, left out)."""
    parts = without_tails(source).split("for roffset in range(")[1:]
    return [p.split("\n    tmp")[0] if "\n    tmp" in p else p for p in parts]


def test_prologue_output_is_written_by_the_first_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # x + r is stored and summed: it needs no reduction, so the pass that sums the rows writes it
    # too, instead of a second pass that reads x and r again. Rows of 20000 loop in the
    # interpreter's config, in blocks that do not tile them: the whole block unmasked, then the
    # row's last, partial block masked (a tail from one whole block, here)
    monkeypatch.setattr(runtime, "TAIL_BLOCKS", 1)

    def fn(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + r
        return h, h.sum(-1)

    check(fn, torch.randn(3, 20000), torch.randn(3, 20000), atol=1e-3, rtol=1e-4)
    (source,) = kernels().values()
    (loop,) = _loop_bodies(source)
    assert loop.count("tl.store(") == 1 and "rmask" not in loop  # whole blocks
    assert "rmask" in source  # and the row's last, partial block
    loads = _loads(without_tails(source))
    assert len(loads) == 2 and all("evict_first" in l for l in loads)  # each row read once


def test_prologue_and_epilogue_outputs_take_one_pass_each() -> None:
    # h is written by the pass that reduces it; the normalized output needs the reduction, so a
    # second pass writes it
    def fn(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + r
        return h, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)

    check(fn, torch.randn(2, 20000), torch.randn(2, 20000))
    (source,) = kernels().values()
    first, second = _loop_bodies(source)
    assert first.count("tl.store(") == 1 and second.count("tl.store(") == 1
    assert all("evict_last" in l for l in _loads(first)) and all("evict_first" in l for l in _loads(second))


def test_column_sum_with_a_full_size_output_reads_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # the bias gradient of a linear layer after GELU's backward: the full-size gradient is written
    # by the loop that sums its columns (the split's first phase, 64 chunks of 256 rows, here
    # looped 64 rows at a time)
    original = runtime.reduction_config

    def small_blocks(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1,
                     across_rows: bool = False, **kw: Any) -> dict[str, int]:
        return {**original(xnumel, rnumel, row_contiguous, passes, across_rows, **kw), "RBLOCK": 64}

    monkeypatch.setattr(runtime, "reduction_config", small_blocks)

    def fn(g: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = g * torch.sigmoid(a)
        return d, d.sum(0)

    check(fn, torch.randn(16384, 6), torch.randn(16384, 6), atol=1e-3, rtol=1e-4)
    full = [src for src in kernels().values() if "sigmoid" in src or "tl.exp" in src]
    assert len(full) == 1
    (loop,) = _loop_bodies(full[0])
    assert loop.count("tl.store(") == 1 and len(_loads(full[0])) == 2


@pytest.mark.parametrize("fn, passes", [
    (lambda x: x.sum(-1), 1),
    (lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), 2),  # reduction, outputs
    (lambda x: torch.softmax(x, -1), 3),  # max, sum of exponentials, outputs
], ids=["sum", "rms", "softmax"])
def test_config_is_told_how_many_passes_a_looped_kernel_makes(monkeypatch: pytest.MonkeyPatch,
                                                               fn: Callable[..., Any], passes: int) -> None:
    seen: list[int] = []
    original = runtime.reduction_config

    def record(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1,
               across_rows: bool = False, **kw: Any) -> dict[str, int]:
        seen.append(passes)  # (each call; the codegen asks again with across_rows, for the same passes)
        return original(xnumel, rnumel, row_contiguous, passes, across_rows, **kw)

    monkeypatch.setattr(runtime, "reduction_config", record)
    check(fn, torch.randn(6, 40))
    assert seen == [passes, passes]  # the heuristic config, then the one for rows read across


def test_gpu_pointwise_configs_hold_32_bytes_per_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    use_interpreter = runtime.use_interpreter
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    assert runtime.pointwise_config(1 << 20, 2) == {"XBLOCK": 2048, "num_warps": 4}
    assert runtime.pointwise_config(1 << 20, 4) == {"XBLOCK": 1024, "num_warps": 4}
    assert runtime.pointwise_config(100, 4) == {"XBLOCK": 128, "num_warps": 1}
    # under SMALL_POINTWISE elements (batch 1's activations) the kernel is one wave: blocks of 512
    assert runtime.pointwise_config(runtime.SMALL_POINTWISE - 1, 2) == {"XBLOCK": 512, "num_warps": 4}
    assert runtime.pointwise_config(50176, 4) == {"XBLOCK": 512, "num_warps": 4}
    assert runtime.pointwise_config(50176, 8) == {"XBLOCK": 512, "num_warps": 4}
    # a window (a depthwise convolution's 9 positions) loads element by element: 4 a thread
    assert runtime.pointwise_config(1 << 20, 2, window=9) == {"XBLOCK": 512, "num_warps": 4}
    assert runtime.pointwise_config(1 << 20, 2, window=3) == {"XBLOCK": 2048, "num_warps": 4}
    assert runtime.pointwise_config(100, 4, window=9) == {"XBLOCK": 128, "num_warps": 1}
    seen: list[int] = []
    original = runtime.pointwise_config

    def record(numel: int, itemsize: int = 2) -> dict[str, int]:
        seen.append(itemsize)
        return original(numel, itemsize)

    monkeypatch.setattr(runtime, "pointwise_config", record)
    monkeypatch.setattr(runtime, "use_interpreter", use_interpreter)  # the kernels run where the suite runs
    # bf16 in and out, fp32 only in registers: 2 bytes; an fp32 output: 4
    check(lambda x: (x.float() * 2).to(bf16), torch.randn(64, dtype=bf16))
    check(lambda x: x.float() * 2, torch.randn(64, dtype=bf16))
    assert seen == [2, 4]


def test_gpu_reduction_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    cfg = runtime.reduction_config
    # rows of 8192 read twice: two loops of 4096, the second from L2
    assert cfg(8192, 8192, True, 2) == {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}
    assert cfg(8192, 4096, True, 2) == {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}
    # a row that blocks of 4096 do not tile stays in one block
    assert cfg(1, 4097, True, 2) == {"XBLOCK": 1, "RBLOCK": 8192, "num_warps": 16}
    # three passes (softmax) or one (a sum): the row in one block
    assert cfg(8192, 8192, True, 3) == {"XBLOCK": 1, "RBLOCK": 8192, "num_warps": 16}
    assert cfg(8192, 8192, True, 1) == {"XBLOCK": 1, "RBLOCK": 8192, "num_warps": 16}
    assert cfg(4096, 1024, True, 3) == {"XBLOCK": 1, "RBLOCK": 1024, "num_warps": 2}
    assert cfg(4, 100_000, True, 1) == {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}
    assert cfg(8192, 8192, False, 1) == {"XBLOCK": 64, "RBLOCK": 16, "num_warps": 4}
    # short columns, few of them (a split's second phase over its 512 partial sums): one block
    # per column block, no loop; many columns keep the loop of 16 rows
    assert cfg(128, 512, False, 1) == {"XBLOCK": 16, "RBLOCK": 512, "num_warps": 8}
    assert cfg(2048, 256, False, 1) == {"XBLOCK": 32, "RBLOCK": 256, "num_warps": 8}
    assert cfg(8192, 8, False, 1) == {"XBLOCK": 64, "RBLOCK": 8, "num_warps": 4}
    assert cfg(65536, 1024, False, 1) == {"XBLOCK": 64, "RBLOCK": 16, "num_warps": 4}
    # more short columns: one block where the loop's 64 columns a program make fewer than four
    # programs an SM (an H100's 132), or where 64 rows hold a column; else the loop
    monkeypatch.setattr(runtime, "gpu_shape", lambda index=None: (132, 50 << 20))
    assert cfg(12288, 784, False, 1) == {"XBLOCK": 16, "RBLOCK": 1024, "num_warps": 8}  # 192 programs
    assert cfg(33792 - 64, 256, False, 1) == {"XBLOCK": 32, "RBLOCK": 256, "num_warps": 8}  # 527
    assert cfg(33792, 256, False, 1) == {"XBLOCK": 64, "RBLOCK": 16, "num_warps": 4}  # 528
    assert cfg(49152, 49, False, 1) == {"XBLOCK": 64, "RBLOCK": 64, "num_warps": 4}
    assert cfg(49152, 65, False, 1) == {"XBLOCK": 64, "RBLOCK": 16, "num_warps": 4}


def test_gpu_looped_rows_read_again_fit_l2(monkeypatch: pytest.MonkeyPatch) -> None:
    # a looped kernel that reads its rows again (passes >= 2) takes the fewest warps whose rows
    # in flight fit the L2 (an H100's: 132 SMs, 50 MiB); rows read once keep blocks of 4096
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    monkeypatch.setattr(runtime, "gpu_shape", lambda index=None: (132, 50 << 20))
    cfg = runtime.reduction_config
    assert cfg(2048, 12544, True, 3, row_bytes=2) == {"XBLOCK": 1, "RBLOCK": 1024, "num_warps": 4}
    assert cfg(2048, 25088, True, 3, row_bytes=2) == {"XBLOCK": 1, "RBLOCK": 2048, "num_warps": 8}
    assert cfg(2048, 50176, True, 3, row_bytes=2) == {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}
    assert cfg(2048, 12544, True, 3, row_bytes=4) == {"XBLOCK": 1, "RBLOCK": 2048, "num_warps": 8}
    assert cfg(2048, 12544, True, 1, row_bytes=2) == {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}
    assert cfg(2048, 12544, True, 3) == {"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}  # bytes not known


def test_gpu_group_norm_kernel_takes_blocks_whose_rows_fit_l2(monkeypatch: pytest.MonkeyPatch) -> None:
    # GroupNorm(32) of 512 channels of 28x28, bf16: rows of 12544 read three times (the mean, the
    # variance, the output), 2 bytes a position: blocks of 1024 by 4 warps, twelve of them whole
    # (unmasked) and a masked tail
    from test_fusion_reductions import compile_only

    original = runtime.reduction_config

    def cfg(*args: Any, **kwargs: Any) -> dict[str, int]:  # the GPU's, where the kernels are only generated
        with monkeypatch.context() as gpu:
            gpu.setattr(runtime, "use_interpreter", lambda: False)
            gpu.setattr(runtime, "gpu_shape", lambda index=None: (132, 50 << 20))
            return original(*args, **kwargs)

    monkeypatch.setattr(runtime, "reduction_config", cfg)
    w, b = torch.randn(512, dtype=bf16), torch.randn(512, dtype=bf16)
    art = compile_only(lambda x: F.silu(F.group_norm(x, 32, w, b)), torch.randn(64, 512, 28, 28, dtype=bf16))
    assert art.kernel_count == 1, art.schedule
    launches = [line for line in art.wrapper.splitlines() if "# grid" in line]
    assert len(launches) == 1 and "XBLOCK=1, RBLOCK=1024, num_warps=4" in launches[0], art.wrapper
    (src,) = art.kernels.values()
    assert src.count("for roffset in range(0, rnumel - RBLOCK + 1, RBLOCK):") == 3, src
    assert src.count("for roffset in range(rnumel - rnumel % RBLOCK, rnumel, RBLOCK):") == 3, src


def _squeeze(x: torch.Tensor) -> torch.Tensor:  # a squeeze-and-excitation block's pool of its activation
    return F.silu(x.float()).mean((2, 3), keepdim=True).to(x.dtype)


@pytest.mark.parametrize("samples, channels, size, block, blocks_a_run", [
    (256, 144, 28, 64, 3), (2048, 24, 28, 32, 1), (8, 40, 14, 32, 2), (8, 144, 14, 32, 5), (64, 1152, 7, 64, 18),
    (64, 144, 28, 16, 9)])
def test_gpu_column_blocks_stay_within_a_sample(monkeypatch: pytest.MonkeyPatch, samples: int, channels: int,
                                                size: int, block: int, blocks_a_run: int) -> None:
    # the mean over a channels-last activation's positions: rows (sample, channel), a column
    # reduction. Blocks of 64 columns over 144 channels would mix two samples, their loads made
    # element by element (hints of 1): each block lies within one sample's channels instead, the
    # last masked; blocks of 32 for a run of 24 (a looped kernel's, with rows twice as long); blocks
    # that divide the run as before (b64 at 28x28: 144 programs of 64 columns would be too few, so
    # one block of 1024 rows by 16 columns each)
    from test_fusion_reductions import compile_only

    original = runtime.reduction_config

    def cfg(*args: Any, **kwargs: Any) -> dict[str, int]:  # the GPU's, where the kernels are only generated
        with monkeypatch.context() as gpu:
            gpu.setattr(runtime, "use_interpreter", lambda: False)
            return original(*args, **kwargs)

    monkeypatch.setattr(runtime, "reduction_config", cfg)
    x = torch.randn(samples, channels, size, size, dtype=bf16).contiguous(memory_format=torch.channels_last)
    art = compile_only(_squeeze, x)
    (src,) = art.kernels.values()
    launches = [line for line in art.wrapper.splitlines() if "# grid" in line]
    assert len(launches) == 1 and f"XBLOCK={block}," in launches[0], art.wrapper
    assert "max_contiguous" not in src and "multiple_of" not in src, src
    if channels % block:
        assert f"xcolumn = (tl.program_id(0) % {blocks_a_run}) * XBLOCK" in src, src
        assert f"xmask = xcolumn + tl.arange(0, XBLOCK)[None, :] < {channels}" in src, src
        assert f"# grid ({samples * blocks_a_run},)" in launches[0], launches[0]
    else:
        assert "xcolumn" not in src, src


@pytest.mark.parametrize("channels", [144, 24, 33])
def test_column_blocks_within_a_sample_run_right(channels: int) -> None:
    # the interpreter's blocks (up to 256 columns) span samples too: the same kernels run here
    torch.manual_seed(0)
    x = torch.randn(3, channels, 5, 7).contiguous(memory_format=torch.channels_last)
    check(_squeeze, x)
    (src,) = kernels().values()
    assert "xcolumn" in src, src
    strided = torch.randn(3, 5, 7, 2 * channels).permute(0, 3, 1, 2)[:, ::2]  # channels at a stride of 2
    check(_squeeze, strided)
    check(_squeeze, x.to(bf16))
    split = torch.randn(2, channels, 48, 48).contiguous(memory_format=torch.channels_last)  # rows split in chunks
    check(_squeeze, split)


# ------------------------------------------------------------- programmatic dependent launch


def _schedule(fn: Callable[..., Any], *args: torch.Tensor) -> Any:
    """The schedule of fn's graph (lowered for the tensors given, nothing run)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusebackend import lowering, scheduler
    from fusebackend.decompositions import decomposition_table

    gm = make_fx(fn, decomposition_table=decomposition_table())(*args)
    graph, _ = lowering.lower(gm, list(args), "pdl")
    return scheduler.schedule(graph)


def _statements(source: str) -> list[str]:
    """The kernel function's statements, comments left out, in order."""
    body = source.split("\ndef ", 1)[1].splitlines()[1:]
    statements = [line.split("  #")[0].strip() for line in body]
    return [line for line in statements if line and not line.startswith("#")]


@pytest.mark.parametrize("fn, shape, marks", [
    (lambda x: x * 2 + 1, (64, 48), ["tl.program_id(0) * XBLOCK"]),       # flat pointwise
    (lambda x: x.t().contiguous() * 2, (64, 64), ["# tiled"]),              # tiled transpose
    (lambda x: torch.softmax(x, -1), (16, 64), ["rbase"]),                  # row reduction
    (lambda x: x.sum(0), (4096, 64), ["(split, phase 1)", "(split, phase 2)"]),  # two kernels
])
def test_pdl_kernels_wait_for_the_grid_before_anything_else(fn: Callable[..., Any], shape: tuple[int, ...],
                                                            marks: list[str]) -> None:
    from fusebackend import codegen
    from fusebackend.codegen.kernel_header import GRID_WAIT

    plans = _schedule(fn, torch.randn(shape)).kernels
    assert len(plans) == len(marks)
    for k, (plan, mark) in enumerate(zip(plans, marks)):
        plain = codegen.generate(plan, k)
        early = codegen.generate(plan, k, pdl=True)
        assert mark in plain.source
        assert "gdc_wait" not in plain.source and "launch_pdl" not in plain.launch
        assert early.launch == {**plain.launch, "launch_pdl": True}
        statements = _statements(early.source)
        assert statements[0] == "tl.extra.cuda.gdc_wait()" and GRID_WAIT in early.source
        assert statements[1:] == _statements(plain.source)  # nothing else changes


def test_pdl_only_for_compiled_kernels_on_capable_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)
    capable = runtime._pdl_capable.__wrapped__  # type: ignore[attr-defined]  # the uncached check
    monkeypatch.setattr(runtime, "use_interpreter", lambda: False)
    monkeypatch.setattr(runtime, "_pdl_capable", lambda index: index == 0)
    with fusebackend.config.patch(pdl=False):  # the default, FUSE_PDL unset
        assert not runtime.use_pdl(cuda)
    with fusebackend.config.patch(pdl=True):
        assert runtime.use_pdl(cuda) and not runtime.use_pdl(torch.device("cuda", 1))
        assert not runtime.use_pdl(torch.device("cpu"))
        monkeypatch.setattr(runtime, "use_interpreter", lambda: True)
        assert not runtime.use_pdl(cuda)
    for capability, expected in (((8, 0), False), ((9, 0), True), ((10, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index, c=capability: c)
        assert capable(0) is expected


def test_pdl_only_directly_after_our_own_kernels() -> None:
    from fusebackend import codegen, scheduler

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w).sum(0) * 2

    sched = _schedule(fn, torch.randn(4096, 32), torch.randn(32, 64))
    kinds = ["extern" if isinstance(s, scheduler.ExternCall) else "kernel" for s in sched.steps]
    assert kinds == ["extern", "kernel", "kernel"]  # mm, then relu + sum's phase 1, then phase 2 (* 2)
    first, second = codegen.generate_all(sched, pdl=True)
    # the kernel after cuBLAS is launched as usual, the one after our own kernel early
    assert "launch_pdl" not in first.launch and "gdc_wait" not in first.source
    assert second.launch.get("launch_pdl") is True and "gdc_wait" in second.source
    plain = [codegen.generate(plan, k).source for k, plan in enumerate(sched.kernels)]
    assert [k.source for k in codegen.generate_all(sched)] == plain


def _gpu_column_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Column reductions in the GPU's blocks (64 columns, 16 rows), not the interpreter's."""
    original = runtime.reduction_config

    def gpu_blocks(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1,
                   across_rows: bool = False, **kw: Any) -> dict[str, int]:
        config = original(xnumel, rnumel, row_contiguous, passes, across_rows, **kw)
        return {**config, "XBLOCK": 64, "RBLOCK": 16} if not row_contiguous and xnumel > 64 else config

    monkeypatch.setattr(runtime, "reduction_config", gpu_blocks)


def test_split_column_sum_takes_its_split_at_the_block_start(monkeypatch: pytest.MonkeyPatch) -> None:
    # a split column sum runs over (chunk, column) pairs: with blocks of 64 columns and 64
    # columns a row, every lane of a block is in one chunk, so the chunk is xoffset // 64 (a
    # scalar) and the column a contiguous block; no load is issued element by element
    # (indexing.window_arithmetic), so Triton vectorizes them (the GPU's configuration)
    _gpu_column_blocks(monkeypatch)
    x = torch.randn(2, 64, 64, 33).to(memory_format=torch.channels_last)  # 4224 rows of 64 channels
    check(lambda x: (x * 2).sum((0, 2, 3)), x, atol=1e-3, rtol=1e-4)
    phase1 = next(src for src in kernels().values() if "split, phase 1" in src)
    loads = _loads(phase1)
    assert loads and all("xoffset // 64" in l and "max_contiguous" not in l for l in loads), loads
    assert "xindex //" not in phase1 and "xindex %" not in phase1


def test_window_loads_of_a_column_sum_are_hinted_along_the_channels(monkeypatch: pytest.MonkeyPatch) -> None:
    # an upsampled channels-last tensor summed per channel: each load's row divides (a window),
    # so it gets hints (indexing.window_arithmetic); its channel is the block's xindex plus the
    # same for every lane, so the hints say contiguous along the channels, and Triton vectorizes
    _gpu_column_blocks(monkeypatch)
    x = torch.randn(2, 64, 33, 33).to(memory_format=torch.channels_last)
    check(lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest").sum((0, 2, 3)), x, atol=1e-3, rtol=1e-4)
    phase1 = next(src for src in kernels().values() if "split, phase 1" in src)
    (load,) = _loads(without_tails(phase1))
    assert "tl.max_contiguous(" in load and "[1, 64]), [1, 64]), [1, 1]))" in load, load


@pytest.mark.parametrize("groups", [1, 4])
def test_group_norm_over_channels_last_reads_its_rows_in_memory_order(groups: int) -> None:
    # A GroupNorm reduces each (sample, group) over channels, height and width. Over channels-last
    # activations the reduction runs along height, width and channels (builder.memory_order):
    # with one group each row is one contiguous stretch (rindex + a row's offset), with several
    # each row is runs of its channels; never a stride of the channel count between positions.
    x = torch.randn(3, 8, 5, 7).to(memory_format=torch.channels_last)
    norm = torch.nn.GroupNorm(groups, 8)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
        check(norm, x)
    reductions = [src for src in kernels().values() if "tl.reduce(" in src or "tl.sum(" in src]
    assert reductions
    for src in reductions:
        for load in _loads(src):
            if "280*" not in load:  # the weight and the bias, per channel
                continue
            if groups == 1:
                assert "rindex + 280*xindex" in load and "rindex //" not in load and "rindex %" not in load, load
            else:  # position r of group g: (r // 2) * 8 + 2 * g + r % 2; runs of 2 channels
                assert "8*(rindex // 2)" in load and "(rindex % 2)" in load, load


@pytest.mark.parametrize("dtype", [torch.float32, bf16])
def test_group_norm_over_channels_last_trains(dtype: torch.dtype) -> None:
    # forward and backward of a channels-last GroupNorm (the backward's sums over the group and
    # over the batch and positions take the memory order too), against eager
    x = torch.randn(2, 6, 4, 9, dtype=dtype).to(memory_format=torch.channels_last).requires_grad_()
    norm = torch.nn.GroupNorm(3, 6).to(dtype)
    with torch.no_grad():
        norm.weight.normal_()
    grad = torch.randn(2, 6, 4, 9, dtype=dtype)
    compiled = torch.compile(norm, backend="fuse")
    got = torch.autograd.grad(compiled(x), (x, norm.weight, norm.bias), grad)
    want = torch.autograd.grad(norm(x), (x, norm.weight, norm.bias), grad)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)
    assert fusebackend.metrics.eager_graphs == 0


def test_a_reduction_over_a_copy_reads_in_the_copied_tensors_memory_order() -> None:
    # torch 2.11 decomposes GroupNorm over channels-last activations into a contiguous copy, then
    # the reduction over the copy. The copy fuses into the reduction, which then reads the
    # activations: it runs in their memory order (builder._read_strides looks through the copy
    # and the cast), not the copy's.
    x = torch.randn(3, 8, 5, 7, dtype=bf16).to(memory_format=torch.channels_last)
    w, b = torch.randn(8, dtype=bf16), torch.randn(8, dtype=bf16)
    check(lambda x: F.silu(F.group_norm(x.contiguous().float(), 1, w.float(), b.float())), x)
    (reduction,) = [src for src in kernels().values() if "tl.reduce(" in src or "tl.sum(" in src]
    loads = [load for load in _loads(reduction) if "280*" in load]  # the activations, not w and b
    assert loads and all("rindex + 280*xindex" in load for load in loads), loads


def test_gpu_window_kernels_hold_4_elements_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # a flat kernel that reads a window (a padded depthwise convolution over channels-first
    # activations: 9 positions, each loaded element by element) takes blocks of
    # runtime.WINDOW_BLOCK; a kernel without one keeps 32 bytes a thread (fp32: 1024 by 4 warps)
    monkeypatch.setattr(runtime, "SMALL_POINTWISE", 1024)  # (the test's tensors are small)
    torch.manual_seed(0)
    bn1, bn2 = torch.nn.BatchNorm2d(8).eval(), torch.nn.BatchNorm2d(8).eval()
    conv = torch.nn.Conv2d(8, 8, 3, groups=8, bias=False)

    def block(x: torch.Tensor) -> torch.Tensor:
        y = F.pad(F.relu6(bn1(x)), (1, 1, 1, 1))
        return F.relu6(bn2(conv(y)))

    def launches(fn: Callable[..., Any], x: torch.Tensor) -> dict[str, str]:
        with fusebackend.config.patch(gpu_blocks=True), torch.no_grad():
            check(fn, x)
        compiled = fusebackend.last_compiled()
        lines = [line for line in compiled.wrapper.splitlines() if "XBLOCK=" in line]
        return {src: next(line for line in lines if f"{name}(" in line) for name, src in compiled.kernels.items()}

    x = torch.randn(2, 8, 32, 32)
    windows = {src: line for src, line in launches(block, x).items() if src.count("tl.load(in_ptr0 +") >= 9}
    assert len(windows) == 1 and all("XBLOCK=512, num_warps=4" in line for line in windows.values()), windows
    plain = launches(lambda x: F.relu6(x * 2 + 1), x)
    assert len(plain) == 1 and all("XBLOCK=1024, num_warps=4" in line for line in plain.values()), plain
