"""Codegen: a Schedule -> Triton source per kernel plan and a Python wrapper for the graph."""

from fusebackend.codegen.kernel import KernelSource, generate
from fusebackend.codegen.wrapper import WrapperSource, generate_wrapper

__all__ = ["KernelSource", "WrapperSource", "generate", "generate_wrapper"]
