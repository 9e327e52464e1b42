"""Matrix products generated with their epilogues (``lowering/product_templates.py``,
``codegen/product.py``): ``mm`` and ``addmm`` as one ``tl.dot`` kernel that also computes what
reads the product, under ``FUSE_PRODUCT_TEMPLATES=always`` and, in Triton's interpreter, under
``mode="max-autotune"``. Every kernel runs in the interpreter here and is compared with eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from fusebackend import config
from helpers import check, kernels

f32, bf16 = torch.float32, torch.bfloat16
TOL = {f32: {"atol": 1e-4, "rtol": 1e-4}, bf16: {"atol": 2e-2, "rtol": 2e-2}}


@pytest.fixture
def always():
    with config.patch(product_templates="always"):
        yield


def _the_kernel() -> tuple[str, str]:
    ks = kernels()
    assert len(ks) == 1, (list(ks), fusebackend.last_compiled().schedule)
    return next(iter(ks.items()))


def _no_library_products() -> None:
    assert not fusebackend.metrics.fallbacks, dict(fusebackend.metrics.fallbacks)
    assert "extern" not in fusebackend.last_compiled().schedule.split("graph moves")[0].replace("0 extern calls", "")


@pytest.mark.parametrize("dtype", [f32, bf16])
@pytest.mark.parametrize("m, k, n", [(40, 48, 72), (17, 16, 33), (64, 96, 128), (130, 32, 20), (600, 16, 24)])
def test_a_linear_its_activation_and_residual_are_one_product_kernel(always, dtype: torch.dtype, m: int, k: int,
                                                                   n: int) -> None:
    x, w, b, r = (torch.randn(s, dtype=dtype) for s in ((m, k), (n, k), (n,), (m, n)))

    def fn(x, w, b, r):
        return torch.relu(F.linear(x, w, b)) + r

    check(fn, x, w, b, r, **TOL[dtype])
    _no_library_products()
    name, source = _the_kernel()
    assert name.startswith("fused_mm0_addmm_relu_add"), name
    assert source.count("tl.dot(") == 1 and source.count("tl.store(") == 1
    assert "for k in range(0, %d, KBLOCK)" % k in source


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_transposed_and_offset_factors_with_alpha_and_beta(always, dtype: torch.dtype) -> None:
    a = torch.randn(48, 40, dtype=dtype)[:, 3:37]  # [48, 34], columns offset
    wt = torch.randn(20, 64, dtype=dtype)
    bias = torch.randn(20, dtype=dtype)

    def fn(a, wt, bias):
        return torch.addmm(bias, a.t()[:, :32], wt[:, :32].t(), beta=0.5, alpha=2.0).sigmoid()

    check(fn, a, wt, bias, **TOL[dtype])
    _no_library_products()
    assert "tl.dot(" in _the_kernel()[1]


def test_a_product_returned_beside_its_epilogue_is_stored_by_the_same_kernel(always) -> None:
    x, w = torch.randn(32, 16), torch.randn(16, 24)

    def fn(x, w):
        y = x @ w
        return y, torch.tanh(y) * 3

    check(fn, x, w, **TOL[f32])
    name, source = _the_kernel()
    assert source.count("tl.store(") == 2, source


def test_a_pointwise_factor_is_computed_in_the_product_loop_or_stored_before(always) -> None:
    x, w = torch.randn(24, 32), torch.randn(32, 40)
    check(lambda x, w: (x * 2 + 1) @ w, x, w, **TOL[f32])
    assert any("tl.dot(" in s for s in kernels().values())


@pytest.mark.parametrize("shape", [(20, 20, 24), (8, 32, 32), (32, 32, 12)])
def test_a_product_that_does_not_fit_the_tiles_stays_the_librarys(always, shape: tuple[int, int, int]) -> None:
    m, k, n = shape  # K not a multiple of 16, M or N under 16
    x, w = torch.randn(m, k), torch.randn(k, n)
    check(lambda x, w: torch.relu(x @ w), x, w, **TOL[f32])
    assert not any("tl.dot(" in s for s in kernels().values())


def test_max_autotune_takes_the_template_in_the_interpreter_and_the_default_mode_does_not() -> None:
    x, w, b = torch.randn(32, 32), torch.randn(48, 32), torch.randn(48)

    def fn(x, w, b):
        return F.gelu(F.linear(x, w, b))

    eager = fn(x, w, b)
    torch.testing.assert_close(torch.compile(fn, backend="fuse")(x, w, b), eager, **TOL[f32])
    assert fusebackend.metrics.fallbacks["addmm"] == 1 and not any("tl.dot(" in s for s in kernels().values())
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend="fuse", mode="max-autotune-no-cudagraphs")(x, w, b), eager,
                               **TOL[f32])
    dots = [s for s in kernels().values() if "tl.dot(" in s]
    assert len(dots) == 1 and "erf" in dots[0], dots  # the GELU computed on the product's tile


def test_a_training_step_of_generated_products_matches_float64(always) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 16))
    reference = copy.deepcopy(model).double()
    x = torch.randn(32, 32)
    compiled = torch.compile(model, backend="fuse")
    compiled(x).square().sum().backward()
    reference(x.double()).square().sum().backward()
    eager = copy.deepcopy(model)
    for p in eager.parameters():
        p.grad = None
    eager(x).square().sum().backward()
    assert fusebackend.metrics.eager_graphs == 0
    # two forward products; the backward's three (the hidden gradient, both weights' gradients)
    assert sum("tl.dot(" in s for s in kernels().values()) == 5, list(kernels())
    for (name, p), e, ref in zip(model.named_parameters(), eager.parameters(), reference.parameters()):
        eager_error = (e.grad.double() - ref.grad).abs().max().item()
        error = (p.grad.double() - ref.grad).abs().max().item()
        assert error <= 4 * eager_error + 1e-6, (name, error, eager_error)


def test_a_returned_factor_of_the_products_shape_is_stored_by_its_own_kernel(always) -> None:
    # x * 2 is [32, 32] as the product is: a kernel of the product stores none of its factors
    x, w = torch.randn(32, 32), torch.randn(32, 32)

    def fn(x, w):
        y = x * 2
        return y, torch.relu(y @ w)

    check(fn, x, w, **TOL[f32])
    dots = [s for s in kernels().values() if "tl.dot(" in s]
    assert len(dots) == 1 and dots[0].count("tl.store(") == 1, list(kernels())


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_a_batched_product_and_its_scale_and_softmax_input_are_one_kernel(always, dtype: torch.dtype) -> None:
    # attention scores written out by hand: q @ k^T per batch and head, scaled, plus a mask
    q, k = torch.randn(6, 40, 32, dtype=dtype), torch.randn(6, 24, 32, dtype=dtype)
    mask = torch.randn(40, 24, dtype=dtype)

    def fn(q, k, mask):
        return torch.bmm(q, k.transpose(1, 2)) * 0.125 + mask

    check(fn, q, k, mask, **TOL[dtype])
    _no_library_products()
    name, source = _the_kernel()
    assert name.startswith("fused_mm0_bmm") and "x_outer = tl.program_id(0) // " in source, source


def test_max_autotune_tries_other_k_steps_of_a_product() -> None:
    x, w = torch.randn(64, 64), torch.randn(64, 48)
    fn = torch.compile(lambda x, w: torch.relu(x @ w), backend="fuse", mode="max-autotune-no-cudagraphs")
    torch.testing.assert_close(fn(x, w), torch.relu(x @ w), **TOL[f32])
    (text,) = [t for name, t in fusebackend.last_compiled().autotune.items() if name.startswith("fused_mm")]
    lines = text.splitlines()
    assert "KBLOCK=64" in lines[0] and any("KBLOCK=32" in line for line in lines[1:]), text
    assert not any("KBLOCK=128" in line for line in lines), text  # K is 64: no such step fits


def test_a_candidate_that_cannot_run_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    from fusebackend.kernels import autotune

    real = autotune.Tuner._time

    def failing(self, launcher, stream, args):  # every candidate but the heuristic's fails
        if self.choices.index(launcher) > 0:
            raise RuntimeError("out of resource: shared memory (a test's)")
        real(self, launcher, stream, args)
        return 1.0, 1.0

    monkeypatch.setattr(autotune.Tuner, "_time", failing)
    x, w = torch.randn(64, 64), torch.randn(64, 48)
    fn = torch.compile(lambda x, w: torch.relu(x @ w), backend="fuse", mode="max-autotune-no-cudagraphs")
    torch.testing.assert_close(fn(x, w), torch.relu(x @ w), **TOL[f32])
    text = "\n".join(fusebackend.last_compiled().autotune.values())
    assert "could not run (RuntimeError: out of resource: shared memory (a test's))" in text, text
    assert all("<- chosen" in line for line in text.splitlines() if line.lstrip().startswith("heuristic")), text
