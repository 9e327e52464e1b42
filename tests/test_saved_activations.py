"""What a training graph saves for its backward: AOTAutograd's partition of fuse's joint graph
against the partition of Inductor's (the same partitioner over Inductor's decompositions, with
no code generated), so that fuse's peak memory is not above Inductor's for what the two save."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.decomposition import select_decomp_table

from fusebackend import backend
from fusebackend.decompositions import decomposition_table


def _recorder(partition: Callable[..., Any], sizes: list[int]) -> Callable[..., Any]:
    def recording(joint: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        fw, bw = partition(joint, inputs, **kwargs)
        sizes.extend(n.meta["val"].numel() * n.meta["val"].element_size() for n in bw.graph.nodes
                     if n.op == "placeholder" and not n.name.startswith("tangents")
                     and isinstance(n.meta.get("val"), torch.Tensor))
        return fw, bw

    return recording


def saved_bytes(fn: Callable[..., torch.Tensor], args: list[torch.Tensor], decompositions: dict[Any, Any],
                partition: Callable[..., Any]) -> int:
    """The bytes of the tensors the partition passes from the forward graph to the backward."""
    sizes: list[int] = []
    compiled = aot_function(fn, fw_compiler=lambda gm, _: gm, bw_compiler=lambda gm, _: gm,
                            partition_fn=_recorder(partition, sizes), decompositions=decompositions)
    compiled(*args).sum().backward()
    return sum(sizes)


def test_a_global_response_norm_saves_no_more_than_inductors_partition() -> None:
    # ConvNeXt V2's MLP: a product, GELU, GRN (x times its L2 norm over the positions, over the
    # norms' mean), a product. Kept whole, the norm stopped the partitioner recomputing x * norm
    # in the backward: it saved that MLP-wide activation, where Inductor's decomposition lets it
    # recompute it from what is saved anyway
    torch.manual_seed(0)
    x = torch.randn(2, 6, 6, 16, requires_grad=True)
    w1, w2 = torch.randn(64, 16, requires_grad=True), torch.randn(16, 64, requires_grad=True)
    gamma, beta = torch.randn(64, requires_grad=True), torch.randn(64, requires_grad=True)

    def block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, gamma: torch.Tensor,
              beta: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.linear(x, w1))
        g = torch.linalg.vector_norm(h, ord=2, dim=(1, 2), keepdim=True)
        n = g / (g.mean(dim=-1, keepdim=True) + 1e-6)
        return F.linear(gamma * (h * n) + beta + h, w2)

    args = [x, w1, w2, gamma, beta]
    ours = saved_bytes(block, args, decomposition_table(), backend._partition)
    inductors = saved_bytes(block, args, select_decomp_table(), min_cut_rematerialization_partition)
    assert ours <= inductors, (ours, inductors)


def _inductors_partition(joint: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
    """The min-cut partition after the joint-graph pass of Inductor's that decides what is one
    tensor (its other joint passes rewrite patterns, which change no saved activation here)."""
    from torch._inductor.fx_passes.post_grad import remove_noop_ops

    remove_noop_ops(joint.graph)
    joint.recompile()
    return min_cut_rematerialization_partition(joint, inputs, **kwargs)


def saved_bytes_of_model(name: str, ours: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    """The bytes a tiny zoo model's training step saves for its backward (its graphs summed):
    compiled by fuse (its partition recorded), or through AOTAutograd with Inductor's
    decompositions and partition (no code generated)."""
    import fusebackend
    from torch._dynamo.backends.common import aot_autograd

    from benchmarks.zoo.registry import ZOO

    sizes: list[int] = []
    torch._dynamo.reset()
    torch.manual_seed(0)
    built = ZOO[name].build("tiny")
    if ours:
        monkeypatch.setattr(backend, "_partition", _recorder(backend._partition, sizes))
        compiler: Any = "fuse"
    else:
        compiler = aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=lambda gm, _: gm,
                                partition_fn=_recorder(_inductors_partition, sizes),
                                decompositions=select_decomp_table())
    with fusebackend.config.patch(graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        compiled = torch.compile(built.model.train(), backend=compiler)
        built.loss(compiled(**built.train_inputs)).backward()
    return sum(sizes)


def test_deberta_saves_its_attention_probabilities_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # DeBERTa's attention: the probabilities, then dropout (of probability 0 in the zoo's
    # configurations: a copy) before the product with the values. The partitioner saw the copy
    # as a second tensor and saved both in one of the two layers; on the joint graph without
    # its no-op nodes (Inductor's remove_noop_ops, as Inductor runs it) it saves no more than
    # Inductor's decompositions and partition do
    pytest.importorskip("transformers")
    ours = saved_bytes_of_model("deberta_v2", True, monkeypatch)
    inductors = saved_bytes_of_model("deberta_v2", False, monkeypatch)
    assert ours <= inductors, (ours, inductors)
