"""Codegen: a Schedule -> Triton source per kernel plan and a Python wrapper for the graph."""

from fusebackend.codegen.body import KernelSource
from fusebackend.codegen.pointwise import generate_pointwise
from fusebackend.codegen.reduction import generate_reduction
from fusebackend.codegen.wrapper import WrapperSource, generate_wrapper
from fusebackend.scheduler import KernelPlan


def generate(plan: KernelPlan, index: int) -> KernelSource:
    """Triton source for one kernel plan: a reduction kernel when the plan reduces."""
    if plan.space.anchor is not None:
        return generate_reduction(plan, index)
    return generate_pointwise(plan, index)


__all__ = ["KernelSource", "WrapperSource", "generate", "generate_wrapper"]
