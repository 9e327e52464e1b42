"""The zoo's kernel-by-kernel audit: each generated kernel's GPU time against its floor.

A kernel's floor is the time its bytes take at the copy bandwidth measured in the same run:
the bytes it must read and write (each input once, each output once: the ``# reads N B, writes
M B`` that codegen writes into every kernel's header, from the schedule's accounting) over the
bandwidth of a large device-to-device copy (``copy_bandwidth``, bytes read plus bytes written
per second). ``of_floor`` is floor time over measured time: 1.0 runs at the copy's speed; a
kernel at 0.1 takes ten times what its bytes need.

One profiled step (``measure.profile_step``) gives each kernel's device time by name. The profiler
shows one name for the kernels that share a function (the same block of each layer:
``runtime.kernel_identity``), so kernels are audited by that group: its launches' time against
the sum of its members' floors, and kernels are reported by ``family``: the same block of every
layer together, whether or not one function serves them.

``flagged`` lists the kernels that matter: under ``FLAG_OF_FLOOR`` of their floor and at least
``FLAG_SHARE`` of the step's GPU time. Inductor's step is profiled the same way, so a report
can set fuse's generated and library time beside Inductor's.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from typing import Iterable

import torch

from benchmarks.zoo.measure import StepProfile
from fusebackend.kernels.runtime import kernel_identity

FLAG_OF_FLOOR = 0.5  # a kernel under half its floor's speed...
FLAG_SHARE = 0.02  # ...that takes at least 2% of the step's GPU time is listed
_BYTES = re.compile(r"# reads (\d+) B, writes (\d+) B")
_PLACE = re.compile(r"^(fused_[a-z]+)\d+")


@dataclasses.dataclass(frozen=True)
class KernelFloor:
    names: tuple[str, ...]  # the kernels of one group (one function; the profiler shows one name)
    floor_bytes: int  # summed over the group: each member launches once a step


@dataclasses.dataclass
class KernelAudit:
    name: str  # as the profiler shows it
    kernels: int  # generated kernels in its group
    launches: int  # per step
    us: float  # device microseconds per step
    floor_us: float
    of_floor: float  # floor_us / us
    share: float  # of the step's device time


def copy_bandwidth(device: torch.device, mib: int = 1024) -> float:
    """Bytes per second of a device-to-device copy of ``mib`` MiB, bytes read plus bytes
    written, the median of ``do_bench``."""
    from triton.testing import do_bench

    src = torch.randn(mib << 18, device=device)  # 4-byte elements
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def kernel_floors(kernels: Iterable[tuple[str, str]]) -> dict[str, KernelFloor]:
    """Each kernel name -> its group's floor, from ``(name, source)`` of every generated kernel
    (``fusebackend.history()``'s)."""
    groups: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for name, source in kernels:
        found = _BYTES.search(source)
        if found is None:
            continue
        groups[kernel_identity(name, source)].append((name, int(found.group(1)) + int(found.group(2))))
    out = {}
    for members in groups.values():
        floor = KernelFloor(tuple(n for n, _ in members), sum(b for _, b in members))
        out.update({n: floor for n, _ in members})
    return out


def family(name: str) -> str:
    """A kernel's name without its place in the graph: ``fused_pw112_rotary_etc`` and
    ``fused_pw58_rotary_etc`` (the same block of two layers, not one function where their
    sources differ, as by a constant of each layer) are ``fused_pw*_rotary_etc``."""
    return _PLACE.sub(r"\1*", name)


def audit(profile: StepProfile, floors: dict[str, KernelFloor], bandwidth: float) -> list[KernelAudit]:
    """Every generated kernel of the step against its floor, by ``family`` (the kernels of one
    block in every layer together), the slowest against its floor first."""
    total = profile.total_us or 1.0
    groups: dict[str, list[tuple[KernelFloor, int, float]]] = defaultdict(list)
    for name, (launches, us) in profile.kernels.items():
        floor = floors.get(name)
        if floor is not None and us > 0:
            groups[family(name)].append((floor, launches, us))
    rows = []
    for name, members in groups.items():
        us = sum(m[2] for m in members)
        floor_us = sum(m[0].floor_bytes for m in members) / bandwidth * 1e6
        kernels = sum(len(m[0].names) for m in members)
        rows.append(KernelAudit(name, kernels, sum(m[1] for m in members), round(us, 2), round(floor_us, 2),
                                round(floor_us / us, 3), round(us / total, 4)))
    return sorted(rows, key=lambda r: r.of_floor)


def flagged(rows: Iterable[KernelAudit]) -> list[KernelAudit]:
    """The kernels under ``FLAG_OF_FLOOR`` of their floor that take ``FLAG_SHARE`` of the step."""
    return [r for r in rows if r.of_floor < FLAG_OF_FLOOR and r.share >= FLAG_SHARE]
