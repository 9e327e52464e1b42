"""The fusion report and the cost model: byte counts computed by hand, refusals and their reasons.

Two ways in: the scheduler directly (``lowering.lower`` on a graph made by ``make_fx`` with the
backend's decomposition table, then ``scheduler.schedule``), which gives exact byte counts, and the
text report of a compiled graph (``fusebackend.last_compiled().schedule``) and of
``fusebackend.explain``, which prints them rounded to two decimals of KiB/MiB.

Cost model (``scheduler/cost_model.py``): a kernel reads each external buffer's distinct elements
once and writes each buffer read outside it or returned; the floor is every graph input read once
plus every output written once.
"""

from __future__ import annotations

import math
import os
import re
import sys
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import fusebackend
from fusebackend import decompositions, ir, lowering, scheduler
from helpers import assert_same, check, compile_fn, kernel_count, run_together

X_BYTES = 64 * 128 * 4  # fp32 x of shape (64, 128)
ROW_BYTES = 64 * 4  # one fp32 value per row
VEC_BYTES = 128 * 4  # w or b of shape (128,)


def schedule_of(fn: Callable[..., Any], *args: torch.Tensor) -> scheduler.Schedule:
    """Lower ``fn``'s decomposed ATen graph for ``args``, verify the IR and schedule it."""
    gm = make_fx(fn, decomposition_table=decompositions.decomposition_table())(*args)
    graph, moved = lowering.lower(gm, list(args), "g")
    assert moved == []
    ir.verify(graph)
    return scheduler.schedule(graph)


def x64() -> torch.Tensor:
    return torch.randn(64, 128)


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * _UNITS[unit]


KERNEL_LINE = re.compile(
    r"^\s*kernel (\d+): (.+?)\s+\| read ([\d.]+ \w+), write ([\d.]+ \w+)\s+\| stores (.+)$", re.M
)


def report_kernels(report: str) -> list[tuple[int, float, float]]:
    """(index, bytes read, bytes written) for each kernel line of a schedule report."""
    return [(int(m[1]), parse_bytes(m[3]), parse_bytes(m[4])) for m in KERNEL_LINE.finditer(report)]


def close_to(reported: float, exact: int) -> bool:
    """A byte count printed with two decimals of its unit matches the exact one."""
    unit = max((u for u in _UNITS.values() if exact >= u), default=1)
    return abs(reported - exact) <= 0.005 * unit + 1e-9


# ---------------------------------------------------------------- exact bytes, by hand


def test_scaled_row_sum_bytes() -> None:
    sched = schedule_of(lambda x: (x * 2).sum(-1), x64())
    assert len(sched.kernels) == 1
    k = sched.kernels[0]
    assert (k.bytes_read, k.bytes_written) == (X_BYTES, ROW_BYTES)
    assert sched.floor_bytes == X_BYTES + ROW_BYTES
    assert sched.total_bytes == sched.floor_bytes
    # fusing the multiply into the sum saves writing and reading the (64, 128) intermediate
    assert [(d.kind, d.bytes_saved) for d in sched.decisions] == [("vertical", 2 * X_BYTES)]
    assert sched.refusals == ()


def test_scaled_row_sum_unfused_bytes() -> None:
    with fusebackend.config.patch(fusion=False):
        sched = schedule_of(lambda x: (x * 2).sum(-1), x64())
    assert [(k.bytes_read, k.bytes_written) for k in sched.kernels] == [(X_BYTES, X_BYTES), (X_BYTES, ROW_BYTES)]
    assert sched.total_bytes == 3 * X_BYTES + ROW_BYTES
    assert sched.floor_bytes == X_BYTES + ROW_BYTES
    assert sched.decisions == ()


def test_gelu_affine_bytes() -> None:
    x, w, b = x64(), torch.randn(128), torch.randn(128)
    sched = schedule_of(lambda x, w, b: F.gelu(x * w + b), x, w, b)
    assert len(sched.kernels) == 1
    k = sched.kernels[0]
    assert k.bytes_read == X_BYTES + 2 * VEC_BYTES  # w and b: 128 distinct elements each, read once
    assert k.bytes_written == X_BYTES
    assert sched.floor_bytes == sched.total_bytes == 2 * X_BYTES + 2 * VEC_BYTES
    assert all(d.bytes_saved > 0 for d in sched.decisions)


def test_softmax_bytes() -> None:
    sched = schedule_of(lambda x: torch.softmax(x, -1), x64())
    assert [(k.bytes_read, k.bytes_written) for k in sched.kernels] == [(X_BYTES, X_BYTES)]
    assert sched.floor_bytes == 2 * X_BYTES
    # five nodes (amax, sub, exp, sum, div) in one kernel: four merges
    assert len(sched.kernels[0].nodes) == 5 and len(sched.decisions) == 4
    assert [b.name for b in sched.kernels[0].stored] == [sched.graph.outputs[0].buffer.name]


def test_horizontal_fusion_reads_shared_input_once() -> None:
    sched = schedule_of(lambda x: (x.sum(-1), x.amax(-1)), x64())
    assert [(k.bytes_read, k.bytes_written) for k in sched.kernels] == [(X_BYTES, 2 * ROW_BYTES)]
    assert [(d.kind, d.bytes_saved) for d in sched.decisions] == [("horizontal", X_BYTES)]


def test_var_mean_bytes() -> None:
    sched = schedule_of(lambda x: torch.var_mean(x, -1), x64())
    assert [(k.bytes_read, k.bytes_written) for k in sched.kernels] == [(X_BYTES, 2 * ROW_BYTES)]
    assert sched.total_bytes == sched.floor_bytes


def test_layer_norm_bytes() -> None:
    x, w, b = x64(), torch.randn(128), torch.randn(128)
    sched = schedule_of(lambda x, w, b: F.layer_norm(x, (128,), w, b), x, w, b)
    assert [(k.bytes_read, k.bytes_written) for k in sched.kernels] == [(X_BYTES + 2 * VEC_BYTES, X_BYTES)]


def test_refused_fusion_rows_and_columns() -> None:
    sched = schedule_of(lambda x: (x.sum(-1), x.sum(0)), x64())
    assert sorted((k.bytes_read, k.bytes_written) for k in sched.kernels) == [(X_BYTES, ROW_BYTES), (X_BYTES, VEC_BYTES)]
    assert sched.floor_bytes == X_BYTES + ROW_BYTES + VEC_BYTES
    assert sched.total_bytes == sched.floor_bytes + X_BYTES  # x is read twice
    assert len(sched.refusals) == 1
    assert "reductions differ" in sched.refusals[0].reason
    report = sched.report()
    assert "fusions refused:" in report and "reductions differ" in report


def test_reduction_input_needed_outside_is_written() -> None:
    def fn(x):
        y = x.exp()
        return y, y.sum(-1)

    sched = schedule_of(fn, x64())
    written = sum(k.bytes_written for k in sched.kernels)
    assert written == X_BYTES + ROW_BYTES
    assert sum(k.bytes_read for k in sched.kernels) >= X_BYTES
    assert sched.floor_bytes == 2 * X_BYTES + ROW_BYTES


def test_split_reduction_bytes() -> None:
    x = torch.randn(100_000)
    sched = schedule_of(lambda x: x.sum(), x)
    assert len(sched.kernels) == 2
    first, second = sched.kernels
    assert first.bytes_read == 100_000 * 4
    assert first.bytes_written == second.bytes_read  # the partial sums
    assert second.bytes_written == 4
    assert any("reductions differ" in r.reason for r in sched.refusals)


def test_half_bytes_use_the_element_size() -> None:
    sched = schedule_of(lambda x: torch.softmax(x, -1), x64().to(torch.bfloat16))
    assert [(k.bytes_read, k.bytes_written) for k in sched.kernels] == [(X_BYTES // 2, X_BYTES // 2)]


def test_matmul_is_an_extern_with_a_refusal() -> None:
    a, w = torch.randn(64, 32), torch.randn(32, 128)
    sched = schedule_of(lambda a, w: torch.softmax(a @ w, -1), a, w)
    externs = [s for s in sched.steps if isinstance(s, scheduler.ExternCall)]
    assert len(externs) == 1 and len(sched.kernels) == 1
    assert sched.kernels[0].bytes_read == X_BYTES and sched.kernels[0].bytes_written == X_BYTES
    assert any(r.reason == "extern call" for r in sched.refusals), sched.report()


def test_strided_input_counts_only_the_elements_read() -> None:
    # x[:, ::2] touches half of x: the kernel is charged for those elements only
    sched = schedule_of(lambda x: x[:, ::2].mean(-1, keepdim=True), x64())
    assert [(k.bytes_read, k.bytes_written) for k in sched.kernels] == [(X_BYTES // 2, ROW_BYTES)]


def test_broadcast_input_counts_distinct_elements() -> None:
    # a (1, 128) row broadcast over 64 rows is read as 128 elements, not 64 * 128
    sched = schedule_of(lambda x, b: (x * b).sum(-1), x64(), torch.randn(1, 128))
    assert [(k.bytes_read, k.bytes_written) for k in sched.kernels] == [(X_BYTES + VEC_BYTES, ROW_BYTES)]


# ------------------------------------------------------------ report of a compiled graph


def test_compiled_report_matches_hand_counts() -> None:
    x, w, b = x64(), torch.randn(128), torch.randn(128)
    check(lambda x, w, b: F.gelu(x * w + b), x, w, b)
    rows = report_kernels(fusebackend.last_compiled().schedule)
    assert len(rows) == 1
    _, read, written = rows[0]
    assert close_to(read, X_BYTES + 2 * VEC_BYTES) and close_to(written, X_BYTES)


def test_compiled_report_of_a_row_sum() -> None:
    check(lambda x: (x * 2).sum(-1), x64())
    art = fusebackend.last_compiled()
    assert report_kernels(art.schedule) == [(0, float(X_BYTES), float(ROW_BYTES))]
    src = next(iter(art.kernels.values()))
    assert f"reads {X_BYTES} B, writes {ROW_BYTES} B" in src
    assert "fusions taken:" in art.schedule and f"saves {2 * X_BYTES} B" in art.schedule


def test_kernel_comments_agree_with_the_schedule() -> None:
    x, r, w, b = torch.randn(4, 6, 64), torch.randn(4, 6, 64), torch.randn(64), torch.randn(64)
    sched = schedule_of(lambda x, r, w, b: (F.layer_norm(x + r, (64,), w, b), (x + r).amax(0)), x, r, w, b)
    check(lambda x, r, w, b: (F.layer_norm(x + r, (64,), w, b), (x + r).amax(0)), x, r, w, b)
    art = fusebackend.last_compiled()
    comments = [re.search(r"# reads (\d+) B, writes (\d+) B", s) for s in art.kernels.values()]
    assert all(comments)
    assert sorted((int(m[1]), int(m[2])) for m in comments) == sorted((k.bytes_read, k.bytes_written) for k in sched.kernels)


# -------------------------------------------------------------------- transformer block


class Block(nn.Module):
    """A pre-norm transformer block: matmul attention with a softmax, a GELU MLP, residuals."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h, hd = self.heads, c // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, h, hd).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(hd), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def test_transformer_block_forward_report() -> None:
    block = Block()
    x = torch.randn(2, 8, 32, requires_grad=True)
    out = compile_fn(block)(x)
    assert_same(out, block(x))
    assert fusebackend.metrics.eager_graphs == 0
    forward = [a for a in fusebackend.history() if a.name.startswith("forward")]
    assert len(forward) == 1
    report = forward[0].schedule
    rows = report_kernels(report)
    assert len(rows) == forward[0].kernel_count >= 3  # at least both layer norms and the softmax
    assert [r[0] for r in rows] == list(range(len(rows)))
    assert all(read > 0 and written > 0 for _, read, written in rows)
    assert re.search(r"extern \w+: aten\.(mm|addmm|bmm)", report), report
    refused = report.split("fusions refused:")[1] if "fusions refused:" in report else ""
    assert re.search(r"\S+ x \S+: extern call", refused), report
    m = re.search(r"graph moves ([\d.]+ \w+) .*against a floor of ([\d.]+ \w+)", report)
    assert m and parse_bytes(m[1]) >= parse_bytes(m[2]) > 0


def test_transformer_block_ir_verifies_and_schedules() -> None:
    block = Block()
    names = [n for n, _ in block.named_parameters()]
    params = [p.detach() for _, p in block.named_parameters()]

    def fn(x, *ps):
        return torch.func.functional_call(block, dict(zip(names, ps)), (x,))

    sched = schedule_of(fn, torch.randn(2, 8, 32), *params)
    assert len(sched.kernels) >= 3
    assert any(isinstance(s, scheduler.ExternCall) for s in sched.steps)
    assert all(k.bytes_read > 0 and k.bytes_written > 0 for k in sched.kernels)
    assert sched.total_bytes >= sched.floor_bytes
    assert all(r.reason for r in sched.refusals)
    assert sum(1 for line in sched.report().splitlines() if line.lstrip().startswith("kernel ")) == len(sched.kernels)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.softmax(x, -1),
        lambda x: torch.var_mean(x, (0, 1)),
        lambda x: x.transpose(0, 1).amax(-1),
        lambda x: F.group_norm(x.reshape(4, 8, 4, 32), 4),
        lambda x: (x.argmax(-1), torch.max(x, 0)),
        lambda x: x.sum(),
    ],
    ids=["softmax", "var_mean_0_1", "transposed_amax", "group_norm", "arg", "sum_all"],
)
def test_lowered_reduction_graphs_verify(fn: Callable[[torch.Tensor], Any]) -> None:
    sched = schedule_of(fn, torch.randn(16, 8, 32))
    assert sched.kernels and sched.total_bytes >= sched.floor_bytes


# ------------------------------------------------------------------------------- explain


@pytest.mark.skipif(not hasattr(fusebackend, "explain"), reason="fusebackend.explain not in the core yet")
def test_explain_reports_kernels_bytes_and_refusals() -> None:
    a, w = torch.randn(64, 32), torch.randn(32, 128)

    def fn(a, w):
        return torch.softmax(a @ w, -1)

    ex = fusebackend.explain(fn, a, w)
    assert_same(ex.result, fn(a, w))
    text = str(ex)
    rows = report_kernels(text)
    assert len(rows) == ex.kernel_count == 1
    assert close_to(rows[0][1], X_BYTES) and close_to(rows[0][2], X_BYTES)
    assert "extern" in text and "aten.mm" in text
    assert "fusions refused:" in text and "extern call" in text
    assert ex.graphs and ex.graphs[0].kernels


@pytest.mark.skipif(not hasattr(fusebackend, "explain"), reason="fusebackend.explain not in the core yet")
def test_explain_of_a_reduction_chain() -> None:
    ex = fusebackend.explain(lambda x: (x * 2).sum(-1), x64())
    assert kernel_count() == ex.kernel_count == 1
    assert report_kernels(str(ex)) == [(0, float(X_BYTES), float(ROW_BYTES))]
    assert f"saves {2 * X_BYTES} B" in str(ex)


# ------------------------------------------------------------------------------ determinism

SCHEDULE_CHILD = """
import torch, torch.nn as nn, fusebackend
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(24, 40), nn.GELU(), nn.Linear(40, 24))
loss = torch.compile(lambda x: m(x).square().mean(), backend="fuse")(torch.randn(16, 24))
loss.backward()
for graph in fusebackend.history():
    print(graph.schedule)
    print(*graph.kernels.values(), sep="\\n")
"""


def test_schedule_is_the_same_in_every_process(tmp_path: Any) -> None:
    # Sets of strings iterate in an order that changes with the hash seed of each process: no
    # fusion decision, kernel or line of the report may depend on it.
    # (the two processes run at once, each with cache folders of its own: neither loads the other's)
    runs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, FUSE_INTERPRET="1", CUDA_VISIBLE_DEVICES="",
                   FUSE_CACHE_DIR=str(tmp_path / seed), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"{seed}-inductor"))
        env.pop("FUSE_DUMP_DIR", None)
        runs.append(([sys.executable, "-c", SCHEDULE_CHILD], env))
    outputs = []
    for proc in run_together(runs, tmp_path):
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(proc.stdout)
    assert "fusions refused" in outputs[0] and "@triton.jit" in outputs[0]
    assert outputs[0] == outputs[1]


def test_a_unions_traffic_from_its_parts_is_its_traffic_from_its_nodes() -> None:
    # fusion scores each candidate's union from what its two groups read and store
    # (TrafficModel._union_traffic); a model that has seen neither group computes it from the
    # union's nodes: the same bytes and the same stored buffers, in the same order
    import random

    def fn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = F.layer_norm(x, (128,), w, b)
        z = torch.softmax(y * 2, -1)
        return z, (y + z).sum(0), x[:, ::2] * z[:, :64], torch.cumsum(z, -1)

    args = (x64(), torch.randn(128), torch.randn(128))
    gm = make_fx(fn, decomposition_table=decompositions.decomposition_table())(*args)
    graph, _ = lowering.lower(gm, list(args), "g")
    names = [n.name for n in graph.nodes]
    rng = random.Random(0)
    for _ in range(200):
        picked = rng.sample(names, rng.randint(2, len(names)))
        cut = rng.randint(1, len(picked) - 1)
        a, b = picked[:cut], picked[cut:]
        model, fresh = scheduler.TrafficModel(graph), scheduler.TrafficModel(graph)
        saved = model.bytes_saved(a, b)
        assert saved == sum(fresh.traffic(a)) + sum(fresh.traffic(b)) - sum(fresh.traffic(a + b))
        assert model.traffic(a + b) == fresh.traffic(a + b)
        assert [buf.name for buf in model.stored(a + b)] == [buf.name for buf in fresh.stored(a + b)]


def test_a_cycle_found_holds_until_a_group_on_its_path_joins_the_pair() -> None:
    # b reads a directly and through c: a and b may not merge while c stands between them
    # (Groups.cycle). The path found is kept and checked again without a search; a merge of
    # c into a leaves no path through another group, and the pair may then merge.
    from fusebackend.scheduler.groups import Groups

    def fn(x: torch.Tensor) -> torch.Tensor:
        a = x + 1
        c = torch.sigmoid(a)
        return a * c

    gm = make_fx(fn, decomposition_table=decompositions.decomposition_table())(x64())
    graph, _ = lowering.lower(gm, [x64()], "g")
    a, c, b = (n.name for n in graph.nodes)
    groups = Groups(graph)
    assert not groups.known_cycle(a, b)  # nothing found yet
    assert groups.cycle(a, b) and groups.known_cycle(a, b)
    assert groups.cycle(a, b)  # again, along the kept path
    merged = groups.merge(a, c)
    assert not groups.known_cycle(merged, b) and not groups.cycle(merged, b)


def test_refusals_of_pairs_that_can_never_merge_name_the_final_groups() -> None:
    # a pair with an extern call, or past max_fusion_size together, is set aside unscored and
    # reported between the groups its nodes end in (fusion._lasting_refusals), once each
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x) * 2 + 1
        return torch.softmax(y @ w, -1) * 3

    sched = schedule_of(fn, torch.randn(64, 32), torch.randn(32, 128))
    externs = [r for r in sched.refusals if r.reason == "extern call"]
    assert externs, sched.report()
    kernel_nodes = {k.names for k in sched.kernels}
    extern_names = {s.node.name for s in sched.steps if isinstance(s, scheduler.ExternCall)}
    for r in externs:
        sides = {r.first, r.second}
        assert any(set(side) <= extern_names for side in sides), r  # one side is the call
        assert any(side in kernel_nodes for side in sides), r  # the other a final kernel, whole
    assert len({(r.first, r.second) for r in externs}) == len(externs)
