"""The wrapper's memory plan (``codegen/memory.py``): a kernel output takes the memory of a buffer
that died before it, where that is safe and raises no planned peak; asserted on the generated
wrappers, each result compared with eager."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

import fusebackend
from helpers import assert_same, compile_fn


def wrapper() -> str:
    return fusebackend.last_compiled().wrapper


def takeovers(source: str) -> list[tuple[str, str]]:
    """(new, dead) for each output that takes a dead buffer's memory."""
    return re.findall(r"^\s*(buf\d+) = (?:view\()?(buf\d+)[,;].*# its memory", source, re.M)


def written_over(source: str) -> list[tuple[str, str]]:
    """(output, input) for each kernel output written over its kernel's dying input."""
    return re.findall(r"^\s*(buf\d+) = (?:view\()?(buf\d+)\b.*# over \2, element by element", source, re.M)


def chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # each tanh's output is read by the product after it and then dead; the next tanh's
    # output has the same size and comes after that product. Each tanh reads the product before
    # it upside down, another row than it writes, so it is never written over that product
    # (written_over)
    for _ in range(3):
        x = torch.tanh(x.flip(0)) @ w
    return torch.sigmoid(x.flip(0))


def test_an_output_takes_the_memory_of_a_dead_buffer() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(20, 20), torch.randn(20, 20) * 0.2
    out = compile_fn(chain)(x, w)
    assert_same(out, chain(x, w))
    source = wrapper()
    pairs = takeovers(source)
    assert len(pairs) >= 2, source
    for new, dead in pairs:
        # the dead buffer is not freed where it died, and the name goes with the takeover
        assert f"del {dead}" in source.split(f"{new} = ", 1)[1].splitlines()[0]
        assert not re.search(rf"^\s*del .*\b{dead}\b", source.split(f"{new} = ", 1)[0], re.M)
    summary = source.splitlines()[1]
    assert re.match(r"# memory plan: \d+ buffers allocated, \d+ take a dead buffer's memory, \d+ are written over "
                    r"their kernel's input; planned peak", summary)
    assert f"{len(pairs)} take a dead buffer's memory, 0 are written over" in summary
    assert written_over(source) == []


def test_a_pointwise_kernel_writes_over_the_input_it_reads_last_element_by_element() -> None:
    # each product's result is read once, at each element, by the kernel after it (scale, shift,
    # add, ReLU; tanh): that kernel writes its output over it, as a batch norm, residual add and
    # ReLU write over a convolution's result
    torch.manual_seed(0)
    x, w, scale, y = torch.randn(24, 40), torch.randn(40, 40) * 0.2, torch.randn(40), torch.randn(24, 40)

    def fn(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.relu((x @ w) * scale + y), torch.tanh(x @ w.t()) * 2

    out = compile_fn(fn)(x, w, scale, y)
    for got, expected in zip(out, fn(x, w, scale, y)):
        assert_same(got, expected)
    source = wrapper()
    pairs = written_over(source)
    assert len(pairs) == 2, source
    for new, old in pairs:
        launch = source.split(f"{new} = ", 1)[1].splitlines()[1]
        assert f"{old}," in launch and f"{new}," in launch  # the kernel reads one and writes the other
        assert re.search(rf"^\s*del .*\b{old}\b", source.split(launch, 1)[1], re.M)  # freed after it, by name
    assert ", 2 are written over their kernel's input" in source.splitlines()[1]
    # 3840 B a buffer: the first output and the second product, where without it the second
    # output was a third block beside them
    assert "planned peak of intermediates 7.50 KiB" in source.splitlines()[1]
    with fusebackend.config.patch(reuse_buffers=False):
        torch._dynamo.reset()
        for got, expected in zip(compile_fn(fn)(x, w, scale, y), fn(x, w, scale, y)):
            assert_same(got, expected)
    assert written_over(wrapper()) == []
    assert "planned peak of intermediates 11.25 KiB" in wrapper().splitlines()[1]


def test_no_kernel_writes_over_what_it_reads_at_other_elements() -> None:
    # a transpose and a row sum broadcast read other elements than the lane writes
    torch.manual_seed(0)
    x, w = torch.randn(16, 16), torch.randn(16, 16)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        b = x @ w.t()
        return torch.sin(b.t()) + b.sum(0)

    assert_same(compile_fn(fn)(x, w), fn(x, w))
    assert written_over(wrapper()) == [], wrapper()


def _looped(monkeypatch: pytest.MonkeyPatch, rblock: int = 64) -> None:
    """Reduction kernels over blocks of ``rblock`` elements a row: rows longer than that take the
    looped kernel (the interpreter's own blocks of 16K would need rows past 16K, seconds each)."""
    from fusebackend.kernels import runtime

    original = runtime.reduction_config

    def blocks(xnumel: int, rnumel: int, row_contiguous: bool, passes: int = 1,
               across_rows: bool = False, **kw: Any) -> dict[str, int]:
        return {**original(xnumel, rnumel, row_contiguous, passes, across_rows, **kw), "RBLOCK": rblock}

    monkeypatch.setattr(runtime, "reduction_config", blocks)


@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
def test_a_softmax_writes_over_its_scores(looped: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # each element is stored after the row's maximum and sum: a persistent kernel has read the
    # whole row by then; a looped one reads a block of it in its last pass and stores that same
    # block, after the passes that took the maximum and the sum
    if looped:
        _looped(monkeypatch)
    torch.manual_seed(0)
    x, w = torch.randn(16, 24), torch.randn(24, 200) * 0.3

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x @ w, -1) * 3

    assert_same(compile_fn(fn)(x, w), fn(x, w))
    source = wrapper()
    pairs = written_over(source)
    assert len(pairs) == 1, source
    kernel = source.split(f"{pairs[0][0]} = ", 1)[1].splitlines()[1]
    assert "fused_red" in kernel and ", 16, 200)  # grid" in kernel
    assert ("RBLOCK=64" in kernel) == looped


@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
def test_a_reduction_writes_its_prologue_over_the_input(looped: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # a batch norm, residual add and ReLU over a convolution's result, stored, and their mean
    # over each map (a global pool, as an ASPP head takes it) in one kernel: the stored result is
    # written over the product it is computed from, element by element, in the pass that also
    # sums it (DeepLabV3's last backbone block: three 128 MiB blocks live at once against
    # Inductor's two; b8 2048x64x64 bf16, H100, 2026-11-27). A variance's second pass reads the
    # product again after the first stored over it: not there.
    if looped:
        _looped(monkeypatch)
    torch.manual_seed(0)
    x, w, scale, res = torch.randn(6, 300), torch.randn(300, 200) * 0.1, torch.randn(200), torch.randn(6, 200)

    def pool(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu((x @ w) * scale + res)
        return y, y.mean(-1)

    def variance(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = x @ w
        return p * scale, torch.var(p, -1)

    for fn, over in ((pool, 1), (variance, 0 if looped else 1)):
        torch._dynamo.reset()
        for got, expected in zip(compile_fn(fn)(x, w, scale, res), fn(x, w, scale, res)):
            assert_same(got, expected)
        source = wrapper()
        assert len(written_over(source)) == over, (fn.__name__, source)
        launches = [line for line in source.splitlines() if "fused_red" in line and "# grid" in line]
        assert len(launches) == 1 and ("RBLOCK=64" in launches[0]) == looped, source


def test_the_option_turns_it_off() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(20, 20), torch.randn(20, 20) * 0.2
    with fusebackend.config.patch(reuse_buffers=False):
        out = compile_fn(chain)(x, w)
    assert_same(out, chain(x, w))
    assert takeovers(wrapper()) == [] and written_over(wrapper()) == []
    assert ", 0 take a dead buffer's memory, 0 are written over" in wrapper().splitlines()[1]


def test_a_dead_buffer_is_not_held_over_the_widest_point() -> None:
    # y1 dies at the first product; z, of y1's size, comes after the step where four times as
    # much is live. Holding y1 until z would raise the planned peak: z is allocated new.
    torch.manual_seed(0)
    x, w = torch.randn(8, 16), torch.randn(16, 16) * 0.2
    w3 = torch.randn(8, 32) * 0.2

    def fn(x: torch.Tensor, w: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
        y1 = torch.sin(x)
        e1 = y1 @ w
        big = torch.cos(e1.repeat(4, 1))  # [32, 16]
        e2 = w3 @ big  # [8, 16] again
        return torch.exp(e2)

    out = compile_fn(fn)(x, w, w3)
    assert_same(out, fn(x, w, w3))
    source = wrapper()
    assert takeovers(source) == [], source
    # without the rule the plan would have held y1: 512 B of the 3 KiB peak (e1 + big + y1)
    assert "planned peak of intermediates 2.50 KiB" in source.splitlines()[1]


def test_a_scatters_target_lives_on_as_its_result() -> None:
    # the scatter writes into y's memory, returned as the second output: nothing takes it
    def fn(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.scatter_add(x, 1, i, s)
        return torch.scatter(y, 1, i[:, :1], -s[:, :1]), y

    args = torch.randn(4, 6), torch.randint(0, 6, (4, 3)), torch.randn(4, 3)
    out = compile_fn(fn)(*args)
    for a, e in zip(out, fn(*args)):
        assert_same(a, e)
    source = wrapper()
    scattered = re.findall(r"^\s*(buf\d+) = (buf\d+)  # scattered into", source, re.M)
    assert scattered
    assert not {target for _, target in scattered} & {dead for _, dead in takeovers(source)}


def test_the_fusion_report_gives_the_planned_peak() -> None:
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    report = str(fusebackend.explain(lambda x, w: torch.relu(x @ w) * 2, x, w))
    # the product's 512 B, which the ReLU's output is written over
    assert report.rstrip().endswith("1 are written over their kernel's input; planned peak of intermediates 512 B")


def test_steps_run_in_the_order_that_lowers_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    # GPT-2's head backward: both products read the padded gradient; the padded weight dies at
    # the second. In the graph's order the first product's result is allocated while the padded
    # weight still waits; run the second first and the weight is freed before (ordering.py).
    from fusebackend.scheduler import ordering

    monkeypatch.setattr(ordering, "MIN_GAIN_BYTES", 0)  # tiny shapes: the share alone decides
    torch.manual_seed(0)
    g, w, h = torch.randn(16, 101), torch.randn(101, 32), torch.randn(16, 32)

    def fn(g: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return g.t() @ h, g @ w  # a [101, 32] result, then a [16, 32] one

    peaks = {}
    for share in (1.0, ordering.MIN_GAIN):  # a share of 1.0: never reordered
        torch._dynamo.reset()
        monkeypatch.setattr(ordering, "MIN_GAIN", share)
        with fusebackend.config.patch(pad_mm="always", graph_cache=False):
            out = compile_fn(fn)(g, w, h)
        for a, e in zip(out, fn(g, w, h)):
            assert_same(a, e)
        source = wrapper()
        products = re.findall(r"= aten_mm\((.*)\)$", source, re.M)
        peaks[share] = float(re.search(r"planned peak of intermediates ([\d.]+) KiB", source).group(1))
        # reordered, the product that reads the padded weight (a buffer, not a view of g) is first
        assert products[0].startswith("buf") == (share < 1.0), source
    # the [101, 32] result (12.6 KiB) is no longer live beside the padded weight (13 KiB)
    assert peaks[ordering.MIN_GAIN] == pytest.approx(peaks[1.0] - 101 * 32 * 4 / 1024, abs=0.01)


def _roots_then_peak(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, v: torch.Tensor, late: bool) -> torch.Tensor:
    # w1 * 3 and w2 * 5 read graph inputs alone (as a convolution's weight made channels-last
    # does): siblings that one kernel could make. ``big`` (16 KiB) is the widest point.
    a = torch.tanh(x @ (w1 * 3))
    if not late:
        a = torch.tanh(a @ (w2 * 5))
    big = torch.cat([a, a, a, a], 1).sin()
    s = torch.tanh((big @ v) * x)
    return s @ (w2 * 5) if late else s


@pytest.mark.parametrize("late", [False, True], ids=["read-before-the-peak", "read-after-the-peak"])
def test_roots_are_not_made_together_where_one_would_wait_over_the_peak(late: bool) -> None:
    torch.manual_seed(0)
    args = torch.randn(64, 16), torch.randn(16, 16), torch.randn(16, 16), torch.randn(64, 1)
    fn = lambda *a: _roots_then_peak(*a, late=late)
    # ``big @ v`` a library product, so that ``big`` is stored and is the widest point (generated
    # as a reduction, lowering/matmuls._column_product, it fuses with ``big``'s kernel)
    with fusebackend.config.patch(graph_cache=False, column_products=False):
        out = compile_fn(fn)(*args)
    assert_same(out, fn(*args), atol=1e-4, rtol=1e-4)
    schedule = fusebackend.last_compiled().schedule
    # read after the peak, w2 * 5 made with w1 * 3 would hold its 1 KiB over it (fusion.py)
    assert ("siblings:" in schedule) == (not late), schedule
    if late:
        assert "planned peak of intermediates 20.00 KiB" in schedule


def _layers_of_gathered_bias(x: torch.Tensor, index: torch.Tensor | None, *tables: torch.Tensor) -> torch.Tensor:
    # each layer gathers its bias through one shared index (as BEiT's relative position bias
    # does) and expands it over the batch for a product. Fusing two layers' gathers saves one
    # read of the index (a horizontal fusion; or, where the index is computed here, a vertical
    # fusion of each gather with it) and makes the later layer's bias before its time
    if index is None:
        positions = torch.arange(x.shape[1])
        index = positions[:, None] - positions[None, :] + x.shape[1]
    for table in tables:
        bias = table[index].unsqueeze(0).expand(x.shape[0], -1, -1).contiguous()
        x = torch.bmm(bias, x).relu()
    return x


@pytest.mark.parametrize("computed", [False, True], ids=["index-read", "index-computed"])
def test_fusion_does_not_make_every_layer_at_once_over_the_widest_point(computed: bool) -> None:
    torch.manual_seed(0)
    layers, batch, seq = 4, 8, 24
    index = None if computed else torch.randint(0, 2 * seq, (seq, seq))
    args = (torch.randn(batch, seq, 5), index, *[torch.randn(2 * seq) for _ in range(layers)])
    with fusebackend.config.patch(graph_cache=False):
        out = compile_fn(_layers_of_gathered_bias)(*args)
    assert_same(out, _layers_of_gathered_bias(*args), atol=1e-5, rtol=1e-5)
    schedule = fusebackend.last_compiled().schedule
    assert "horizontal:" not in schedule and "siblings:" not in schedule, schedule
    # a computed index is computed again in each gather, and the siblings' merges are not reported
    assert computed or "steps before its readers, above the graph's widest point" in schedule, schedule
    bias_bytes = batch * seq * seq * 4
    rows = re.findall(r"kernel \d+: .*\| read .*, write ([\d.]+) KiB  \| stores (.*)", schedule)
    # one kernel per layer's bias, each storing that bias alone
    assert [len(stores.split(", ")) for w, stores in rows if float(w) == bias_bytes / 1024] == [1] * layers, schedule
    peak = float(re.search(r"planned peak of intermediates ([\d.]+) KiB", schedule).group(1))
    assert peak < 2 * bias_bytes / 1024 + 8, schedule
