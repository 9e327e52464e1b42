import torch
import torch.nn.functional as F

from helpers import check, kernel_count


def test_gelu_affine_is_one_kernel():
    x, w, b = torch.randn(33, 65), torch.randn(65), torch.randn(65)
    check(lambda x, w, b: F.gelu(x * w + b), x, w, b)
    assert kernel_count() == 1


def test_compiling_leaves_the_triton_interpret_variable_as_it_was(monkeypatch):
    # the interpreter is picked for fuse's kernels through Triton's knobs, which also write the
    # environment; a process the user starts afterwards must see what it saw before
    import os

    import fusebackend.kernels.runtime as runtime

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with runtime._decorating():
        pass
    assert "TRITON_INTERPRET" not in os.environ
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with runtime._decorating():
        pass
    assert os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.delenv("TRITON_INTERPRET")
    x = torch.randn(9, 5)
    check(lambda x: torch.sigmoid(x) * 3, x)
    assert "TRITON_INTERPRET" not in os.environ
