"""torch.compile's ``mode=`` and ``options=`` under fuse (``modes.py``): CUDA graphs in
reduce-overhead (``cudagraphs.py``) and launch configurations timed in max-autotune
(``kernels/autotune.py``).

On the CPU: the modes parsed and passed through, graphs that cannot be captured run uncaptured
with one line each in the metrics, the autotuning candidates generated, each of them right, and
the choice written to disk and read back. On a GPU (``FUSE_TEST_DEVICE=cuda`` or any machine
with CUDA): replays against plain launches, forward and training step, with inputs whose address
changes.
"""

from __future__ import annotations

import copy
import glob
import json
import os
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import fusebackend
from fusebackend.kernels import autotune
from fusebackend.modes import Mode
from helpers import FULL

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _norm_after_gelu(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(F.gelu(x @ w), (w.shape[1],)).sum(-1) + x.mean()


# -- modes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, options, expected", [
    (None, None, Mode()),
    ("default", None, Mode()),
    ("reduce-overhead", None, Mode(cudagraphs=True)),
    ("max-autotune-no-cudagraphs", None, Mode(autotune=True)),
    ("max-autotune", None, Mode(cudagraphs=True, autotune=True)),
    (None, {"cudagraphs": True}, Mode(cudagraphs=True)),
    (None, {"triton.cudagraphs": True}, Mode(cudagraphs=True)),
    (None, {"max_autotune": True}, Mode(autotune=True)),
    ("max-autotune", {"cudagraphs": False}, Mode(autotune=True)),  # options win over the mode
])
def test_modes_and_options_are_parsed(mode: str | None, options: dict[str, Any] | None, expected: Mode) -> None:
    assert Mode.parse(mode, options) == expected


@pytest.mark.parametrize("mode, options, message", [
    ("fast", None, "unknown mode 'fast'"),
    (None, {"cuda_graphs": True}, "unknown option 'cuda_graphs'"),
    (None, {"cudagraphs": 1}, "takes True or False"),
])
def test_an_unknown_mode_or_option_raises_naming_the_known_ones(mode: str | None, options: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        Mode.parse(mode, options)
    assert "reduce-overhead" in str(info.value) or "cudagraphs" in str(info.value)


def test_torch_compile_hands_fuse_its_mode() -> None:
    x, w = torch.randn(37, 48), torch.randn(48, 40)
    with pytest.raises(Exception, match="unknown mode 'fastest'"):
        torch.compile(_norm_after_gelu, backend="fuse", mode="fastest")(x, w)
    torch._dynamo.reset()
    torch.compile(_norm_after_gelu, backend="fuse", mode="max-autotune-no-cudagraphs")(x, w)
    assert fusebackend.last_compiled().autotune  # the kernels timed their candidates


def test_the_default_mode_generates_no_candidates() -> None:
    x, w = torch.randn(37, 48), torch.randn(48, 40)
    out = torch.compile(_norm_after_gelu, backend="fuse")(x, w)
    torch.testing.assert_close(out, _norm_after_gelu(x, w))
    artifacts = fusebackend.last_compiled()
    assert not artifacts.autotune and "== autotune ==" not in str(artifacts)


# -- reduce-overhead on the CPU: uncaptured, one line each ----------------------------------------


@pytest.mark.skipif(torch.cuda.is_available() and torch.get_default_device().type == "cuda",
                    reason="CPU tensors")
def test_cpu_graphs_run_uncaptured_with_one_line_each() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    reference = copy.deepcopy(model)
    x = torch.randn(5, 16, requires_grad=True)
    compiled = torch.compile(model, backend="fuse", mode="reduce-overhead")
    out = compiled(x)
    out.sum().backward()
    expected = reference(x.detach().requires_grad_())
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    why = fusebackend.metrics.uncaptured
    assert sorted(k.split("_")[0] for k in why) == ["backward", "forward"], why
    forward = next(v for k, v in why.items() if k.startswith("forward"))
    backward = next(v for k, v in why.items() if k.startswith("backward"))
    assert "cpu device" in forward and "\n" not in forward
    assert backward == "its forward graph runs uncaptured"
    assert fusebackend.metrics.eager_graphs == 0


# -- max-autotune ------------------------------------------------------------------------------


def test_candidates_vary_blocks_and_are_generated_for_them() -> None:
    x, w = torch.randn(64, 96), torch.randn(96, 200)
    torch.compile(_norm_after_gelu, backend="fuse", mode="max-autotune-no-cudagraphs")(x, w)
    text = fusebackend.last_compiled().autotune
    assert any(k.startswith("fused_red") for k in text)
    lines = max((t.splitlines() for t in text.values()), key=len)
    assert lines[0].lstrip().startswith("heuristic: XBLOCK=") and len(lines) >= 3
    assert sum("<- chosen" in line for line in lines) == 1
    assert len({line.split(":")[1] for line in lines}) == len(lines)  # each a configuration of its own


def _forcing(pick: Callable[[int], int]) -> Callable[..., tuple[float, float]]:
    """A ``Tuner._time`` that still launches each candidate but times ``pick(count)``'s fastest,
    so that a candidate other than the heuristic's is kept and then computes the results."""

    real = autotune.Tuner._time

    def fake(self: autotune.Tuner, launcher: Any, stream: Any, args: Any) -> tuple[float, float]:
        real(self, launcher, stream, args)
        k = self.choices.index(launcher)
        took = 0.0 if k == pick(len(self.choices)) else 1.0 + k
        return took, took

    return fake


# (the second candidate runs the same path with other blocks: pytest --full)
@pytest.mark.parametrize("pick", [pytest.param(lambda n: n - 1, id="last"),
                                  pytest.param(lambda n: min(1, n - 1), id="second", marks=FULL)])
def test_a_training_step_is_right_with_any_candidate_chosen(monkeypatch: pytest.MonkeyPatch,
                                                           pick: Callable[[int], int]) -> None:
    """Gradients and batch norm's running statistics (written in place: a candidate timed must not
    update them again) with a candidate other than the heuristic's in every tuned kernel."""
    monkeypatch.setattr(autotune.Tuner, "_time", _forcing(pick))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.BatchNorm1d(48), torch.nn.GELU(),
                                torch.nn.Linear(48, 48), torch.nn.LayerNorm(48), torch.nn.Softmax(-1))
    reference = copy.deepcopy(model).double()
    x = torch.randn(70, 24)
    compiled = torch.compile(model, backend="fuse", mode="max-autotune-no-cudagraphs")
    loss = (compiled(x) ** 2).sum()
    loss.backward()
    eager_loss = (reference(x.double()) ** 2).sum()
    eager_loss.backward()
    torch.testing.assert_close(loss.double(), eager_loss, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model[1].running_mean.double(), reference[1].running_mean)
    torch.testing.assert_close(model[1].running_var.double(), reference[1].running_var)
    tuned = [a.autotune for a in fusebackend.history() if a.autotune]
    assert tuned and all("<- chosen" in t and "heuristic" in t for each in tuned for t in each.values())
    chosen = [line for each in tuned for t in each.values() for line in t.splitlines() if "<- chosen" in line]
    assert not any(line.lstrip().startswith("heuristic") for line in chosen)  # candidates computed it
    assert fusebackend.metrics.eager_graphs == 0


def _tiles_scans_scatters(x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
    transposed = (y.t() * 2 + 1).contiguous()  # a transposing tile
    scanned = torch.cumsum(x * 3, dim=1)  # a scan, its row longer than the interpreter's blocks
    added = torch.zeros(8, x.shape[1]).index_add_(0, idx, x.sin())  # a scatter (atomic adds)
    return transposed, scanned, added


# (the second candidate runs the same path with other blocks: pytest --full)
@pytest.mark.parametrize("pick", [pytest.param(lambda n: n - 1, id="last"),
                                  pytest.param(lambda n: min(1, n - 1), id="second", marks=FULL)])
def test_tiles_scans_and_scatters_are_tuned_and_right(monkeypatch: pytest.MonkeyPatch,
                                                      pick: Callable[[int], int]) -> None:
    monkeypatch.setattr(autotune.Tuner, "_time", _forcing(pick))
    x, y, idx = torch.randn(64, 72), torch.randn(48, 80), torch.randint(0, 8, (64,))
    out = torch.compile(_tiles_scans_scatters, backend="fuse", mode="max-autotune-no-cudagraphs")(x, y, idx)
    for got, expected in zip(out, _tiles_scans_scatters(x, y, idx)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    artifacts = fusebackend.last_compiled()
    sources = "\n".join(artifacts.kernels.values())
    assert "tiled:" in sources and "tl.atomic_add" in sources
    tuned = "\n".join(artifacts.autotune.values())
    assert "YBLOCK=" in tuned  # the tile's candidates
    assert {k.split("_")[1].rstrip("0123456789") for k in artifacts.autotune} >= {"pw", "scan", "scatter"}
    assert fusebackend.metrics.eager_graphs == 0


class _Source:
    """What ``autotune.candidates`` reads of a generated kernel."""

    def __init__(self, launch: dict[str, int], sizes: tuple[int, ...]) -> None:
        self.launch, self.sizes = launch, sizes


def test_a_looped_kernel_on_a_gpu_tries_other_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(autotune, "use_interpreter", lambda: False)
    looped = autotune.candidates(_Source({"XBLOCK": 1, "RBLOCK": 4096, "num_warps": 16}, (64, 65536)))
    assert [c["num_stages"] for c in looped if "num_stages" in c] == list(autotune.STAGES)
    assert all(c["RBLOCK"] * c["XBLOCK"] <= autotune.MAX_BLOCK and c["num_warps"] <= autotune.MAX_WARPS for c in looped)
    persistent = autotune.candidates(_Source({"XBLOCK": 4, "RBLOCK": 256, "num_warps": 2}, (1000, 256)))
    assert persistent and not any("num_stages" in c for c in persistent)  # no loop to pipeline
    assert {"XBLOCK": 8, "RBLOCK": 256, "num_warps": 2} in persistent
    assert not any(c["RBLOCK"] > 256 for c in persistent)  # a block within its extent
    tile = autotune.candidates(_Source({"XBLOCK": 64, "YBLOCK": 16, "num_warps": 4}, (4096,)))
    assert {"XBLOCK": 64, "YBLOCK": 32, "num_warps": 4} in tile and {"XBLOCK": 32, "YBLOCK": 16, "num_warps": 4} in tile


def test_the_heuristic_stays_unless_a_candidate_is_clearly_faster(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Any) -> None:
    """A candidate must beat the heuristic by ``MARGIN`` from memory and from the L2 cache."""
    def timed(cold: float, warm: float) -> Callable[..., tuple[float, float]]:
        def fake(self: autotune.Tuner, launcher: Any, stream: Any, args: Any) -> tuple[float, float]:
            return (100.0, 50.0) if self.choices.index(launcher) == 0 else (100.0 * cold, 50.0 * warm)
        return fake

    x, w = torch.randn(37, 48), torch.randn(48, 40)
    close, clear = 1 - autotune.MARGIN / 2, 1 - 2 * autotune.MARGIN
    cases = [(close, clear, True), (clear, close, True), (clear, 1.2, True), (clear, clear, False)]
    for k, (cold, warm, heuristic) in enumerate(cases):
        torch._dynamo.reset()
        monkeypatch.setattr(autotune.Tuner, "_time", timed(cold, warm))
        with fusebackend.config.patch(graph_cache=False, cache_dir=str(tmp_path / str(k))):
            out = torch.compile(_norm_after_gelu, backend="fuse", mode="max-autotune-no-cudagraphs")(x, w)
        torch.testing.assert_close(out, _norm_after_gelu(x, w))
        chosen = [line for t in fusebackend.last_compiled().autotune.values() for line in t.splitlines()
                  if "<- chosen" in line]
        assert chosen and all(line.lstrip().startswith("heuristic") == heuristic for line in chosen), (k, chosen)


def test_the_choice_is_written_to_disk_and_read_back(tmp_path: Any) -> None:
    x, w = torch.randn(37, 48), torch.randn(48, 40)
    expected = _norm_after_gelu(x, w)
    with fusebackend.config.patch(cache_dir=str(tmp_path)):
        out = torch.compile(_norm_after_gelu, backend="fuse", mode="max-autotune-no-cudagraphs")(x, w)
        first = dict(fusebackend.last_compiled().autotune)
        files = sorted(glob.glob(os.path.join(str(tmp_path), "autotune", "*.json")))
        assert len(files) == len(first) > 0
        record = json.load(open(files[0]))
        assert set(record) == {"chosen", "times_us", "launches"} and len(record["times_us"]) == len(record["launches"])
        # a new process, as far as fuse is concerned: no graph in memory, none in fuse's graph
        # cache; the choice comes from disk and nothing is timed
        torch._dynamo.reset()
        with fusebackend.config.patch(graph_cache=False):
            again = torch.compile(_norm_after_gelu, backend="fuse", mode="max-autotune-no-cudagraphs")(x, w)
        second = fusebackend.last_compiled().autotune
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(again, expected)
    assert second.keys() == first.keys()
    for name, text in second.items():
        assert text.endswith("(from disk)")
        assert text.removesuffix("  (from disk)") == first[name]


def test_a_damaged_choice_is_timed_again(tmp_path: Any) -> None:
    x, w = torch.randn(37, 48), torch.randn(48, 40)
    with fusebackend.config.patch(cache_dir=str(tmp_path), graph_cache=False):
        torch.compile(_norm_after_gelu, backend="fuse", mode="max-autotune-no-cudagraphs")(x, w)
        for path in glob.glob(os.path.join(str(tmp_path), "autotune", "*.json")):
            with open(path, "w") as f:
                f.write("{not json")
        torch._dynamo.reset()
        out = torch.compile(_norm_after_gelu, backend="fuse", mode="max-autotune-no-cudagraphs")(x, w)
        text = fusebackend.last_compiled().autotune
    torch.testing.assert_close(out, _norm_after_gelu(x, w))
    assert text and not any("(from disk)" in t for t in text.values())


def test_dumps_show_the_choice(tmp_path: Any) -> None:
    x, w = torch.randn(37, 48), torch.randn(48, 40)
    with fusebackend.config.patch(dump_dir=str(tmp_path / "dumps")):
        torch.compile(_norm_after_gelu, backend="fuse", mode="max-autotune-no-cudagraphs")(x, w)
    artifacts = fusebackend.last_compiled()
    with open(os.path.join(artifacts.dump_path, "autotune.txt")) as f:
        dumped = f.read()
    for name in artifacts.autotune:
        assert f"{name}:" in dumped
    assert "<- chosen" in dumped and " us" in dumped
    assert "== autotune ==" in str(artifacts)


# -- reduce-overhead on a GPU ------------------------------------------------------------------


def _recordings() -> int:
    """CUDA graphs recorded by the trees of device 0 so far."""
    from torch._inductor.cudagraph_trees import get_manager

    manager = get_manager(0, create_if_none_exists=False)
    if manager is None:
        return 0
    nodes, count = list(manager.get_roots()), 0
    while nodes:
        node = nodes.pop()
        count += 1
        nodes += [child for children in node.children.values() for child in children]
    return count


@cuda
def test_replays_match_plain_launches_with_inputs_that_move() -> None:
    w = torch.randn(64, 80, device="cuda")
    plain = torch.compile(_norm_after_gelu, backend="fuse")
    replayed = torch.compile(_norm_after_gelu, backend="fuse", mode="reduce-overhead")
    for _ in range(5):
        x = torch.randn(33, 64, device="cuda")  # a new tensor: a new address each call
        expected = plain(x, w)
        out = replayed(x, w).clone()
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(out, _norm_after_gelu(x, w), rtol=1e-4, atol=1e-4)
    assert _recordings() == 1 and not fusebackend.metrics.uncaptured
    replayed(torch.randn(50, 64, device="cuda"), w)  # a new size: a new recording
    x = torch.randn(50, 64, device="cuda")
    torch.testing.assert_close(replayed(x, w).clone(), plain(x, w))
    assert _recordings() == 2


@cuda
def test_training_steps_replay_forward_and_backward() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.GELU(),
                                torch.nn.Linear(64, 16), torch.nn.LayerNorm(16)).cuda()
    twin = copy.deepcopy(model)
    replayed = torch.compile(model, backend="fuse", mode="reduce-overhead")
    plain = torch.compile(twin, backend="fuse")
    opt, twin_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(twin.parameters(), lr=0.1)
    for step in range(4):
        x = torch.randn(40, 32, device="cuda")
        target = torch.randn(40, 16, device="cuda")
        torch.compiler.cudagraph_mark_step_begin()
        loss = F.mse_loss(replayed(x), target)
        loss.backward()
        twin_loss = F.mse_loss(plain(x), target)
        twin_loss.backward()
        torch.testing.assert_close(loss, twin_loss)
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        opt.step()  # parameters change in place: the replays must read their new values
        twin_opt.step()
        opt.zero_grad(set_to_none=True)
        twin_opt.zero_grad(set_to_none=True)
    torch.testing.assert_close(model[1].running_mean, twin[1].running_mean)  # written in place by the graph
    torch.testing.assert_close(model[1].running_var, twin[1].running_var)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q)
    assert _recordings() >= 2 and not fusebackend.metrics.uncaptured  # forward and backward


@cuda
def test_a_graph_writing_into_a_user_input_stays_right() -> None:
    def bump(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * y

    compiled = torch.compile(bump, backend="fuse", mode="reduce-overhead")
    for _ in range(3):
        x, y = torch.randn(100, device="cuda"), torch.randn(100, device="cuda")
        x0 = x.clone()
        out = compiled(x, y).clone()
        torch.testing.assert_close(x, x0 + 1)
        torch.testing.assert_close(out, (x0 + 1) * y)


def test_the_summary_adds_up_the_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(autotune.Tuner, "_time", _forcing(lambda n: n - 1))
    x, w = torch.randn(37, 48), torch.randn(48, 40)
    torch.compile(_norm_after_gelu, backend="fuse", mode="max-autotune-no-cudagraphs")(x, w)
    reports = fusebackend.last_compiled().autotune
    totals = autotune.summary(reports)
    assert totals["kernels"] == totals["changed"] == len(reports) > 0  # the last candidate everywhere
    assert totals["chosen_us"] == 0.0 and totals["heuristic_us"] == len(reports) * 1.0  # _forcing's times
    assert autotune.summary({"k": autotune.report_text([{"XBLOCK": 8}], None, 0)})["kernels"] == 0  # not timed
