"""The wrapper's memory plan (``codegen/memory.py``): a kernel output takes the memory of a buffer
that died before it, where that is safe and raises no planned peak; asserted on the generated
wrappers, each result compared with eager."""

from __future__ import annotations

import re

import torch

import fusebackend
from helpers import assert_same, compile_fn


def wrapper() -> str:
    return fusebackend.last_compiled().wrapper


def takeovers(source: str) -> list[tuple[str, str]]:
    """(new, dead) for each output that takes a dead buffer's memory."""
    return re.findall(r"^\s*(buf\d+) = (?:view\()?(buf\d+)[,;]", source, re.M)


def chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # each tanh's output is read by the product after it and then dead; the next tanh's
    # output has the same size and comes after that product
    for _ in range(3):
        x = torch.tanh(x) @ w
    return torch.sigmoid(x)


def test_an_output_takes_the_memory_of_a_dead_buffer() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(12, 20), torch.randn(20, 20) * 0.2
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
    assert re.match(r"# memory plan: \d+ buffers allocated, \d+ take a dead buffer's memory; planned peak", summary)
    assert f"{len(pairs)} take a dead buffer's memory" in summary


def test_the_option_turns_it_off() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(12, 20), torch.randn(20, 20) * 0.2
    with fusebackend.config.patch(reuse_buffers=False):
        out = compile_fn(chain)(x, w)
    assert_same(out, chain(x, w))
    assert takeovers(wrapper()) == []
    assert ", 0 take a dead buffer's memory" in wrapper().splitlines()[1]


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
