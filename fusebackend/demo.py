"""``python -m fusebackend.demo``: compile a small model, check it against eager, show the kernels.

Runs on a GPU when there is one, otherwise on the CPU through Triton's interpreter (the same
generated kernels). Dumps go to ``$FUSE_DUMP_DIR`` (default ``./fuse_dumps``).
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn

import fusebackend


class TinyMLP(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.fc1(self.norm(x)))
        return x + torch.tanh(self.fc2(h)) * 0.5


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dump_dir = fusebackend.config.dump_dir or os.path.abspath("fuse_dumps")
    torch.manual_seed(0)
    model = TinyMLP().to(device)
    x = torch.randn(8, 16, 64, device=device, requires_grad=True)

    with fusebackend.config.patch(dump_dir=dump_dir):
        compiled = torch.compile(model, backend="fuse")
        out = compiled(x)
        out.square().mean().backward()
    grad = x.grad.clone()
    x.grad = None
    expected = model(x)
    expected.square().mean().backward()

    err = (out - expected).abs().max().item()
    gerr = (grad - x.grad).abs().max().item()
    ok = torch.allclose(out, expected, atol=1e-5, rtol=1e-5) and torch.allclose(grad, x.grad, atol=1e-5, rtol=1e-5)
    print(f"device: {device} ({'Triton interpreter' if fusebackend.use_interpreter() else 'compiled Triton'})")
    print(f"forward max |compiled - eager| = {err:.2e}, input-gradient max diff = {gerr:.2e}: {'OK' if ok else 'MISMATCH'}")
    for artifacts in fusebackend.history():
        print(f"graph {artifacts.name}: {artifacts.kernel_count} generated kernels, dumped to {artifacts.dump_path}")
    print()
    print(fusebackend.metrics.summary())
    forward = fusebackend.history()[0]
    name, source = next(iter(forward.kernels.items()))
    print(f"\nfirst kernel of {forward.name} ({name}):\n")
    print(source)
    print(forward.schedule)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
