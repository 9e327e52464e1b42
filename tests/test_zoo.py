"""The model zoo on the CPU: real architectures (``benchmarks/zoo``) in their tiny configurations.

For every zoo model whose library imports here (transformers' models; torchvision's and timm's
skip with the reason where those are not installed):

- inference: ``model.eval()`` under ``torch.no_grad()``, compiled with ``backend="fuse"``; no
  graph may run eagerly, eager's outputs must not have faded to nothing, and every output's
  distance from a float64 copy's (relative to the output's largest magnitude) must be at most
  twice eager's distance plus ``OUTPUT_TOL``.
- a training step (forward, the model's loss ``built.loss``, backward): the compiled fp32 model,
  an eager fp32 copy and an eager float64 copy of the same weights on the same batch. For the loss
  and every parameter gradient, the compiled result's distance from float64 must be at most twice
  eager's distance plus ``GRAD_ATOL`` times the largest float64 gradient of the model; batch norm's
  running statistics (updated in train mode) are held to the same rule. No graph may run eagerly.

Dropout is off in every zoo model, so the three runs compute the same function.

The runner (``python -m benchmarks.zoo``) is run once on GPT-2's tiny configuration in both modes
(its JSON, table, chart, and ``--chart-from`` on what it wrote), and its report merges results
saved by separate runs.

Which models: by default (``--zoo=sample``) the zoo's first 23 models (``FIRST_MODELS``) but five
whose layers the others have (``LEFT_OUT``), and a fixed sample of the others (``SAMPLED_MODELS``,
one of each kind of layer they brought), in inference; of those, the models of ``TRAIN_SAMPLE``
take a training step. The rest skip. Every model, each with its training step, and one model::

    python -m pytest tests/test_zoo.py --zoo=all      (or pytest --full: every sampled test)
    python -m pytest tests/test_zoo.py --zoo=all -k "[NAME]"

``--zoo-train`` picks the training steps apart from the models: ``sample`` (``TRAIN_SAMPLE``, the
default with ``--zoo=sample``), ``all`` (every model tested; the default with ``--zoo=all``), or
``core`` (``TRAIN_SET``: GPT-2, Llama, BERT, T5, ViT, ResNet, MobileNetV2).

Time on 2 cores, cold kernel cache: the default set about 2 minutes (2026-11-27: 57 s of
inference, 36 s of training steps, the runner's 21 s); before ``LEFT_OUT`` and ``TRAIN_SAMPLE``
it took 6.7 minutes (257 s of training steps, MobileNetV2's 87 s in both modes the slowest).
``--zoo=all`` took 13.6 minutes for the file (2026-11-26; the 50 other models 10 minutes, the
slowest MobileViT, LeViT and LongT5 at about a minute each), 16.0 minutes with ``--zoo-train=all``
over 80 models on 2026-12-02.
"""

from __future__ import annotations

import copy
import json
import pathlib
from typing import TYPE_CHECKING

import pytest
import torch

pytest.importorskip("transformers", reason="the zoo needs transformers: pip install -e '.[zoo]'")

import fusebackend  # noqa: E402
from benchmarks.zoo import TRAIN_SET, ZOO  # noqa: E402
from benchmarks.zoo.compare import (  # noqa: E402
    buffer_distances, cast_inputs, float64_copy, gradient_distances, output_error, output_names, output_tensors,
    relative_error, training_step,
)
from benchmarks.zoo.spec import narrow  # noqa: E402

if TYPE_CHECKING:
    from benchmarks.zoo.run import ZooRow

# Outputs against float64, relative to the output's largest magnitude, on top of twice eager's own
# distance. fp32 rounds at about 1.2e-7 of that magnitude per operation; the compiled graph sums
# in another order than eager's kernels (LayerNorm, softmax and the losses are decomposed into
# primitive reductions). 1e-5 leaves a wide margin for other CPUs and BLAS builds, and is still a
# thousand times below what a wrong op does (1e-2 and more).
OUTPUT_TOL = 1e-5
# The absolute term of the gradient rule, relative to the model's largest float64 gradient: about
# 16 units in the last place of fp32 at that magnitude. It covers gradients that eager happens to
# compute exactly (a bias gradient summed in the same order as float64's: distance 0) and that
# the compiled graph sums in another order, and gradients that deep batch-normed stacks amplify
# rounding into: in MobileNetV2 (batch 2, 1x1 maps at the end) the stem's batch-norm bias gradient
# is 1.5e-4 from float64 in eager, and 3.2e-4 and 3.4e-4 in eager itself in channels-last or
# without oneDNN (2026-11-23; the gradient's scale is 5, the model's largest 272): twice eager's
# distance alone would fail eager's own variants.
GRAD_ATOL = 2e-6

# Every run tests the zoo's first 23 models (tested on every run before the zoo grew) and a fixed
# sample of the others, chosen for what their layers add to the first ones' and kept under two
# minutes on 2 cores: Gemma 2 (tanh soft-capping, GeGLU, sliding windows), BLOOM (ALiBi), OPT
# (learned positions, ReLU), DeBERTa-v2 (attention scores gathered from relative positions), BART
# (an encoder-decoder with learned positions), wav2vec 2.0 (1-d convolutions over raw audio,
# GroupNorm, a weight-normed grouped convolution), PoolFormer (one-group GroupNorm, average
# pooling), DINOv2 (bicubic interpolation of the position embeddings) and Stable Diffusion's VAE
# decoder (diffusers; GroupNorm of 32 groups, nearest upsampling); on machines with torchvision and
# timm, DeepLabV3 (dilated convolutions, bilinear upsampling) and CoAtNet (MBConv and relative
# attention). ``--zoo=all`` tests every model.
FIRST_MODELS = ("gpt2", "bert", "distilbert", "llama", "qwen2", "gpt_neox", "t5", "whisper_encoder", "vit",
                "clip_vision", "swin", "convnext", "resnet", "mobilenet_v2", "efficientnet", "tv_resnet50",
                "tv_vit_b_16", "tv_mobilenet_v3_large", "tv_swin_t", "tv_convnext_tiny", "timm_vit_base_patch16_224",
                "timm_efficientnet_b0", "timm_convnext_tiny")
SAMPLED_MODELS = ("gemma2", "bloom", "opt", "deberta_v2", "bart", "wav2vec2", "poolformer", "dinov2",
                  "sd_vae_decoder", "tv_deeplabv3_resnet50", "timm_coatnet_0_rw_224")
# First models the default run leaves to --zoo=all, their layers those of the others: MobileNetV2
# (87 s on 2 cores, 35 s of inference and 52 s of training: its 17 inverted-residual blocks are
# fixed by the architecture) and EfficientNet (31 s), whose depthwise convolutions, batch norm and
# squeeze-and-excitation are ConvNeXt's, ResNet's and tests/test_convolutions.py's inverted residual
# and squeeze-excitation blocks; DistilBERT (BERT's layers, fewer), Qwen2 (Llama's, with q/k/v
# biases) and CLIP's vision tower (ViT's, with a pre-LayerNorm and the quick GELU).
LEFT_OUT = ("mobilenet_v2", "efficientnet", "distilbert", "qwen2", "clip_vision")
DEFAULT_MODELS = tuple(m for m in FIRST_MODELS if m not in LEFT_OUT) + SAMPLED_MODELS

# The training steps of the default run: the backward graphs of each kind of model and layer.
# GPT-2 (a causal LM: Conv1D, tied embeddings, the tanh GELU, the LM loss), Llama (RMSNorm, rotary
# positions, the gated SiLU MLP), ViT (an encoder: LayerNorm, the erf GELU, patches), ResNet (batch
# norm in train mode, its running statistics, max pooling), ConvNeXt (depthwise convolutions,
# LayerNorm over channels-last maps), PoolFormer (one-group GroupNorm, average pooling) and wav2vec
# 2.0 (GroupNorm, 1-d and weight-normed grouped convolutions, the CTC loss): 36 s on 2 cores
# (2026-11-27). The other 17 models' steps took 220 s (T5's 15 s, MobileNetV2's 52 s); they run
# with --zoo-train=all (the default of --zoo=all).
TRAIN_SAMPLE = ("gpt2", "llama", "vit", "resnet", "convnext", "poolformer", "wav2vec2")


def _full(config: pytest.Config) -> bool:
    return bool(config.getoption("--full", default=False))


def _available(name: str, request: pytest.FixtureRequest) -> None:
    sample = request.config.getoption("--zoo", default="sample") == "sample" and not _full(request.config)
    if sample and name not in DEFAULT_MODELS:
        pytest.skip("not in the default sample (DEFAULT_MODELS): --zoo=all runs it")
    reason = ZOO[name].available()
    if reason is not None:
        pytest.skip(reason)


def _fuse_compiled_something() -> None:
    m = fusebackend.metrics
    assert m.eager_graphs == 0, f"{m.eager_graphs} graph(s) ran eagerly (the warning above names the error)"
    assert m.graphs_compiled >= 1, "no graph reached the backend"


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_inference_matches_eager(name: str, request: pytest.FixtureRequest) -> None:
    _available(name, request)
    _inference_matches_eager(name)


# Tiny models with the GPU's launch configs in the interpreter (``config.gpu_blocks``): codegen
# then takes the paths that only a GPU's blocks reach, such as a reduction's config fitted to its
# loads and the kernel generated again, which once failed for Swin's windows on the GPU alone
# (a block start left in a load's offset: Swin V2's tiny model shows it, Swin's does not).
# Swin V2 (windowed attention), DeBERTa-v2 (rows read across) and GPT-2 by default, with the
# training steps of GPT-2 and ResNet (column sums and their splits); every model with --full.
GPU_BLOCKS_SAMPLE = ("swinv2", "deberta_v2", "gpt2")
GPU_BLOCKS_TRAIN_SAMPLE = ("gpt2", "resnet")


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_inference_in_a_gpus_blocks(name: str, request: pytest.FixtureRequest) -> None:
    _in_gpu_blocks_sample(name, GPU_BLOCKS_SAMPLE, "GPU_BLOCKS_SAMPLE", request)
    with fusebackend.config.patch(gpu_blocks=True):
        _inference_matches_eager(name)
    _launched_in_gpu_blocks()


def _in_gpu_blocks_sample(name: str, sample: tuple[str, ...], label: str, request: pytest.FixtureRequest) -> None:
    if name not in sample and not _full(request.config):
        pytest.skip(f"not in {label}: pytest --full runs it")
    reason = ZOO[name].available()
    if reason is not None:
        pytest.skip(reason)


def _launched_in_gpu_blocks() -> None:
    """Every launch of the graphs compiled carries a GPU's warps (the interpreter's configs have none)."""
    launches = [line for a in fusebackend.history() for line in a.wrapper.splitlines() if "# grid" in line]
    assert launches and all("num_warps=" in line for line in launches if "XBLOCK" in line), launches[:5]


def _inference_matches_eager(name: str) -> None:
    built = ZOO[name].build("tiny")
    model = built.model.eval()
    exact = float64_copy(model)
    compiled = torch.compile(model, backend="fuse")
    with torch.no_grad():
        expected = model(**built.inputs)
        actual = compiled(**built.inputs)
        reference = exact(**cast_inputs(built.inputs, torch.float64))
    _fuse_compiled_something()
    assert len(output_tensors(actual)) >= 1
    # an output that has faded to nothing (EfficientNet's logits were 1e-33 before its batch norms
    # were calibrated) or that is all zero (a zero-initialized head) would pass any compiled graph
    faded = {n: e.abs().max().item() for n, e in zip(output_names(expected), output_tensors(expected))
             if e.is_floating_point() and e.abs().max().item() < 1e-3}
    assert not faded, f"eager's outputs are too small for the comparison to mean anything: {faded}"
    output_error(actual, expected)  # checks the structure, shapes and dtypes
    # Each output against float64: within twice eager's distance plus OUTPUT_TOL (where eager is
    # itself far from float64, as in MobileNetV2 at 3.7e-5, eager's distance sets the bar)
    bad = {}
    for n, a, e, x in zip(output_names(expected), output_tensors(actual), output_tensors(expected),
                          output_tensors(reference)):
        if not e.is_floating_point():
            assert torch.equal(a, e), f"{n}: differs from eager"
            continue
        ours, eagers = relative_error(a, x), relative_error(e, x)
        if ours > 2 * eagers + OUTPUT_TOL:
            bad[n] = f"{ours:.3g} from float64 (eager: {eagers:.3g}; against eager {relative_error(a, e):.3g})"
    assert not bad, f"outputs further from float64 than twice eager's distance + {OUTPUT_TOL:g}: {bad}"


def _train_set(config: pytest.Config) -> tuple[tuple[str, ...], str]:
    """The models whose training step runs, and the reason the others skip."""
    which = config.getoption("--zoo-train", default=None)
    if which is None:
        every = config.getoption("--zoo", default="sample") == "all" or _full(config)
        which = "all" if every else "sample"
    if which == "core":
        return TRAIN_SET, "--zoo-train=core: not in TRAIN_SET"
    if which == "sample":
        return TRAIN_SAMPLE, "not in the default sample of training steps (TRAIN_SAMPLE): --zoo-train=all runs it"
    return tuple(ZOO), ""


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_training_step_gradients(name: str, request: pytest.FixtureRequest) -> None:
    trained, reason = _train_set(request.config)
    if name not in trained:
        pytest.skip(reason)
    _available(name, request)
    _training_step_matches_float64(name)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_training_step_in_a_gpus_blocks(name: str, request: pytest.FixtureRequest) -> None:
    _in_gpu_blocks_sample(name, GPU_BLOCKS_TRAIN_SAMPLE, "GPU_BLOCKS_TRAIN_SAMPLE", request)
    with fusebackend.config.patch(gpu_blocks=True):
        _training_step_matches_float64(name)
    _launched_in_gpu_blocks()


def _training_step_matches_float64(name: str) -> None:
    built = ZOO[name].build("tiny")
    model = built.model.train()
    eager = copy.deepcopy(model)
    exact = float64_copy(model)
    compiled = torch.compile(model, backend="fuse")
    result = training_step(model, compiled, built)
    reference = training_step(eager, eager, built)
    exact_result = training_step(exact, exact, built, torch.float64)
    _fuse_compiled_something()
    names = [a.name for a in fusebackend.history()]
    assert any(n.startswith("backward") for n in names), f"no backward graph compiled by fuse: {names}"
    assert set(result.grads) == set(exact_result.grads), "parameters with gradients differ from float64's"
    distances = gradient_distances(result, reference, exact_result, GRAD_ATOL)
    distances += buffer_distances(result, reference, exact_result, GRAD_ATOL)
    bad = sorted((d for d in distances if not d.ok), key=lambda d: -d.ratio)
    worst = max(distances, key=lambda d: d.ratio)
    assert not bad, (f"{len(bad)} of {len(distances)} tensors further from float64 than twice eager "
                     f"+ {GRAD_ATOL:g} x largest gradient; worst first:\n  " + "\n  ".join(str(d) for d in bad[:8]))
    assert worst.ratio <= 1.0


@pytest.mark.parametrize("name", ["wav2vec2", "sd_vae_decoder", "tv_resnet50", "tv_deeplabv3_resnet50",
                                  "timm_convnext_tiny"])
def test_zoo_loss_follows_a_narrowed_batch(name: str) -> None:
    """A model whose loss holds its own targets (not in ``train_inputs``) still has a loss after the
    runner's ``--batch`` cuts its inputs (``spec.narrow``): eager, batch 1, in eval mode (batch norm
    cannot normalize one value per channel in train mode)."""
    reason = ZOO[name].available()
    if reason is not None:
        pytest.skip(reason)
    built = narrow(ZOO[name].build("tiny"), batch=1)
    with torch.no_grad():
        loss = built.loss(built.model.eval()(**built.train_inputs))
    assert loss.dim() == 0 and loss.isfinite(), loss


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_zoo_runner_tiny_smoke(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m benchmarks.zoo --tiny`` on one model in both modes: eager and fuse, checked and
    timed, a table, the JSON and the chart; then ``--chart-from`` renders the chart again from the
    JSON alone."""
    from benchmarks.zoo import run

    # --keep-caches: the kernels compiled by the tests above, in the test session's cache
    rows = run.main(["--tiny", "--models", "gpt2", "--out", str(tmp_path), "--repeats", "1", "--keep-caches"])
    assert [(r.model, r.mode) for r in rows] == [("gpt2", "inference"), ("gpt2", "train")]
    for row in rows:
        assert row.status == "ok", row
        assert [v.variant for v in row.variants] == ["eager", "fuse"]
        f = row.fuse
        assert f is not None and f.status == "ok" and f.eager_graphs == 0, f
        assert f.error is not None and f.error <= OUTPUT_TOL, f
        assert f.kernels and f.first_call_s and f.first_call_s > 0, f
        # the first call by stage: torch.compile() itself, fuse's own, Triton's first launches,
        # and the rest of the call
        stages = {"torch.compile", "aot", "lower", "schedule", "codegen", "triton", "launch", "other"}
        assert stages <= set(f.compile_stages), f
        assert sum(f.compile_stages.values()) == pytest.approx(f.first_call_s, abs=0.01), f
        for v in row.variants:
            assert v.median_ms is not None and v.median_ms > 0, v
            assert v.round_ms == [v.median_ms], v  # one timing round on a CPU
            assert v.host_ms is not None and 0 < v.host_ms < float("inf"), v
            # on a CPU: no GPU time, no device memory, no launches
            assert v.gpu_ms is None and v.peak_mib is None and v.launches is None, v
        assert f.speedup is not None and f.speedup == pytest.approx(row.eager.median_ms / f.median_ms)
        assert f.slow_launches == {}  # the interpreter launches through Triton, and counts nothing
        assert f.layout_copies == 0
    saved = json.loads((tmp_path / "zoo_tiny.json").read_text())
    assert [(r["model"], r["mode"]) for r in saved["rows"]] == [("gpt2", "inference"), ("gpt2", "train")]
    assert saved["environment"]["modes"] == ["inference", "train"]
    assert all(v["host_ms"] > 0 for r in saved["rows"] for v in r["variants"])
    assert "| gpt2 | train |" in (tmp_path / "zoo_tiny.md").read_text()
    stages = [line for line in (tmp_path / "zoo_tiny.md").read_text().splitlines() if line.startswith("- gpt2 (train), fuse: ")]
    assert len(stages) == 1 and " lower " in stages[0] and "(0 graphs from the cache, " in stages[0], stages
    assert (tmp_path / "zoo_tiny.png").read_bytes()[:8] == PNG_MAGIC
    assert "geomean speedup over eager, all: fuse" in capsys.readouterr().out

    again = tmp_path / "again"
    charted = run.main(["--chart-from", str(tmp_path / "zoo_tiny.json"), "--out", str(again)])
    assert [(r.model, r.mode, r.fuse.speedup) for r in charted] == [(r.model, r.mode, r.fuse.speedup) for r in rows]
    assert (again / "zoo_tiny.png").read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in again.iterdir()) == ["zoo_tiny.png"]  # nothing run, nothing else written


def _row(model: str, mode: str, fuse: float | None, inductor: float) -> "ZooRow":
    from benchmarks.zoo.run import VariantStats, ZooRow

    variants = [VariantStats("eager", "ref", median_ms=10.0, speedup=1.0, host_ms=1.0),
                VariantStats("inductor", median_ms=10.0 / inductor, speedup=inductor, first_call_s=5.0)]
    variants.append(VariantStats("fuse", "error", message="RuntimeError: boom") if fuse is None
                    else VariantStats("fuse", median_ms=10.0 / fuse, speedup=fuse, first_call_s=3.0))
    return ZooRow(model, mode, "b2 s16", variants=variants)


def test_zoo_report_merges_saved_runs(tmp_path: pathlib.Path) -> None:
    """Results saved by separate runs (separate GPU processes) make one set of rows, one summary
    and one chart; a model and mode saved twice keeps the later file's row."""
    from benchmarks.zoo import chart, report

    env = {"device": "GPU A", "dtype": "bfloat16", "size": "real", "modes": ["inference"]}
    report.write([_row("gpt2", "inference", 2.0, 4.0), _row("bert", "inference", 9.0, 9.0)], env,
                 str(tmp_path / "a"), "zoo_inference")
    report.write([_row("bert", "inference", 0.5, 1.0), _row("resnet", "train", None, 2.0)],
                 dict(env, device="GPU B", modes=["train"]), str(tmp_path / "b"), "zoo")
    notes: list[str] = []
    rows, merged = report.load([str(tmp_path / "a" / "zoo_inference.json"), str(tmp_path / "b" / "zoo.json")],
                               log=notes.append)
    assert [(r.model, r.mode) for r in rows] == [("gpt2", "inference"), ("bert", "inference"), ("resnet", "train")]
    assert rows[1].fuse.speedup == 0.5 and len(notes) == 1 and "bert (inference)" in notes[0]
    assert rows[2].fuse.status == "error" and rows[2].fuse.speedup is None
    assert merged["device"] == "GPU A / GPU B" and merged["dtype"] == "bfloat16"
    assert merged["modes"] == ["inference", "train"]
    assert report.stem(merged["size"], merged["modes"]) == "zoo"
    # fuse: 2 and 0.5 (its training step failed); Inductor: 4, 1 and 2
    assert report.geomean(report.speedups(rows, "fuse")) == pytest.approx(1.0)
    assert report.geomean(report.speedups(rows, "inductor")) == pytest.approx(2.0)
    text = report.summary(rows)
    assert "all: fuse 1.00x over 2, Inductor 2.00x over 3" in text
    assert "fuse slower than Inductor in 2: gpt2 (inference) 2.00x vs 4.00x, bert (inference) 0.50x vs 1.00x" in text
    plain = report.table(rows)
    assert "peak MiB" not in plain and "cold compile s i/f" in plain  # nothing measured: no column
    assert "resnet (train) fuse: RuntimeError: boom" in plain
    path = chart.render(rows, merged, str(tmp_path / "zoo.png"))
    assert path is not None and pathlib.Path(path).read_bytes()[:8] == PNG_MAGIC
    untimed = [_row("gpt2", "inference", 1.0, 1.0)]
    for v in untimed[0].variants:
        v.speedup = v.median_ms = None
    assert chart.render(untimed, merged, str(tmp_path / "none.png")) is None
    assert not (tmp_path / "none.png").exists()


def test_chart_from_a_list_gives_each_row_its_file(tmp_path: pathlib.Path) -> None:
    """``--chart-from runs.txt``: the JSON files a list names, oldest first, relative to the list;
    the later file's row is kept, and ``zoo_sources.md`` names the file of each row."""
    from benchmarks.zoo import report, run

    env = {"device": "GPU A", "dtype": "bfloat16", "size": "real", "modes": ["inference"]}
    report.write([_row("gpt2", "inference", 2.0, 4.0), _row("bert", "inference", 9.0, 9.0)], env,
                 str(tmp_path / "old"), "zoo_inference")
    report.write([_row("bert", "inference", 3.0, 2.0)], env, str(tmp_path / "new"), "zoo_inference")
    listing = tmp_path / "current.txt"
    listing.write_text("# oldest first\nold/zoo_inference.json\n\nnew/zoo_inference.json  # the rerun\n")
    rows = run.main(["--chart-from", str(listing), "--out", str(tmp_path / "out")])
    assert [(r.model, r.fuse.speedup) for r in rows] == [("gpt2", 2.0), ("bert", 3.0)]
    assert (tmp_path / "out" / "zoo_inference.png").read_bytes()[:8] == PNG_MAGIC
    table = (tmp_path / "out" / "zoo_inference_sources.md").read_text().splitlines()
    assert table[2] == "| gpt2 | inference | b2 s16 | 10 | 2.5 | 5 | 0.50x | - | old/zoo_inference.json |", table
    assert table[3] == "| bert | inference | b2 s16 | 10 | 5 | 3.333 | 1.50x | - | new/zoo_inference.json |", table
    # fuse 2x and 3x over eager, Inductor 4x and 2x; fuse / Inductor 0.5 and 1.5
    assert table[-1] == ("2 rows; geometric mean over eager: fuse 2.45x, Inductor 2.83x; fuse / Inductor 0.87x "
                         "over the 2 rows both timed."), table
    with pytest.raises(SystemExit, match="no such file"):
        listing.write_text("old/zoo_inference.json\nmissing.json\n")
        run.main(["--chart-from", str(listing)])


def test_each_model_in_processes_of_its_own(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--parallel 2 --processes 2``: the model in two child processes at once, each run written
    as the zoo writes one (``_p1``, ``_p2``), and fuse over Inductor per process."""
    from benchmarks.zoo import run

    rows = run.main(["--tiny", "--models", "bert", "--mode", "inference", "--parallel", "2", "--processes", "2",
                     "--repeats", "1", "--out", str(tmp_path)])
    assert [(r.model, r.mode, r.status) for r in rows] == [("bert", "inference", "ok")]
    for p in (1, 2):
        saved = json.loads((tmp_path / f"zoo_tiny_inference_p{p}.json").read_text())
        assert [(r["model"], r["status"]) for r in saved["rows"]] == [("bert", "ok")]
        assert saved["environment"]["process"] == p and "partial" not in saved["environment"]  # the last write
        fuse = next(v for v in saved["rows"][0]["variants"] if v["variant"] == "fuse")
        assert fuse["eager_graphs"] == 0 and fuse["error"] <= OUTPUT_TOL
        assert (tmp_path / "processes" / f"bert_inference_p{p}" / "log.txt").exists()
        assert (tmp_path / f"zoo_tiny_inference_p{p}.png").read_bytes()[:8] == PNG_MAGIC
    assert "| bert | inference | - | - | - |" in capsys.readouterr().out  # no Inductor in a tiny CPU run


def test_processes_table_and_arguments() -> None:
    from benchmarks.zoo import parallel

    assert parallel.child_arguments(["--models", "a,b", "--tiny", "--out=x", "--parallel", "2", "--processes", "3",
                                     "--train", "--rep-ms", "50", "--mode", "both"]) == ["--tiny", "--rep-ms", "50"]
    # staggered: a model's second process right after its first, so a run cut short has both of
    # every model but the last
    items = [("a", "inference"), ("b", "inference"), ("c", "train")]
    assert parallel.job_order(items, 2) == [(1, "a", "inference"), (2, "a", "inference"), (1, "b", "inference"),
                                            (2, "b", "inference"), (1, "c", "train"), (2, "c", "train")]
    order = parallel.job_order(items, 3)
    assert sorted(order) == sorted((p, *item) for p in (1, 2, 3) for item in items)
    assert order[:4] == [(1, "a", "inference"), (2, "a", "inference"), (1, "b", "inference"), (3, "a", "inference")]
    runs = [[_row("gpt2", "inference", 2.0, 4.0), _row("bert", "train", None, 1.0)],
            [_row("gpt2", "inference", 3.0, 2.0), _row("bert", "train", 1.0, 1.0)]]
    lines = parallel.table(runs).splitlines()
    assert lines[0] == "| model | mode | process 1 | process 2 | lowest |"
    assert lines[2] == "| gpt2 | inference | 0.50x | 1.50x | 0.50x |"
    assert lines[3] == "| bert | train | - | 1.00x | 1.00x |"


def test_relative_error_a_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # compared in chunks (the harness's float64 copies of 4 GiB logits would not fit a GPU):
    # the same value as one pass, the largest difference and magnitude in different chunks,
    # and NaN or infinity positions that differ in a later chunk still make it inf
    from benchmarks.zoo import compare

    expected = torch.randn(7, 13, dtype=torch.bfloat16)
    actual = expected.float() + 1e-3 * torch.randn(7, 13)
    actual[6, 12] += 0.5
    expected[0, 0] = 40.0
    whole = compare.relative_error(actual, expected)
    monkeypatch.setattr(compare, "_CHUNK", 10)
    assert compare.relative_error(actual, expected) == whole
    assert whole == pytest.approx((actual - expected.float()).abs().max().item() / 40.0, rel=1e-6)
    actual[5, 0] = float("nan")
    assert compare.relative_error(actual.t(), expected.t()) == float("inf")


def test_the_float64_copy_of_a_mixture_of_experts_runs_its_experts_as_a_loop() -> None:
    # transformers' grouped products over experts (torch._grouped_mm) take no float64: the copy
    # that judges the others runs the loop over experts, the same function; the model keeps its
    # default, which the compiled run takes
    built = ZOO["mixtral"].build("tiny")
    model = built.model.eval()
    exact = float64_copy(model)
    with torch.no_grad():
        out = exact(**cast_inputs(built.inputs, torch.float64))
        want = model(**built.inputs)
    assert out.logits.dtype == torch.float64
    assert relative_error(want.logits, out.logits) < 1e-4
    assert model.config._experts_implementation != "eager"
    assert exact.config._experts_implementation == "eager"
