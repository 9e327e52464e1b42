"""The wrapper's memory plan: which buffers a kernel's output may take over, and the planned peak.

The wrapper frees each buffer after its last use (``del``). Without a plan, every kernel output
is a new allocation: a call to the caching allocator on the host, and a free when it dies. A
transformer's layer allocates the same few sizes again and again, so most outputs can take
the memory of a buffer that died before them instead: the wrapper then rebinds the dead
buffer's tensor (``view`` where the layout differs), which costs a fraction of an allocation.

A buffer's memory is taken over only where that is safe:

- the dead buffer is a kernel output the wrapper allocated, or the one result of an ATen op that
  writes into none of its arguments and whose result is none of them; not an input, a buffer
  written into an input, a scatter's target (its memory lives on as the scatter's result) or one
  result of several (those may share memory with what is still live); not returned; not read by
  an ATen op whose schema says a result may alias it (or an ``unsafe_`` view op, which does not
  say); and not the input or result of a collective (which reads or writes it on another stream
  until its wait);
- the new buffer is a kernel output the wrapper would allocate, of the same dtype and the same
  storage size (elements from its first to its last, plus one);
- the dead buffer's last reader ran before the kernel that writes the new one: launches and ATen
  calls are ordered on one stream, so the old readers are done when the new writer starts.

Among the dead buffers that fit, the one that died last is taken (the memory held in between is
the least), and only where holding it until then keeps the planned peak (the most bytes of
intermediates live after any step, every buffer freed after its last use) where it was: a
block held idle over the graph's widest point would raise it. A dead buffer that no later
output takes is freed where it dies, as before.

A kernel may also write an output over an input that dies at that kernel (in place), where it
reads the input only at the element it writes (``KernelSource.in_place``): a pointwise kernel,
whose lane reads each element before overwriting it, or a persistent reduction whose output
depends on its row's reduction, so that the whole row was read before any of it is stored (a
softmax over its scores). The input's memory must also be one that may be taken over, as above. The two then never take two blocks at once: a batch norm, residual add and ReLU
after a convolution write over the convolution's result, and a GELU over its matrix product's,
as Inductor does (in ResNet-50's first block at b64, three 98 MiB blocks were live at once
where Inductor had two: H100, torch 2.11, 2026-11-25). The planned peak counts the step once.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import sympy
import torch

from fusebackend import ir
from fusebackend.sizevars import size_hint
from fusebackend.scheduler import ExternCall, KernelPlan, format_bytes

if TYPE_CHECKING:
    from fusebackend.codegen.body import KernelBody


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    reuse: dict[str, str]  # a kernel output -> the dead buffer whose memory it takes
    in_place: dict[str, str]  # a kernel output -> the input it is written over (dying there)
    allocations: int  # kernel outputs allocated new
    peak_bytes: int  # the most bytes of intermediates (kernel outputs, ATen results) live at once

    def summary(self) -> str:
        return (f"memory plan: {self.allocations} buffers allocated, {len(self.reuse)} take a dead "
                f"buffer's memory, {len(self.in_place)} are written over their kernel's input; "
                f"planned peak of intermediates {format_bytes(self.peak_bytes)}")


def plan(steps: Sequence[KernelPlan | ExternCall], allocated: dict[int, list[ir.Buffer]], last_use: dict[str, int],
         keep: set[str], shared: set[str], reuse: bool = True,
         in_place: dict[int, Sequence[tuple[str, str]]] | None = None) -> MemoryPlan:
    """The plan for ``steps``. ``allocated[k]``: the buffers step ``k`` allocates (kernel outputs
    the wrapper owns); ``last_use``: each name's last reading step; ``keep``: names never freed
    or taken over (returned); ``shared``: names whose memory lives on under another name (a
    scatter's target); ``in_place[k]``: step ``k``'s (output, input) pairs that may share memory
    (``KernelSource.in_place``). With ``reuse`` False, every output is allocated new."""
    aliased = _aliased_by_externs(steps) | shared
    size, start, owned = _buffers(steps, allocated)
    live = _live_bytes(len(steps), size, start, last_use, keep)
    over: dict[str, str] = {}  # first the outputs written over their kernel's input: they lower the peak
    for k, pairs in (in_place or {}).items() if reuse else ():
        outputs = {buf.name for buf in allocated.get(k, [])}
        for out, name in pairs:
            if (out in outputs and out not in over and last_use.get(name) == k and owned.get(name) == owned[out]
                    and name not in keep and name not in aliased and name not in over.values()):
                over[out] = name
                live[k] -= size[out]  # one block for both at this step
    peak = max(live, default=0)
    dies_at: dict[int, list[str]] = {}
    for name, last in last_use.items():
        dies_at.setdefault(last, []).append(name)
    pool: dict[tuple[torch.dtype, int], list[str]] = {}
    taken: dict[str, str] = {}
    for k in range(len(steps)):
        for buf in allocated.get(k, []) if reuse else ():
            if buf.name in over:
                continue
            free = pool.get(owned[buf.name], [])
            for j in range(len(free) - 1, -1, -1):  # the one that died last first: the shortest wait
                gap = range(last_use[free[j]] + 1, k)  # held there, where it would have been free
                if not gap or max(live[s] for s in gap) + size[buf.name] <= peak:
                    taken[buf.name] = free.pop(j)
                    for s in gap:
                        live[s] += size[buf.name]
                    break
        for name in dies_at.get(k, ()):
            if name in owned and name not in keep and name not in aliased and name not in over.values():
                pool.setdefault(owned[name], []).append(name)
    allocations = sum(len(bufs) for bufs in allocated.values()) - len(taken) - len(over)
    return MemoryPlan(taken, over, allocations, max(live, default=0))


def _buffers(steps: Sequence[KernelPlan | ExternCall], allocated: dict[int, list[ir.Buffer]]
             ) -> tuple[dict[str, int], dict[str, int], dict[str, tuple[torch.dtype, int]]]:
    """Each intermediate's bytes and first step; and those whose memory may be taken over, with
    their (dtype, storage elements): the wrapper's allocations, and an ATen op's one result where
    it writes into none of its arguments (a new tensor of its own)."""
    size: dict[str, int] = {}
    start: dict[str, int] = {}
    owned: dict[str, tuple[torch.dtype, int]] = {}
    for k, step in enumerate(steps):
        made = list(allocated.get(k, []))
        if isinstance(step, ExternCall):
            made += [buf for _, buf in step.node.outputs]
            if (len(step.node.outputs) == 1 and step.node.outputs[0][0] == () and not step.node.mutates
                    and not ir.may_alias_arguments(step.node)):
                buf = step.node.outputs[0][1]
                owned[buf.name] = (buf.dtype, ir.storage_numel(buf))
        for buf in made:
            size[buf.name] = size_hint(ir.storage_numel(buf) * buf.dtype.itemsize)  # symbolic: at the hints
            start[buf.name] = k
        owned.update((buf.name, (buf.dtype, ir.storage_numel(buf))) for buf in allocated.get(k, []))
    return size, start, owned


def _live_bytes(count: int, size: dict[str, int], start: dict[str, int], last_use: dict[str, int],
                keep: set[str]) -> list[int]:
    """Bytes of intermediates live at each step with every buffer freed after its last use."""
    delta = [0] * (count + 1)
    for name, k in start.items():
        end = count - 1 if name in keep else max(last_use.get(name, k), k)
        delta[k] += size[name]
        delta[end + 1] -= size[name]
    live, total = [], 0
    for k in range(count):
        total += delta[k]
        live.append(total)
    return live


def _aliased_by_externs(steps: Sequence[KernelPlan | ExternCall]) -> set[str]:
    """Buffers read by an ATen op whose result may alias an argument (``ir.may_alias_arguments``):
    a result may share their memory after they die; and the inputs and results of collectives
    (``ir.is_collective``), which the collective may read or write until its wait, on another
    stream: they are freed (the process group holds them until then), never taken over."""
    out: set[str] = set()
    for step in steps:
        if isinstance(step, ExternCall) and (ir.may_alias_arguments(step.node) or ir.is_collective(step.node)):
            out |= {v.buffer.name for v in step.node.reads()}
            if ir.is_collective(step.node):
                out |= {buf.name for _, buf in step.node.outputs}
    return out


def in_place_pairs(body: "KernelBody", stores: dict[str, sympy.Expr]) -> tuple[tuple[str, str], ...]:
    """(output, input) pairs of a kernel where every load of the input is at the offset
    the output is stored at, and none is a gather: each element of the input is read by the lane
    that then writes the same element of the output, so the output may be written over the
    input where nothing reads the input afterwards. Offsets are compared as expressions of the
    kernel's indices, so equal offsets name the same element of two buffers that start at the
    same address."""
    loads: dict[str, set[sympy.Expr]] = {}
    for buf, offset in body.load_offsets:
        loads.setdefault(buf.name, set()).add(offset)
    return tuple((out, name) for out, offset in stores.items() for name, seen in loads.items()
                 if name not in body.gathered and seen == {offset})
