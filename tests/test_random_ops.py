"""Random ops generated in the kernel (``lowering/random_ops.py``): rand, randn, randint, bernoulli,
normal, uniform and dropout.

Values cannot equal eager's, so the tests check what must hold: the generator is Philox4x32-10
(its published known answers); each op's distribution (mean, variance, fractions below a few
points), with bounds of ``SIGMAS`` standard errors of the sample size, which a correct generator
fails with a probability under 1e-8 per check; repeatability under ``torch.manual_seed`` and new
values on each call, with the seed a runtime argument (no recompilation); independence of the
random nodes of one graph; the same values wherever one random node is computed (fused, or
recomputed in two kernels); and dropout, in inference and in a training step, as one kernel whose
backward graph reads the mask the forward drew. Every graph is generated (no ATen fallback).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from fusebackend.kernels import runtime
from helpers import compile_fn, kernel_count, kernels

SIGMAS = 6.0  # a two-sided 6-sigma bound fails by chance with probability 2e-9
SHAPE = (256, 256)  # 65536 values: standard errors of 0.1% for the mean of a uniform
FLOAT_BITS = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11, torch.float64: 53}


def _no_fallbacks(matrix_products: bool = False) -> None:
    """No op but (where allowed) the matrix products stayed an ATen call; no graph ran eagerly."""
    allowed = {"mm", "addmm"} if matrix_products else set()
    assert set(fusebackend.metrics.fallbacks) <= allowed, dict(fusebackend.metrics.fallbacks)
    assert fusebackend.metrics.eager_graphs == 0


def _assert_moments(values: torch.Tensor, mean: float, var: float, fourth: float) -> None:
    """The sample mean and variance lie within SIGMAS standard errors of ``mean`` and ``var``;
    ``fourth`` is the distribution's fourth central moment (the variance of the variance)."""
    v = values.double().flatten()
    n = v.numel()
    assert abs(v.mean().item() - mean) <= SIGMAS * math.sqrt(var / n), (v.mean().item(), mean)
    assert abs(v.var().item() - var) <= SIGMAS * math.sqrt((fourth - var**2) / n) + 2 * var / n, (v.var().item(), var)


def _assert_fraction(hits: torch.Tensor, p: float) -> None:
    """The fraction of true values is a binomial proportion of probability ``p``."""
    n = hits.numel()
    frac = hits.double().mean().item()
    assert abs(frac - p) <= SIGMAS * math.sqrt(p * (1 - p) / n) + 1 / n, (frac, p)


def _uniform_grid_moments(bits: int) -> tuple[float, float, float]:
    """Mean, variance and fourth central moment of k * 2**-bits, k uniform in [0, 2**bits)."""
    h = 2.0**-bits
    mean = (1 - h) / 2
    var = (1 - h * h) / 12
    if bits > 16:
        return mean, var, 1 / 80
    grid = torch.arange(2**bits, dtype=torch.float64) * h
    return mean, var, ((grid - mean) ** 4).mean().item()


def _check_uniform(u: torch.Tensor, dtype: torch.dtype) -> None:
    bits = FLOAT_BITS[dtype]
    assert u.dtype == dtype
    assert u.min().item() >= 0 and u.max().item() < 1, "outside [0, 1)"
    scaled = u.double() * 2.0**bits
    assert torch.equal(scaled, scaled.floor()), "not on the dtype's grid"
    _assert_moments(u, *_uniform_grid_moments(bits))
    for q in (0.1, 0.5, 0.9):
        _assert_fraction(u.double() < q, math.ceil(q * 2**bits) / 2**bits)
    _assert_uncorrelated(u.flatten()[:-1], u.flatten()[1:])


def _check_normal(z: torch.Tensor) -> None:
    assert torch.isfinite(z).all()
    _assert_moments(z, 0.0, 1.0, 3.0)
    for c in (1.0, 2.0):
        _assert_fraction(z.double().abs() < c, math.erf(c / math.sqrt(2)))
    _assert_uncorrelated(z.flatten()[:-1], z.flatten()[1:])


def _assert_uncorrelated(a: torch.Tensor, b: torch.Tensor) -> None:
    a, b = a.double().flatten(), b.double().flatten()
    r = torch.corrcoef(torch.stack([a, b]))[0, 1].item()
    assert abs(r) <= SIGMAS / math.sqrt(a.numel()), r


# ------------------------------------------------------------------------- the generator

PHILOX_KERNEL = '''
import triton
import triton.language as tl
from fusebackend.kernels import triton_helpers as th


@triton.jit
def philox_words(seed_ptr, offset_ptr, out_ptr, n, STREAM: tl.constexpr, XBLOCK: tl.constexpr):
    x = tl.arange(0, XBLOCK)
    m = x < n
    w0, w1, w2, w3 = th.philox(tl.load(seed_ptr), STREAM, tl.load(offset_ptr + x, m, other=0))
    tl.store(out_ptr + 4 * x, w0.to(tl.int32, bitcast=True), m)
    tl.store(out_ptr + 4 * x + 1, w1.to(tl.int32, bitcast=True), m)
    tl.store(out_ptr + 4 * x + 2, w2.to(tl.int32, bitcast=True), m)
    tl.store(out_ptr + 4 * x + 3, w3.to(tl.int32, bitcast=True), m)
'''

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85


def _philox_reference(counter: tuple[int, int, int, int], key: tuple[int, int]) -> list[int]:
    """Philox4x32-10 in plain Python integers."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p2 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = ((p2 >> 32) ^ c1 ^ k0), p2 & 0xFFFFFFFF, ((p0 >> 32) ^ c3 ^ k1), p0 & 0xFFFFFFFF
        k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
    return [c0, c1, c2, c3]


def test_reference_gives_philox_known_answers() -> None:
    # Random123's known-answer vectors for philox4x32 with 10 rounds
    assert _philox_reference((0, 0, 0, 0), (0, 0)) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert _philox_reference((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert _philox_reference((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@pytest.mark.parametrize("seed", [0, 0x123456789ABCDEF, 2**63 - 2], ids=["zero", "mixed", "large"])
def test_kernel_philox_is_philox(seed: int) -> None:
    """th.philox's words for (seed, stream, element) are Philox4x32-10 of counter (element low and
    high words, stream, 0) under key (seed low and high words), element indices past 2**32 included."""
    kernel = runtime.load_kernel("philox_words", PHILOX_KERNEL)
    offsets = [0, 1, 2, 1000, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 5, 3 * 2**40 + 7]
    stream = 3
    out = torch.empty(4 * len(offsets), dtype=torch.int32)
    kernel[(1,)](torch.tensor(seed), torch.tensor(offsets), out, len(offsets), STREAM=stream, XBLOCK=16)
    got = (out.cpu().to(torch.int64) & 0xFFFFFFFF).view(-1, 4).tolist()
    for offset, words in zip(offsets, got):
        counter = (offset & 0xFFFFFFFF, offset >> 32, stream, 0)
        assert words == _philox_reference(counter, (seed & 0xFFFFFFFF, seed >> 32)), hex(offset)


# -------------------------------------------------------------------------- distributions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_rand(dtype: torch.dtype) -> None:
    x = torch.randn(SHAPE)
    u = compile_fn(lambda x: torch.rand(SHAPE, dtype=dtype, device=x.device))(x)
    _check_uniform(u, dtype)
    _no_fallbacks()
    # the significand's bits reach the helper as a literal (its constexpr), in fp64 too: given as
    # a tensor, the compiled kernel branched at run time and lost bits
    bits = {torch.float32: 24, torch.float64: 53, torch.bfloat16: 8, torch.float16: 11}[dtype]
    assert any(re.search(rf"th\.rand\(.*, {bits}\)", src) for src in kernels().values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_randn(dtype: torch.dtype) -> None:
    x = torch.randn(SHAPE)
    z = compile_fn(lambda x: torch.randn(SHAPE, dtype=dtype, device=x.device))(x)
    assert z.dtype == dtype
    _check_normal(z)
    _no_fallbacks()
    assert any("th.randn(" in src for src in kernels().values())


def test_rand_like_and_randn_like_keep_the_layout() -> None:
    x = torch.randn(SHAPE[1], SHAPE[0]).t()  # transposed: the _like outputs take its strides
    u, z = compile_fn(lambda x: (torch.rand_like(x), torch.randn_like(x)))(x)
    assert u.stride() == torch.rand_like(x).stride() and z.stride() == torch.randn_like(x).stride()
    _check_uniform(u, torch.float32)
    _check_normal(z)
    _assert_uncorrelated(u, z)
    _no_fallbacks()
    assert kernel_count() == 1


def test_odd_shape_fused_with_arithmetic() -> None:
    x = torch.randn(37, 91)
    out = compile_fn(lambda x: x + 10 * torch.rand_like(x))(x)
    u = (out - x) / 10
    assert u.min() >= -1e-5 and u.max() < 1 + 1e-5
    _assert_moments(u, 0.5, 1 / 12, 1 / 80)
    _no_fallbacks()
    assert kernel_count() == 1


def test_uniform_and_normal_in_place_forms() -> None:
    x = torch.randn(SHAPE)
    u, z = compile_fn(lambda x: (torch.empty_like(x).uniform_(-2.0, 3.0), torch.empty_like(x).normal_(1.0, 2.0)))(x)
    assert u.min() >= -2 and u.max() < 3
    _assert_moments(u, 0.5, 25 / 12, 625 / 80)
    _assert_moments(z, 1.0, 4.0, 3 * 16.0)
    _no_fallbacks()  # the empty tensors are never allocated


@pytest.mark.parametrize("form", ["Tensor_float", "float_Tensor", "Tensor_Tensor", "float_float"])
def test_normal(form: str) -> None:
    mean = torch.linspace(-3, 3, SHAPE[0])[:, None].expand(SHAPE).contiguous()
    std = torch.linspace(0.5, 2, SHAPE[1]).expand(SHAPE).contiguous()
    fns: dict[str, Callable[..., Any]] = {
        "Tensor_float": lambda m, s: (torch.normal(m, 2.0) - m) / 2.0,
        "float_Tensor": lambda m, s: (torch.normal(1.0, s) - 1.0) / s,
        "Tensor_Tensor": lambda m, s: (torch.normal(m, s) - m) / s,
        "float_float": lambda m, s: (torch.normal(1.0, 2.0, SHAPE, device=m.device) - 1.0) / 2.0,
    }
    _check_normal(compile_fn(fns[form])(mean, std))
    _no_fallbacks()


@pytest.mark.parametrize("low,high", [(0, 10), (-5, 3), (0, 2**31 + 7)], ids=str)
def test_randint(low: int, high: int) -> None:
    x = torch.randn(SHAPE)
    r, f = compile_fn(lambda x: (torch.randint(low, high, SHAPE, device=x.device), torch.randint_like(x, low, high)))(x)
    assert r.dtype == torch.int64 and f.dtype == torch.float32
    for values in (r, f.to(torch.int64)):
        assert values.min() >= low and values.max() < high
        span = high - low
        _assert_moments(values.double(), (low + high - 1) / 2, (span * span - 1) / 12, span**4 / 80)
        if span <= 10:
            assert set(values.unique().tolist()) == set(range(low, high))
    _no_fallbacks()


# ------------------------------------------------------------------- seeds and streams


def test_manual_seed_repeats_and_each_call_draws_anew() -> None:
    x = torch.randn(64, 64)
    fn = compile_fn(lambda x: F.dropout(x, 0.5, training=True) + torch.randn_like(x))
    torch.manual_seed(7)
    a, b = fn(x), fn(x)
    torch.manual_seed(7)
    a2, b2 = fn(x), fn(x)
    torch.manual_seed(8)
    c = fn(x)
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a, b) and not torch.equal(a, c)
    # the seed is an argument of the kernel: one compilation serves every call
    assert fusebackend.metrics.graphs_compiled == 1
    assert fusebackend.metrics.kernels_generated == 1
    _no_fallbacks()


def test_the_seed_comes_from_the_default_generator() -> None:
    x = torch.randn(8)
    fn = compile_fn(lambda x: torch.rand_like(x))
    fn(x)  # compiled; the calls below draw one seed each
    torch.manual_seed(3)
    fn(x)
    after_call = torch.rand(4)
    torch.manual_seed(3)
    assert not torch.equal(torch.rand(4), after_call), "the compiled call did not advance the generator"


def test_random_nodes_of_a_graph_draw_independent_values() -> None:
    x = torch.randn(SHAPE)
    a, b, c = compile_fn(lambda x: (torch.rand_like(x), torch.rand_like(x), torch.rand(SHAPE, device=x.device)))(x)
    for p, q in ((a, b), (a, c), (b, c)):
        assert not torch.equal(p, q)
        _assert_uncorrelated(p, q)
    _no_fallbacks()


def test_a_random_node_read_by_two_kernels_has_the_same_values_in_both() -> None:
    # Row and column sums of one rand_like cannot share a kernel; the scheduler recomputes the
    # random node in both instead of storing it, and both must see the same values.
    x = torch.randn(96, 80)
    r_rows, r_cols = compile_fn(lambda x: _sums(torch.rand_like(x)))(x)
    assert kernel_count() >= 2
    assert "recomputed in each reader" in fusebackend.last_compiled().schedule
    torch.testing.assert_close(r_rows.sum(), r_cols.sum(), rtol=1e-5, atol=1e-3)
    _no_fallbacks()


def _sums(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return r.sum(1), r.sum(0)


def test_a_stored_random_node_and_its_readers_agree() -> None:
    x = torch.randn(64, 48)
    r, doubled, total = compile_fn(lambda x: (lambda r: (r, r * 2 + x, r.sum(-1)))(torch.rand_like(x)))(x)
    torch.testing.assert_close(doubled, r * 2 + x)
    torch.testing.assert_close(total, r.sum(-1))
    _no_fallbacks()


# ----------------------------------------------------------------------- bernoulli


@pytest.mark.parametrize("p", [0.0, 0.3, 1.0], ids=str)
def test_bernoulli_scalar_p(p: float) -> None:
    x = torch.randn(SHAPE)
    out = compile_fn(lambda x: torch.bernoulli(x, p))(x)
    assert out.dtype == x.dtype and set(out.unique().tolist()) <= {0.0, 1.0}
    _assert_fraction(out == 1, math.ceil(p * 2**24) / 2**24)
    _no_fallbacks()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bernoulli_tensor_p(dtype: torch.dtype) -> None:
    # probabilities 0, 0.25, 0.75 and 1 by column block; both forms of a tensor p
    p = torch.tensor([0.0, 0.25, 0.75, 1.0], dtype=dtype).repeat_interleave(SHAPE[1] // 4).expand(SHAPE).contiguous()
    x = torch.zeros(SHAPE, dtype=dtype)
    from_p, from_x = compile_fn(lambda x, p: (torch.bernoulli(p), x.clone().bernoulli_(p)))(x, p)
    for out in (from_p, from_x):
        assert out.dtype == dtype
        for k, q in enumerate((0.0, 0.25, 0.75, 1.0)):
            block = out[:, k * SHAPE[1] // 4:(k + 1) * SHAPE[1] // 4]
            _assert_fraction(block == 1, q)
            assert ((block == 0) | (block == 1)).all()
    quarter = slice(SHAPE[1] // 4, SHAPE[1] // 2)  # p = 0.25 in both: independent draws
    _assert_uncorrelated(from_p[:, quarter], from_x[:, quarter])
    _no_fallbacks()


# ------------------------------------------------------------------------- dropout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dropout_is_one_kernel(dtype: torch.dtype) -> None:
    x = torch.randn(128, 257, dtype=dtype)
    out = compile_fn(lambda x: F.dropout(x * 2, 0.5, training=True) + 1)(x)
    assert kernel_count() == 1
    _no_fallbacks()
    (source,) = kernels().values()
    assert "th.rand(" in source
    expected = ((x.float() * 2).to(dtype).float() * 2.0 + 1).to(dtype)  # kept: (x * 2) / (1 - p) + 1
    kept = out != 1
    assert torch.equal(out[kept], expected[kept])
    _assert_fraction(kept[expected != 1], 0.5)  # (where a kept value is 1, it cannot tell)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_native_dropout_mask_and_scale(p: float, dtype: torch.dtype) -> None:
    x = torch.randn(SHAPE, dtype=dtype) + 10  # never 0: a dropped element is exactly the zeros
    out, mask = compile_fn(lambda x: torch.ops.aten.native_dropout(x, p, True))(x)
    assert mask.dtype == torch.bool and out.dtype == dtype
    assert torch.equal(out == 0, ~mask)
    assert torch.equal(out[mask], (x.float() * (1 / (1 - p))).to(dtype)[mask])
    _assert_fraction(mask, 1 - math.ceil(p * 2**24) / 2**24)
    _no_fallbacks()


@pytest.mark.parametrize("p", [0.0, 1.0], ids=str)
def test_dropout_edge_probabilities_match_eager(p: float) -> None:
    x = torch.randn(33, 65)
    special = x.clone()
    special[0, :3] = torch.tensor([math.inf, -math.inf, math.nan])
    # F.dropout reaches the graph as native_dropout (or a clone for p = 0), whose eager answer
    # for a NaN or an infinity at p = 1 differs from F.dropout's on CUDA: those go to
    # native_dropout only, compared with its own eager answer on the device
    cases = [(lambda x: F.dropout(x, p, training=True), x),
             (lambda x: torch.ops.aten.native_dropout(x, p, True), special)]
    for fn, arg in cases:
        got, want = compile_fn(fn)(arg), fn(arg)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    _no_fallbacks()


def test_native_dropout_not_training_keeps_everything() -> None:
    x = torch.randn(20, 30)
    out, mask = compile_fn(lambda x: torch.ops.aten.native_dropout(x, 0.5, False))(x)
    assert torch.equal(out, x) and mask.all() and mask.dtype == torch.bool
    _no_fallbacks()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dropout_training_step_uses_the_forward_mask(dtype: torch.dtype) -> None:
    """Forward and backward graphs compiled, none run eagerly; the backward reads the forward's
    mask (AOTAutograd saves it), so the gradient is the one eager gives for that mask."""
    p = 0.4
    x = (torch.randn(64, 96) + 3).to(dtype).requires_grad_()  # never 0: the mask shows in the output
    w = torch.randn(64, 96, dtype=dtype)
    g = torch.randn(64, 96, dtype=dtype)

    def step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dropped = F.dropout(x * 2, p, training=True)
        return dropped, torch.tanh(dropped) * w

    dropped, y = compile_fn(step)(x, w)
    ((dropped * g).sum() + y.sum()).backward()
    names = [a.name for a in fusebackend.history()]
    assert any(n.startswith("forward") for n in names) and any(n.startswith("backward") for n in names), names
    _no_fallbacks()
    forward = next(a for a in fusebackend.history() if a.name.startswith("forward"))
    backward = next(a for a in fusebackend.history() if a.name.startswith("backward"))
    assert len(forward.kernels) == 1 and any("th.rand(" in s for s in forward.kernels.values())
    assert not any("th.rand" in s for s in backward.kernels.values())  # it reads the stored mask

    # the answer for the mask the forward drew, from the same inputs: in float64 for fp32, and for
    # bf16 eager's in bf16 (the mask and scale applied in one op, as dropout applies them; bf16
    # rounds after each op, as fused kernels do)
    mask = dropped.detach() != 0
    assert 0 < mask.float().mean() < 1
    ref_dtype = torch.float64 if dtype == torch.float32 else dtype
    ref_x = x.detach().to(ref_dtype).requires_grad_()
    ref_dropped = torch.ops.aten.native_dropout_backward(ref_x * 2, mask, 1 / (1 - p))
    ((ref_dropped * g.to(ref_dtype)).sum() + (torch.tanh(ref_dropped) * w.to(ref_dtype)).sum()).backward()
    torch.testing.assert_close(dropped.to(ref_dtype), ref_dropped.detach(), **_tolerance(dtype))
    torch.testing.assert_close(x.grad.to(ref_dtype), ref_x.grad, **_tolerance(dtype))
    assert torch.equal(x.grad == 0, ~mask)  # dropped elements get no gradient


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}


def test_module_dropout_trains() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(64, 8))
    compiled = torch.compile(model, backend="fuse")
    x = torch.randn(16, 32)
    losses = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = compiled(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    _no_fallbacks(matrix_products=True)
