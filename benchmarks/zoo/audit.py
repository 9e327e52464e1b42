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
can set fuse's generated and library time beside Inductor's, and each flagged kernel beside
Inductor's kernels for the same nodes of the model (``beside_inductor``).

Both compilers get the same Dynamo graph, and both name the Dynamo nodes a kernel computes, its
*source nodes* (``fusebackend/provenance.py``): fuse in ``CompiledArtifacts.sources``
(``fuse_sources``), Inductor in a comment above each kernel of the code it generates,
``# Topologically Sorted Source Nodes: [y_1, layer_norm], Original ATen: [...]``, above the
kernel's definition and its launch (``inductor_sources``, from the modules Inductor's code cache
loaded: ``inductor_code_since``). Inductor writes it for its Triton kernels; its C++ kernels
for a CPU have none (torch 2.13). A source is paired with its pass, forward or backward: a
backward kernel that recomputes a forward node is not the forward's kernel. Backward nodes have
no source of their own on fuse's side (provenance.py says why), so backward kernels are matched
only by the forward nodes they recompute.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from typing import Iterable

import torch

from benchmarks.zoo.measure import StepProfile
from fusebackend.dump import CompiledArtifacts
from fusebackend.kernels.runtime import kernel_identity

FLAG_OF_FLOOR = 0.5  # a kernel under half its floor's speed...
FLAG_SHARE = 0.02  # ...that takes at least 2% of the step's GPU time is listed
_BYTES = re.compile(r"# reads (\d+) B, writes (\d+) B")
_PLACE = re.compile(r"^(fused_[a-z]+)\d+")
# Inductor's generated code: which graph a module is, the comment naming a kernel's source nodes,
# a kernel's definition (its name as the profiler shows it, quoted where given) and a launch
_AOT_ID = re.compile(r"^# AOT ID: \[(.*)\]", re.MULTILINE)
_SOURCE_NODES = re.compile(r"^\s*# (?:Topologically Sorted|Unsorted) Source Nodes: \[(.*?)\], Original ATen:")
_DEFINITION = re.compile(r"^(\w+) = async_compile\.\w+\((?:\s*'(\w+)')?")
_LAUNCH = re.compile(r"^\s*([\w.]+?)(?:\.run)?\(")

Source = tuple[str, str]  # ("forward" or "backward", a source node's name)


@dataclasses.dataclass(frozen=True)
class KernelFloor:
    names: tuple[str, ...]  # the kernels of one group (one function; the profiler shows one name)
    floor_bytes: int  # summed over the group: the bytes of one launch of each member


@dataclasses.dataclass
class KernelAudit:
    name: str  # as the profiler shows it
    kernels: int  # generated kernels in its group
    launches: int  # per step
    us: float  # device microseconds per step
    floor_us: float
    of_floor: float  # floor_us / us
    share: float  # of the step's device time
    # Inductor's kernels that compute any of the same source nodes (beside_inductor): their names,
    # device microseconds per step, and the nodes both sides compute over the nodes either does
    inductor_kernels: list[str] = dataclasses.field(default_factory=list)
    inductor_us: float | None = None
    inductor_overlap: float | None = None


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
    (``fusebackend.history()``'s); a name that kernels of several groups carry (of two graphs),
    all of theirs."""
    groups: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for name, source in kernels:
        found = _BYTES.search(source)
        if found is None:
            continue
        groups[kernel_identity(name, source)].append((name, int(found.group(1)) + int(found.group(2))))
    out: dict[str, KernelFloor] = {}
    for members in groups.values():
        floor = KernelFloor(tuple(n for n, _ in members), sum(b for _, b in members))
        for name, _ in members:
            # kernels of two graphs (a training step's forward and backward) may share a name
            # but not a source: the profiler shows both functions' launches under that name
            known = out.get(name)
            out[name] = floor if known is None or known is floor else KernelFloor(
                known.names + tuple(n for n in floor.names if n not in known.names),
                known.floor_bytes + floor.floor_bytes)
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
        # a member launched more than once a step (the graph of one layer, which Dynamo compiles
        # once and every layer calls) moves its bytes at each launch
        floor_us = sum(m[0].floor_bytes * max(m[1] / len(m[0].names), 1) for m in members) / bandwidth * 1e6
        kernels = sum(len(m[0].names) for m in members)
        rows.append(KernelAudit(name, kernels, sum(m[1] for m in members), round(us, 2), round(floor_us, 2),
                                round(floor_us / us, 3), round(us / total, 4)))
    return sorted(rows, key=lambda r: r.of_floor)


def flagged(rows: Iterable[KernelAudit]) -> list[KernelAudit]:
    """The kernels under ``FLAG_OF_FLOOR`` of their floor that take ``FLAG_SHARE`` of the step."""
    return [r for r in rows if r.of_floor < FLAG_OF_FLOOR and r.share >= FLAG_SHARE]


def graph_pass(name: str) -> str:
    """``backward`` for a backward graph (fuse's ``backward_3``, Inductor's AOT ID
    ``0_backward``), else ``forward`` (an inference graph's nodes are the forward's)."""
    return "backward" if "backward" in name else "forward"


def fuse_sources(artifacts: Iterable[CompiledArtifacts]) -> dict[str, frozenset[Source]]:
    """Each generated kernel's source nodes, by name as the profiler shows it (the same name in
    several graphs: all of theirs), from ``fusebackend.history()``."""
    out: dict[str, set[Source]] = defaultdict(set)
    for a in artifacts:
        step = graph_pass(a.name)
        for kernel, names in a.sources.items():
            out[kernel].update((step, n) for n in names)
    return {k: frozenset(v) for k, v in out.items()}


def inductor_code_mark() -> int:
    """How many modules Inductor's code cache (``PyCodeCache``) has loaded in this process: what
    ``inductor_code_since`` reads after."""
    return len(_code_modules())


def inductor_code_since(mark: int) -> list[str]:
    """The text of each module Inductor loaded after ``mark``: the output code of the graphs it
    compiled or took from its cache since (and its kernels' modules, which hold no
    definitions). A module loaded before, by another compile of the same code, is not loaded
    again and is missed."""
    texts = []
    for module in _code_modules()[mark:]:
        try:
            with open(module.__file__) as f:
                texts.append(f.read())
        except (OSError, TypeError):  # gone from disk, or no file
            continue
    return texts


def _code_modules() -> list:
    from torch._inductor.codecache import PyCodeCache

    modules = getattr(PyCodeCache, "modules", [])
    return list(modules.values()) if isinstance(modules, dict) else list(modules)


def inductor_sources(codes: Iterable[str]) -> dict[str, frozenset[Source]]:
    """Each kernel Inductor defined in the output code ``codes`` -> its source nodes, from the
    comment above its definition or its launch (``# ... Source Nodes: [a, b], Original ATen:
    ...``); a kernel with no such comment (Inductor's C++ kernels) has none. Paired with the
    module's pass (its ``# AOT ID``); a name several modules define has all of theirs."""
    out: dict[str, set[Source]] = defaultdict(set)
    for code in codes:
        aot_id = _AOT_ID.search(code)
        step = graph_pass(aot_id.group(1) if aot_id else "")
        for kernel, names in _kernel_comments(code).items():
            out[kernel].update((step, n) for n in names)
    return {k: frozenset(v) for k, v in out.items()}


def _kernel_comments(code: str) -> dict[str, set[str]]:
    """The kernels one module defines -> the source nodes named above their definitions and
    launches. A comment names the kernel whose definition follows it (after more comment
    lines) or the next call (a kernel's launch, or an ATen call, which names no kernel)."""
    found = [(_DEFINITION.match(line), line) for line in code.splitlines()]
    defined = {m.group(1): m.group(2) or m.group(1) for m, _ in found if m}
    out: dict[str, set[str]] = {profiled: set() for profiled in defined.values()}
    pending: list[str] | None = None
    for definition, line in found:
        comment = _SOURCE_NODES.match(line)
        if comment:
            pending = [n.strip() for n in comment.group(1).split(",") if n.strip()]
            continue
        if pending is None or line.lstrip().startswith("#") or not line.strip():
            continue
        call = _LAUNCH.match(line)
        if definition is None and call is None:
            continue  # between a comment and its launch: get_raw_stream, an allocation
        kernel = definition.group(1) if definition else call.group(1)
        if kernel in defined:
            out[defined[kernel]].update(pending)
        pending = None
    return out


def beside_inductor(rows: Iterable[KernelAudit], fuse: dict[str, frozenset[Source]],
                    inductor: dict[str, frozenset[Source]], profile: StepProfile) -> list[KernelAudit]:
    """Each row with Inductor's kernels that compute any of the same source nodes as the row's
    kernels (every fuse kernel of its ``family``), and their summed time in Inductor's profiled
    step (``profile``); ``fuse`` and ``inductor``: each compiler's kernels' source nodes
    (``fuse_sources``, ``inductor_sources``).

    A match is by source node, a line of the model: a layer norm's node covers its mean,
    variance and normalization, and each compiler may split them among kernels otherwise.
    Inductor's kernels found may compute more than fuse's (a fused neighbour), and fuse's nodes
    may be computed elsewhere by Inductor (a library call, a kernel with no comment):
    ``inductor_overlap`` is the nodes both compute over the nodes either computes, 1.0 where the
    two sets are the same. Names are a Dynamo graph's: where a model breaks into several graphs,
    a name (``add``) may stand for different nodes in two of them, and match both. A row whose
    kernels name no source node, or that no profiled kernel of Inductor's shares, is returned as
    it is (no kernels, no time)."""
    out = []
    for row in rows:
        nodes = frozenset().union(*(s for k, s in fuse.items() if family(k) == row.name))
        matched = sorted(k for k, theirs in inductor.items() if theirs & nodes and k in profile.kernels)
        if not matched:
            out.append(row)
            continue
        theirs = frozenset().union(*(inductor[k] for k in matched))
        out.append(dataclasses.replace(row, inductor_kernels=matched,
                                       inductor_us=round(sum(profile.kernels[k][1] for k in matched), 2),
                                       inductor_overlap=round(len(nodes & theirs) / len(nodes | theirs), 3)))
    return out
