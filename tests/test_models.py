"""Model tests: small models trained a few steps with backend="fuse" next to an identical eager copy.

After every step the outputs, the loss and every parameter's gradient must match eager, and the
parameters (updated by SGD from those gradients) must stay equal. Both the forward and the
backward graph are compiled by the backend and none of them may fall back to eager.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusebackend
from helpers import assert_same, kernel_count

# fp32 tolerance for training. Matrix products are the same ATen calls in both copies; the
# generated pointwise code differs from eager's by an ulp here and there (fused chains round
# once), which three SGD steps do not amplify beyond this.
TOL = 1e-5
# The transformer block is compared with a float64 copy trained alongside: AOTAutograd
# decomposes LayerNorm and softmax (forward and backward) into primitive ops whose sums run in
# another order than eager's fused ATen kernels. The same decompositions run eagerly
# (aot_autograd with make_boxed_func as compiler) already differ from eager by up to ~6e-5 in
# LayerNorm weight gradients after two SGD steps; on a GPU, fuse's sums differed from eager's by
# 1.3e-4 in one element of a weight gradient after two steps (2026-11-23). Both are rounding, so
# the test asks that fuse be no further from float64 than twice eager's distance (plus 1e-5).
BLOCK_TOL = 1e-5


class MLP(nn.Module):
    def __init__(self, d_in: int = 24, d_hidden: int = 64, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.drop = nn.Dropout(0.0)  # p=0: deterministic, so the eager copy can match it
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(F.gelu(self.fc1(x))))


class Block(nn.Module):
    """A pre-norm transformer block: attention through matmuls and softmax, then a GELU MLP."""

    def __init__(self, d_model: int = 32, n_heads: int = 4) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h, hd = self.n_heads, c // self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, h, hd).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def train_side_by_side(model: nn.Module, x: torch.Tensor, steps: int = 3, lr: float = 0.1,
                       tol: float = TOL, against_fp64: bool = False) -> None:
    """Train ``model`` compiled and an eager deep copy; assert they agree after every step.

    ``against_fp64``: where the two may differ by more than ``tol`` through the order of their
    sums alone, train a float64 copy as well and assert, for every output, gradient and
    parameter, that the compiled model is no further from it than twice eager's distance plus
    ``tol``."""
    eager = copy.deepcopy(model)
    exact = copy.deepcopy(model).double() if against_fp64 else None
    compiled = torch.compile(model, backend="fuse", fullgraph=True)
    opt_c = torch.optim.SGD(model.parameters(), lr=lr)
    opt_e = torch.optim.SGD(eager.parameters(), lr=lr)
    opt_x = torch.optim.SGD(exact.parameters(), lr=lr) if exact is not None else None

    def agree(what: str, c: torch.Tensor, e: torch.Tensor, r: torch.Tensor | None, atol: float = tol) -> None:
        if r is None:
            try:
                assert_same(c, e, atol, tol)
            except AssertionError as exc:
                raise AssertionError(f"{what} differs\n{exc}") from None
            return
        err_c = (c.double() - r).abs().max().item()
        err_e = (e.double() - r).abs().max().item()
        assert err_c <= 2 * err_e + atol, f"{what}: {err_c:.3g} from float64, eager {err_e:.3g}"

    for step in range(steps):
        # A random upstream gradient: every output element gets a different weight.
        g = torch.randn(eager(x).shape)
        for opt in (opt_c, opt_e) + ((opt_x,) if opt_x is not None else ()):
            opt.zero_grad()
        out_c = compiled(x)
        out_e = eager(x)
        out_x = exact(x.double()) if exact is not None else None
        agree(f"step {step}: output", out_c, out_e, out_x)
        loss_c, loss_e = (out_c * g).sum(), (out_e * g).sum()
        loss_c.backward()
        loss_e.backward()
        loss_x = (out_x * g.double()).sum() if out_x is not None else None
        if loss_x is not None:
            loss_x.backward()
        agree(f"step {step}: loss", loss_c.detach(), loss_e.detach(),
              None if loss_x is None else loss_x.detach(), tol * out_e.numel())
        params_x = list(exact.parameters()) if exact is not None else [None] * len(list(eager.parameters()))
        for (name, p_c), p_e, p_x in zip(model.named_parameters(), eager.parameters(), params_x):
            assert p_c.grad is not None, f"step {step}: no gradient for {name}"
            agree(f"step {step}: gradient of {name}", p_c.grad, p_e.grad, None if p_x is None else p_x.grad)
        opt_c.step()
        opt_e.step()
        if opt_x is not None:
            opt_x.step()
        for (name, p_c), p_e, p_x in zip(model.named_parameters(), eager.parameters(), params_x):
            agree(f"step {step}: {name}", p_c.detach(), p_e.detach(), None if p_x is None else p_x.detach())
    m = fusebackend.metrics
    assert m.eager_graphs == 0, "a graph fell back to eager"
    names = [a.name for a in fusebackend.history()]
    assert any(n.startswith("forward") for n in names), names
    assert any(n.startswith("backward") for n in names), names
    assert kernel_count() > 0
    assert m.fallbacks["mm"] + m.fallbacks["addmm"] + m.fallbacks["bmm"] > 0  # matmuls stay ATen


def test_mlp_trains_like_eager() -> None:
    train_side_by_side(MLP(), torch.randn(16, 24))


def test_mlp_3d_input_trains_like_eager() -> None:
    train_side_by_side(MLP(d_in=12, d_hidden=20, d_out=6), torch.randn(2, 5, 12))


def test_transformer_block_trains_like_eager() -> None:
    train_side_by_side(Block(d_model=32, n_heads=4), torch.randn(2, 8, 32), tol=BLOCK_TOL, against_fp64=True)


def test_transformer_block_input_gradient() -> None:
    block = Block()
    eager = copy.deepcopy(block)
    x = torch.randn(2, 8, 32, requires_grad=True)
    x_e = x.detach().clone().requires_grad_()
    g = torch.randn(2, 8, 32)
    out = torch.compile(block, backend="fuse", fullgraph=True)(x)
    (out * g).sum().backward()
    (eager(x_e) * g).sum().backward()
    assert_same(x.grad, x_e.grad, TOL, TOL)
    assert fusebackend.metrics.eager_graphs == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_transformer_block_half_inference(dtype: torch.dtype) -> None:
    block = Block().to(dtype).eval()
    x = torch.randn(2, 8, 32, dtype=dtype)
    compiled = torch.compile(block, backend="fuse", fullgraph=True)
    with torch.no_grad():
        out = compiled(x)
        expected = block(x)
        reference = Block.forward(copy.deepcopy(block).float(), x.float())
    assert out.dtype == dtype
    # Within half-precision tolerance of eager, and no further from the fp32 result than eager is
    # (fused chains round once where eager rounds after every op).
    assert_same(out, expected)
    err = (out.float() - reference).abs().max().item()
    eager_err = (expected.float() - reference).abs().max().item()
    assert err <= 2 * eager_err + 1e-3, (err, eager_err)
    assert fusebackend.metrics.eager_graphs == 0
    assert [a.name for a in fusebackend.history()][0].startswith("inference")
