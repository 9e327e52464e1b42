"""Codegen: a Schedule -> Triton source per kernel plan and a Python wrapper for the graph."""

import dataclasses

from fusebackend import ir
from fusebackend.codegen.body import KernelSource
from fusebackend.codegen.pointwise import generate_pointwise
from fusebackend.codegen.product import generate_product, product_of
from fusebackend.codegen.reduction import generate_reduction
from fusebackend.codegen.scan import generate_scan
from fusebackend.codegen.scatter import generate_scatter
from fusebackend.codegen.wrapper import WrapperSource, generate_wrapper
from fusebackend.kernels import autotune, runtime
from fusebackend.scheduler import ExternCall, KernelPlan, Schedule


def generate(plan: KernelPlan, index: int, pdl: bool = False, launch: dict[str, int] | None = None) -> KernelSource:
    """Triton source for one kernel plan: a scatter kernel when the plan scatters, a scan kernel
    when it scans, a product kernel for a matrix product, a reduction kernel when it reduces,
    else a pointwise kernel.

    ``pdl``: the kernel is launched with programmatic dependent launch (``runtime.use_pdl``):
    it may start while the kernel before it in the stream still runs, so its first statement
    waits on the GPU until that kernel has finished and its writes are visible.

    ``launch``: blocks, warps and stages to generate the kernel for (an autotuning candidate,
    ``autotune.candidates``); the heuristics' where None.
    """
    source = _generate(plan, index, pdl, launch)
    assert source is not None
    return source


def _generate(plan: KernelPlan, index: int, pdl: bool, launch: dict[str, int] | None) -> KernelSource | None:
    """``generate``'s kernel, or None for a candidate's blocks that do not fit the plan."""
    if any(isinstance(n, ir.Scatter) for n in plan.nodes):
        source = generate_scatter(plan, index, pdl, launch)
    elif isinstance(plan.space.anchor, ir.Scan):
        source = generate_scan(plan, index, pdl, launch)
    elif product_of(plan) is not None:
        source = generate_product(plan, index, pdl, launch)
        if source is None:
            return None
    elif plan.space.anchor is not None:
        source = generate_reduction(plan, index, pdl, launch)
    else:
        source = generate_pointwise(plan, index, pdl, launch)
        if source is None:
            return None
    if pdl:
        source = dataclasses.replace(source, launch={**source.launch, "launch_pdl": True})
    if "tl.floor(" in source.source:
        # Rounding (round, round to decimals, floor division of floats) compares x - floor(x)
        # with 0.5: a multiply before it contracted into an fma would skip the rounding of the
        # product that eager does, and an exact tie (2.0005 * 1000) would round the other way.
        source = dataclasses.replace(source, launch={**source.launch, "enable_fp_fusion": False})
    if source.asserts:  # Triton keeps device asserts only in kernels compiled for debugging
        source = dataclasses.replace(source, launch={**source.launch, **runtime.ASSERT_OPTIONS})
    return source


def generate_all(schedule: Schedule, pdl: bool = False, tune: bool = False) -> list[KernelSource]:
    """Every kernel of a schedule, in launch order (kernel k is the schedule's k-th plan).

    With ``tune`` (``mode="max-autotune"``), each kernel that ``autotune.candidates`` gives other
    launch configurations carries them as ``variants``, each generated for its blocks (masks
    where a block overruns, a loop where a row is longer than a block): its first call keeps
    the fastest.

    With ``pdl`` (``runtime.use_pdl``), a kernel is launched early only when the GPU work just
    before it is one of this graph's kernels, which never let their dependents start before
    they end. Library kernels (cuBLAS, cuDNN) may: a kernel of ours launched after one could
    start while it runs and hold SM slots it still needs, only to wait.
    """
    kernels: list[KernelSource] = []
    after_kernel = False  # the last GPU work was one of our kernels
    for step in schedule.steps:
        if isinstance(step, ExternCall):
            after_kernel = False
            continue
        early = pdl and after_kernel
        source = generate(step, len(kernels), early)
        if tune:
            variants = (_generate(step, len(kernels), early, launch) for launch in autotune.candidates(source))
            # the wrapper passes the heuristic kernel's arguments to whichever is chosen, and its
            # memory plan relies on the heuristic kernel's in-place pairs (a looped candidate of
            # a persistent reduction has none)
            source = dataclasses.replace(source, variants=tuple(
                v for v in variants if v is not None and (v.args, v.in_place) == (source.args, source.in_place)
                and (v.source, v.launch) != (source.source, source.launch)))
        kernels.append(source)
        after_kernel = after_kernel or source.grid != 0  # an empty kernel launches nothing
    return kernels


__all__ = ["KernelSource", "WrapperSource", "generate", "generate_all", "generate_wrapper"]
