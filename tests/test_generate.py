"""LLM generation (``benchmarks/generate.py``) on the CPU: tiny float32 decoders generate eager's
exact greedy tokens when compiled by fuse, through our lean loop (a compiled prefill and decode
step over a static cache) and through transformers' generate() with a static cache and a compile
config; the decode step writes the key-value cache in place (``lowering.mutations``)."""

from __future__ import annotations

import re

import pytest
import torch

import fusebackend

pytest.importorskip("transformers")

from benchmarks import generate  # noqa: E402

BATCH, PROMPT, NEW = 2, 8, 5


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model_and_tokens(request: pytest.FixtureRequest) -> tuple[str, torch.nn.Module, torch.Tensor, torch.Tensor]:
    model = generate.build(request.param, "tiny", torch.device("cpu"), torch.float32)
    ids = generate.prompt(model, BATCH, PROMPT, torch.device("cpu"))
    with torch.no_grad():
        expected = generate.Lean(model, None, None).generate(ids, NEW)
    return request.param, model, ids, expected


def test_lean_loop_gives_eager_tokens_and_writes_the_cache_in_place(model_and_tokens) -> None:
    name, model, ids, expected = model_and_tokens
    torch._dynamo.reset()
    fusebackend.metrics.reset()
    lean = generate.Lean(model, fusebackend.fuse, None)
    logits: list[torch.Tensor] = []
    with torch.no_grad(), fusebackend.config.patch(graph_cache=False):
        tokens = lean.generate(ids, NEW, first_logits=logits)
        reference: list[torch.Tensor] = []
        generate.Lean(model, None, None).generate(ids, NEW, first_logits=reference)
    assert torch.equal(tokens, expected), (tokens, expected)
    torch.testing.assert_close(logits[0], reference[0], atol=1e-4, rtol=1e-4)
    assert fusebackend.metrics.eager_graphs == 0
    assert fusebackend.metrics.graphs_compiled == 2  # the prefill and one decode step
    decode = fusebackend.history()[-1].schedule
    layers, _, _ = generate.kv_shape(model)
    # each layer's keys and values scattered into the cache's memory, no copy of the cache
    assert decode.count("(into input") >= 2 * layers, decode
    # ATen copies left: none of a cache (transformers 5.2x's 0-dim position count is copied by ATen)
    _, heads, head_dim = generate.kv_shape(model)
    cache = BATCH * heads * (PROMPT + NEW) * head_dim * 4
    copies = [line for line in decode.splitlines() if "aten.copy_" in line]
    assert all(f"read {cache / 1024:.2f} KiB" not in line for line in copies), decode


def test_transformers_recipe_gives_eager_tokens(model_and_tokens) -> None:
    name, model, ids, expected = model_and_tokens
    torch._dynamo.reset()
    fusebackend.metrics.reset()
    with torch.no_grad(), fusebackend.config.patch(graph_cache=False):
        tokens = generate.recipe(model, fusebackend.fuse, None)(ids, NEW)
    assert torch.equal(tokens, expected), (tokens, expected)
    assert fusebackend.metrics.graphs_compiled >= 1 and fusebackend.metrics.eager_graphs == 0


def test_agree_counts_leading_tokens() -> None:
    ref = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    got = torch.tensor([[1, 2, 3, 9], [1, 2, 7, 4]])
    assert generate.agree(got, ref, 1) == 1  # the second row agrees on its first new token only
    assert generate.agree(ref, ref, 1) == 3


def test_the_chart_draws_tokens_per_second_per_way_and_backend(tmp_path) -> None:
    rows = [{"model": "llama", "way": way, "batch": 1, "backend": backend, "tokens_per_s": speed}
            for way in ("lean", "recipe") for backend, speed in (("eager", 60.0), ("inductor", 500.0), ("fuse", 550.0))]
    path = generate.chart({"info": {"device": "cpu"}, "rows": rows}, str(tmp_path / "generate.png"))
    assert path is not None and (tmp_path / "generate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_batch_one_decode_step_generates_its_products_unless_the_variant_says_otherwise() -> None:
    """fuse generates products of one row by default (``config.row_products``); the benchmark's
    ``fuse-rows0`` variant leaves them to the library while it compiles and runs."""
    model = generate.build("llama", "tiny", torch.device("cpu"), torch.float32)
    fusebackend.dump.clear()
    with fusebackend.config.patch(graph_cache=False):
        rows = generate.measure("llama", model, 1, 6, 3, ["eager", "fuse", "fuse-rows0"], ["lean"], 1, None)
    assert [r.tokens_agree for r in rows] == [3, 3, 3]
    products = [sum("aten.mm" in line or "aten.addmm" in line for line in a.schedule.splitlines() if "extern" in line)
                for a in fusebackend.history()]
    assert len(products) == 4, products  # each variant's prefill and decode step
    assert products[1] == 0 and products[3] > 0, products


def test_int8_weights_decode_with_the_dequantization_in_the_products() -> None:
    """Weight-only int8 (``generate.quantize_int8``): fuse gives the quantized model's eager
    tokens, and its batch-1 decode step reads each int8 weight once, in the product's kernel (no
    library product, no dequantized copy: the graph's traffic is its floor)."""
    model = generate.quantize_int8(generate.build("llama", "tiny", torch.device("cpu"), torch.float32))
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    ids = generate.prompt(model, 1, 6, torch.device("cpu"))
    torch._dynamo.reset()
    fusebackend.dump.clear()
    with torch.no_grad():
        expected = generate.Lean(model, None, None).generate(ids, 3)
        with fusebackend.config.patch(graph_cache=False):
            tokens = generate.Lean(model, fusebackend.fuse, None).generate(ids, 3)
    assert torch.equal(tokens, expected), (tokens, expected)
    decode = fusebackend.history()[-1].schedule
    externs = [line for line in decode.splitlines() if line.startswith("  extern ")]
    assert not any("mm" in line.split("|")[0] for line in externs), decode
    moves = next(line for line in decode.splitlines() if line.startswith("  graph moves"))
    # at most the floor (each input read once; the caches, written in place at one position,
    # counted as written whole): no weight is read twice
    assert float(re.search(r"\(([0-9.]+)x\)", moves).group(1)) <= 1.0, moves
    quantized = sum(b.numel() for n, b in model.named_buffers() if n.endswith("weight_int8"))
    table = next(m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding))
    # the int8 weights counted (with their scales and norms), the embedding only gathered not
    assert quantized < generate.weight_bytes(model) < quantized + table.numel() * table.element_size()
