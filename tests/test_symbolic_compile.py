"""One compile for every size of a graph whose sizes Dynamo made symbolic (``config.symbolic``,
``fusebackend/lowering/symbolic_sizes.py``).

Each test compiles with the option on, calls with several sizes (odd, prime, past a multiple of
16), compares with eager, and asserts the compile count: one graph compiled once, nothing
compiled per shape, nothing run eagerly. The generated code is read too: kernels take the sizes
as arguments, not as literals, and the wrapper binds them from the inputs.
"""

from __future__ import annotations

import re

import pytest
import sympy
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusebackend
from fusebackend import dump, symbolic
from fusebackend.config import config


@pytest.fixture(autouse=True)
def _symbolic() -> None:
    with config.patch(symbolic="on"):
        yield


def _compiled_once(symbols: int | None = None) -> dump.CompiledArtifacts:
    """The one graph compiled, for every size (none compiled per shape, none run eagerly)."""
    assert fusebackend.metrics.graphs_compiled == 1 and not fusebackend.metrics.specialized
    assert not fusebackend.metrics.not_symbolic and fusebackend.metrics.eager_graphs == 0
    (artifacts,) = dump.history()
    binds = [line for line in artifacts.wrapper.splitlines() if re.fullmatch(r" +s\d+ = arg\d+(\.(size|stride)\(\d+\))?", line)]
    if symbols is not None:
        assert len(binds) == symbols, artifacts.wrapper  # each symbol bound once, from an input
    return artifacts


def _norm_after_gelu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(F.gelu(x @ w), (w.shape[1],)).sum(-1)


def test_a_normalization_over_a_symbolic_row_length_is_compiled_once() -> None:
    compiled = torch.compile(_norm_after_gelu, backend="fuse", dynamic=True)
    dump.clear()
    for batch, width in ((3, 16), (5, 7), (9, 33), (17, 16), (2, 100)):
        x, w = torch.randn(batch, 8), torch.randn(8, width)
        torch.testing.assert_close(compiled(x, w), _norm_after_gelu(x, w), rtol=1e-5, atol=1e-5)
    artifacts = _compiled_once(symbols=3)
    (source,) = [s for name, s in artifacts.kernels.items() if "red" in name]
    # a row of symbolic length: looped, the mean's 1/n from the size argument, int64 offsets
    assert "for roffset in range(0, rnumel, RBLOCK):" in source and "do_not_specialize" in source
    assert "tl.program_id(0).to(tl.int64)" in source
    assert "persistent" not in source.split("def ")[1].split("\n")[0]


def test_rows_of_a_symbolic_length_take_a_persistent_or_a_looped_kernel_at_each_call() -> None:
    """Two size classes of one reduction: rows that fit the block the
    heuristic chose at the first call's sizes run persistent, longer rows looped; the wrapper
    chooses at each call, and the one compile serves both."""
    def softmax_rows(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2, dim=-1) + x.amax(-1, keepdim=True)

    compiled = torch.compile(softmax_rows, backend="fuse", dynamic=True)
    dump.clear()
    first = torch.randn(6, 24)
    torch.testing.assert_close(compiled(first), softmax_rows(first), rtol=1e-5, atol=1e-5)
    (artifacts,) = dump.history()
    (name, source), = [(n, s) for n, s in artifacts.kernels.items() if "red" in n]
    block = 32  # the first call's rows of 24, in one block of the next power of two
    assert f"def {name}_persistent(" in source and source.count("@triton.jit") == 2
    assert re.search(rf"\n +if s\d+ <= {block}:  # rows that fit one block", artifacts.wrapper), artifacts.wrapper
    looped, persistent = source.split(f"def {name}_persistent(")
    assert "for roffset in range(0, rnumel, RBLOCK):" in looped and "for roffset" not in persistent
    assert "rmask = rindex < rnumel" in persistent  # rows shorter than the block are masked
    for rows, length in ((5, 3), (7, block), (4, block + 1), (3, 100), (9, 17)):
        x = torch.randn(rows, length)
        torch.testing.assert_close(compiled(x), softmax_rows(x), rtol=1e-5, atol=1e-5)
    _compiled_once(symbols=2)


def test_a_reduction_over_a_symbolic_batch_is_compiled_once() -> None:
    def column_sums(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(0) + x.amax(0)

    compiled = torch.compile(column_sums, backend="fuse")
    dump.clear()
    for batch in (4, 7, 16, 17, 31):
        x = torch.randn(batch, 24)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), column_sums(x), rtol=1e-5, atol=1e-5)
    _compiled_once(symbols=1)


def test_mark_dynamic_keeps_a_static_row_persistent() -> None:
    compiled = torch.compile(lambda x: torch.softmax(x * 3, -1), backend="fuse")
    dump.clear()
    for batch in (3, 6, 16, 17):
        x = torch.randn(batch, 5, 32)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), torch.softmax(x * 3, -1), rtol=1e-5, atol=1e-5)
    artifacts = _compiled_once(symbols=1)
    (source,) = artifacts.kernels.values()
    assert "persistent: each row in one block" in source and "do_not_specialize=['xnumel']" in source


class _Block(nn.Module):
    """Layer norm, attention by matrix products and a softmax, a GELU MLP, residuals."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = ((q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def test_a_transformer_block_over_batch_sizes_and_lengths_is_compiled_once() -> None:
    torch.manual_seed(0)
    block = _Block().eval()
    compiled = torch.compile(block, backend="fuse", dynamic=True)
    dump.clear()
    with torch.no_grad():
        for batch, seq in ((2, 5), (3, 8), (5, 3), (4, 17), (2, 16)):
            x = torch.randn(batch, seq, 32)
            torch.testing.assert_close(compiled(x), block(x), rtol=1e-4, atol=1e-4)
    artifacts = _compiled_once(symbols=2)
    # sizes are arguments; those not proven multiples of 16 are not specialized by Triton
    assert all("xnumel," in s.split("def ")[1].split("\n")[0] for s in artifacts.kernels.values())
    heads = [s.split("def ")[0] for s in artifacts.kernels.values()]
    assert any("do_not_specialize=['xnumel'" in h for h in heads), heads
    assert any("do_not_specialize" not in h for h in heads), heads  # xnumel = 32*s0*s1, say


def test_a_training_step_over_several_shapes_compiles_the_forward_and_the_backward_once() -> None:
    """The forward returns sizes for its backward (AOTAutograd's saved symbols): each call's,
    not the first call's. Gradients against a float64 copy, within twice eager's distance."""
    torch.manual_seed(0)
    block, eager = _Block(), _Block()
    eager.load_state_dict(block.state_dict())
    reference = _Block().double()
    reference.load_state_dict(block.state_dict())
    compiled = torch.compile(block, backend="fuse", dynamic=True)
    for batch, seq in ((2, 5), (3, 8), (5, 3), (4, 17)):
        x = torch.randn(batch, seq, 32)
        for model, inputs in ((compiled, x), (eager, x), (reference, x.double())):
            for p in model.parameters():
                p.grad = None
            model(inputs).square().mean().backward()
        for ours, theirs, ref in zip(block.parameters(), eager.parameters(), reference.parameters()):
            tolerance = 2 * (theirs.grad.double() - ref.grad).abs().max().item() + 1e-7
            assert (ours.grad.double() - ref.grad).abs().max().item() <= tolerance, (batch, seq)
    assert fusebackend.metrics.graphs_compiled == 2 and not fusebackend.metrics.specialized
    assert not fusebackend.metrics.not_symbolic and fusebackend.metrics.eager_graphs == 0


def test_a_size_used_as_a_value_is_compiled_per_shape_and_the_metrics_say_why() -> None:
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * x.shape[0] + 1

    compiled = torch.compile(scaled, backend="fuse", dynamic=True)
    for batch in (3, 5, 9):
        x = torch.randn(batch, 4)
        torch.testing.assert_close(compiled(x), scaled(x), rtol=1e-6, atol=1e-6)
    ((name, why),) = fusebackend.metrics.not_symbolic.items()
    assert why.startswith("aten.mul.Tensor: argument other is computed from sizes"), why
    assert fusebackend.metrics.specialized[name][0] == 3 and fusebackend.metrics.eager_graphs == 0
    assert f"not symbolic:       {name}: aten.mul.Tensor" in fusebackend.metrics.summary()


def test_a_call_that_does_not_fit_the_symbolic_signature_is_compiled_on_its_own() -> None:
    """The compile for all sizes serves calls whose inputs are the traced ones at some value of
    the symbols (``symbolic.fits``); strides of another layout are not."""
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x, y: x + y, tracing_mode="symbolic")(
        torch.randn(4, 6), torch.randn(4, 6))
    x = torch.randn(5, 7)
    assert symbolic.fits(gm, [x, torch.randn(5, 7)])
    assert not symbolic.fits(gm, [x, torch.randn(7, 5).t()])  # the traced strides are (s1, 1)
    assert not symbolic.fits(gm, [x, torch.randn(5, 7, dtype=torch.float64)])
    assert not symbolic.fits(gm, [x])


def test_the_compile_for_every_size_is_loaded_from_disk_at_other_sizes() -> None:
    """Its cache key is the symbolic graph, not the first call's sizes: a process that meets the
    graph at another size loads it (here: Dynamo reset, and the first call at a new size)."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x).softmax(-1) * 2

    for batch, seq in ((3, 7), (6, 20)):
        torch._dynamo.reset()
        fusebackend.metrics.reset()
        compiled = torch.compile(fn, backend="fuse", dynamic=True)
        x = torch.randn(batch, seq)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-5)
    assert fusebackend.metrics.cache_hits == 1 and not fusebackend.metrics.not_symbolic
    x = torch.randn(11, 5)
    torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-5)  # the loaded one, at a third size
    assert fusebackend.metrics.graphs_compiled == 1 and not fusebackend.metrics.specialized


def test_each_size_served_by_the_compile_for_every_size_is_checked_fast(monkeypatch) -> None:
    """Repeated calls at one size take the signature's fast check (``signature.SignatureCheck``),
    not the full key, at every size the compile for all sizes serves: a check made at the first
    size only would send every call at another size through ``input_key`` (GPT-2 on an H200:
    about 5% of a step at batch 1)."""
    from fusebackend import backend

    keys = []
    monkeypatch.setattr(backend, "input_key", lambda args: keys.append(1) or fusebackend.signature.input_key(args))
    compiled = torch.compile(lambda x: F.gelu(x).softmax(-1) * 2, backend="fuse", dynamic=True)
    for seq in (7, 20, 20, 20, 7, 7, 7):
        x = torch.randn(3, seq)
        torch.testing.assert_close(compiled(x), F.gelu(x).softmax(-1) * 2, rtol=1e-5, atol=1e-5)
    assert len(keys) == 3  # the first call at 7, at 20, and back at 7; the repeats are fast
    _compiled_once()


def test_a_direct_launch_takes_each_calls_grid_and_leaves_ints_past_int32_to_triton() -> None:
    """A kernel over symbolic sizes is launched with the grid of each call, and an int past
    int32's range (Triton compiled the kernel for int32 arguments at the first call) takes
    Triton's own path, which compiles for int64 (GPU launch path, tested with stand-ins)."""
    import types

    from fusebackend.kernels import direct_launch

    launched, slow = [], []
    direct = direct_launch.DirectLaunch(runner=None, launch=lambda *a: launched.append(a), head=(), grid=(7, 1, 1),
                                        hooks=types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None))
    x = torch.empty(64)
    launch = direct_launch.direct_launcher(direct, (x, 5), (), lambda *a: slow.append(a), per_call=True)
    launch(None, 3, x, 40)
    assert launched == [(3, 1, 1, None, x.data_ptr(), 40)] and not slow
    launch(None, 9, x, 2**31)
    assert slow == [(None, 9, x, 2**31)] and len(launched) == 1


def test_gathers_of_symbolic_length_are_fused_and_checked_where_not_proven() -> None:
    """An embedding of token ids plus one of positions (``arange`` of the symbolic length), a
    layer norm: one kernel, the gathers in the normalization's (the positions, one per
    position of the sequence, computed where the gather reads them), no ATen call. The ids come from data and stay
    checked, and so do the positions (the length is not bounded by 64); a gather at
    positions proven below the symbolic length (``x[:, arange(s) // 2]`` of a tensor of length s)
    is not."""
    words, places = torch.randn(50, 16), torch.randn(64, 16)

    def embed(ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return F.layer_norm(F.embedding(ids, words) + F.embedding(positions, places), (16,))

    def shuffled(x: torch.Tensor) -> torch.Tensor:
        return x[:, torch.arange(x.shape[1], device=x.device) // 2] * 2

    compiled = torch.compile(embed, backend="fuse", dynamic=True)
    dump.clear()
    for batch, seq in ((2, 5), (3, 17), (2, 40), (4, 9), (2, 64)):
        ids = torch.randint(0, 50, (batch, seq))
        torch.testing.assert_close(compiled(ids), embed(ids), rtol=1e-5, atol=1e-5)
    artifacts = _compiled_once()
    assert not fusebackend.metrics.fallbacks and len(artifacts.kernels) == 1
    (source,) = [s for name, s in artifacts.kernels.items() if "embedding" in name]
    assert source.count("tl.device_assert") == 2

    torch._dynamo.reset()
    fusebackend.metrics.reset()
    compiled = torch.compile(shuffled, backend="fuse", dynamic=True)
    dump.clear()
    for batch, seq in ((2, 5), (3, 17), (4, 2)):
        x = torch.randn(batch, seq, 3)
        torch.testing.assert_close(compiled(x), shuffled(x))
    (source,) = _compiled_once().kernels.values()
    assert "tl.device_assert" not in source and not fusebackend.metrics.fallbacks


def test_a_cat_and_a_cumsum_over_symbolic_sizes_are_compiled_once() -> None:
    """``cat`` of parts of symbolic lengths (the parts' bounds are expressions in the symbols),
    and a cumulative sum along a symbolic row (looped, a row of any length)."""
    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        joined = torch.cat([x * 2, y.neg(), x[:, :1]], dim=1)
        return joined, torch.cumsum(joined, 1)

    compiled = torch.compile(fn, backend="fuse", dynamic=True)
    dump.clear()
    for rows, a, b in ((3, 4, 5), (2, 7, 3), (5, 40, 33), (4, 2, 16)):
        x, y = torch.randn(rows, a), torch.randn(rows, b)
        for got, expected in zip(compiled(x, y), fn(x, y)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    artifacts = _compiled_once()
    assert not fusebackend.metrics.fallbacks
    (scan,) = [s for name, s in artifacts.kernels.items() if "scan" in name]
    assert "for roffset in range(0, rnumel, RBLOCK):" in scan and "do_not_specialize" in scan


def test_advanced_indexing_with_negative_positions_over_a_symbolic_dim() -> None:
    """``x[idx]`` wraps negative positions by the indexed dim's size, here a symbol."""
    def fn(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return x[idx] + 1

    compiled = torch.compile(fn, backend="fuse", dynamic=True)
    for rows, picks in ((5, 3), (9, 7), (17, 4)):
        x, idx = torch.randn(rows, 6), torch.randint(-rows, rows, (picks,))
        torch.testing.assert_close(compiled(x, idx), fn(x, idx))
    _compiled_once()
    assert not fusebackend.metrics.fallbacks


def test_a_matrix_product_padded_to_aligned_columns_over_symbolic_rows() -> None:
    """A product whose column count cuBLAS would run slowly (50 fp32 columns: rows 200 bytes
    apart) is padded to 52 columns (``config.pad_mm``) for rows of any count: the weight and the
    bias padded once per call by kernels of static sizes, the result a view of the first 50;
    a view of it that splits its rows ([2*s, 50] as [2, s, 50]: a language model's logits)
    keeps its row stride."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 50)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        stacked = torch.stack([x, x.flip(0)])  # [2, rows, 64]: the product's rows are 2*rows, viewed back
        return linear(F.gelu(x)).softmax(-1), x @ linear.weight.t(), linear(stacked) * 3

    compiled = torch.compile(fn, backend="fuse")
    dump.clear()
    with config.patch(pad_mm="always"), torch.no_grad():
        for rows in (3, 17, 40):
            x = torch.randn(rows, 64)
            torch._dynamo.mark_dynamic(x, 0)
            for got, expected in zip(compiled(x), fn(x)):
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    wrapper = _compiled_once(symbols=1).wrapper
    assert wrapper.count("constant_pad_nd(stream") == 2 and wrapper.count("aten_addmm(") == 2 and "aten_mm(" in wrapper
    assert re.search(r"view\(buf\d+, \(s\d+, 50\), \(52, 1\), 0\)", wrapper), wrapper


def _gpu_with(gib: int) -> bool:
    device = torch.get_default_device()
    return device.type == "cuda" and torch.cuda.get_device_properties(device).total_memory >= gib * 2**30


@pytest.mark.skipif(not _gpu_with(24), reason="a GPU with 24 GiB (FUSE_TEST_DEVICE=cuda): 2^31 elements")
def test_a_symbolic_size_past_int32_offsets_on_a_gpu() -> None:
    """Compiled at a small batch, then called with more than 2^31 elements: the offsets are int64
    and the sizes past int32 go through Triton's own launch (pointwise and a row reduction)."""
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2 + 1
        return y, (x.float() * 0.5).sum(-1)

    compiled = torch.compile(fn, backend="fuse")
    for rows in (33, 2**21 + 3):
        x = torch.randn(rows, 1024, dtype=torch.float16)
        torch._dynamo.mark_dynamic(x, 0)
        got, expected = compiled(x), fn(x)
        assert x.numel() < 2**31 or got[0].numel() > 2**31
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], expected[1], rtol=1e-4, atol=1e-3)
        del got, expected, x
    _compiled_once(symbols=1)


@pytest.mark.parametrize("case", ["split rows", "add a dim of 1", "padded rows merged", "merge", "split two"])
def test_reshaped_strides_match_tensor_view_at_several_sizes(case: str) -> None:
    """``symbolic_sizes.reshaped_strides`` against ``Tensor.view`` on tensors of those layouts
    at several values of the symbols (None where the view needs a copy, where view raises)."""
    from fusebackend.lowering.symbolic_sizes import reshaped_strides

    s, t = sympy.symbols("s0 s1", integer=True, positive=True)
    sizes, strides, new = {
        "split rows": ((8 * s, 50), (52, 1), (8, s, 50)),
        "add a dim of 1": ((s, 50), (52, 1), (1, s, 50)),
        "padded rows merged": ((s, t), (t + 3, 1), (s * t,)),
        "merge": ((2, s, 4), (4 * s, 4, 1), (2 * s, 4)),
        "split two": ((2 * s, 4), (4, 1), (2, s, 2, 2)),
    }[case]
    for hints in ({s: 3, t: 5}, {s: 7, t: 2}, {s: 16, t: 33}):
        at = lambda xs: tuple(int(sympy.sympify(x).xreplace(hints)) for x in xs)  # noqa: E731
        got = reshaped_strides(sizes, strides, new, hints)
        base = torch.empty(10_000).as_strided(at(sizes), at(strides))
        try:
            expected = base.view(at(new)).stride()
        except RuntimeError:
            expected = None
        if expected is None or got is None:
            assert got is None and expected is None, (hints, got, expected)
            continue
        assert [g for g, n in zip(at(got), at(new)) if n != 1] == [e for e, n in zip(expected, at(new)) if n != 1]


def test_by_default_a_graph_is_compiled_once_for_every_size() -> None:
    from fusebackend.config import Config

    assert Config().symbolic == "auto"  # FUSE_SYMBOLIC unset: the default


def _column_sums_of_long_columns(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0) * 2  # few, long columns: a compile at the first call's sizes splits the sum


def test_auto_compiles_per_shape_where_the_first_sizes_would_split_a_reduction() -> None:
    """"auto": a split reduction (made at the sizes compiled, not yet over symbolic sizes) sends
    the graph to one compile per shape, as fast as before; "on" compiles it once, unsplit, and
    the schedule says what it did not make."""
    compiled = torch.compile(_column_sums_of_long_columns, backend="fuse")
    with config.patch(symbolic="auto"):
        for rows in (4096, 5000):
            x = torch.randn(rows, 8)
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x), _column_sums_of_long_columns(x), rtol=1e-4, atol=1e-4)
    ((name, reason),) = fusebackend.metrics.not_symbolic.items()
    assert reason.startswith("a split column reduction (8 outputs of 4096 elements each)"), reason
    assert "FUSE_SYMBOLIC=on" in reason
    assert fusebackend.metrics.specialized[name][0] == 2
    assert all("split, phase 1" in a.fused_ir for a in dump.history())

    torch._dynamo.reset()
    fusebackend.metrics.reset()
    dump.clear()
    compiled = torch.compile(_column_sums_of_long_columns, backend="fuse")
    for rows in (4096, 5000):  # the fixture's "on"
        x = torch.randn(rows, 8)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x), _column_sums_of_long_columns(x), rtol=1e-4, atol=1e-4)
    artifacts = _compiled_once(symbols=1)
    assert "not made over symbolic sizes: a split column reduction" in artifacts.schedule
    assert "split" not in artifacts.fused_ir


def test_auto_compiles_per_shape_where_an_op_has_no_lowering_over_symbolic_sizes() -> None:
    """An op fuse lowers into kernels at one shape only (``frexp``) would be an ATen call in the
    compile for every size: "auto" compiles per shape instead, "on" makes the ATen call."""
    def mantissa(x: torch.Tensor) -> torch.Tensor:
        return torch.frexp(x * 3).mantissa + 1

    compiled = torch.compile(mantissa, backend="fuse", dynamic=True)
    with config.patch(symbolic="auto"):
        for n in (5, 9):
            x = torch.randn(n)
            torch.testing.assert_close(compiled(x), mantissa(x))
    assert "a lowering of aten.frexp.Tensor into kernels" in next(iter(fusebackend.metrics.not_symbolic.values()))
    assert not fusebackend.metrics.fallbacks
