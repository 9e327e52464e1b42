"""Instructions an element of each IR op costs in a generated kernel, compiled for an H100
(sm_90) by Triton's own compiler and ``ptxas``, on any machine whose Triton has its NVIDIA
backend (no GPU needed).

Each op is rendered as codegen renders it (``codegen/triton_ops.py``) into a kernel that loads
one bf16 element a thread for each operand, computes the op in fp32 and stores the bf16 result;
its cost is that kernel's instructions up to its first ``EXIT`` (the path every element takes:
a correctly rounded division's slow path is a subroutine after it), less the same kernel that
stores its first operand (a binary op: the sum of both). The table is
``scheduler/instructions.py``'s ``OP_INSTRUCTIONS``, which decides what the scheduler computes
again in several kernels and what it stores once.

    PYTHONPATH=. python -m benchmarks.studies.op_instructions
"""

from __future__ import annotations

import os
import re
import subprocess

os.environ["FUSE_INTERPRET"] = "0"  # kernels decorated for the compiler, not the interpreter
os.environ.pop("TRITON_INTERPRET", None)

# the float ops of one or two operands (random values, integer ops and positions aside)
UNARY = ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf",
         "floor", "ceil", "log1p", "expm1", "atan", "sinh", "asinh", "acosh", "erfc", "erfcx", "erfinv", "ndtri",
         "lgamma", "digamma", "trigamma", "i0", "i0e", "i1", "i1e")
BINARY = ("add", "sub", "mul", "truediv", "maximum", "minimum", "atan2", "hypot", "fmod")

_KERNEL = '''import triton
import triton.language as tl
from fusebackend.kernels import triton_helpers as th


@triton.jit
def k({args}, out, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
{loads}
    tl.store(out + x, ({expr}).to(tl.bfloat16))
'''


def instructions(expr: str, operands: int) -> int:
    """SASS instructions up to the first EXIT of a kernel storing ``expr`` of fp32 ``a0``...
    (one bf16 element a thread each), compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fusebackend.kernels import runtime

    source = _KERNEL.format(args=", ".join(f"in{i}" for i in range(operands)),
                            loads="\n".join(f"    a{i} = tl.load(in{i} + x).to(tl.float32)" for i in range(operands)),
                            expr=expr)
    jit = runtime.load_kernel("k", source)
    signature = {**{f"in{i}": "*bf16" for i in range(operands)}, "out": "*bf16", "XBLOCK": "constexpr"}
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(operands + 1)}
    compiled = triton.compile(ASTSource(jit, signature, {"XBLOCK": 128}, attrs=aligned),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"op_instructions_{os.getpid()}.cubin")
    with open(path, "wb") as f:
        f.write(compiled.asm["cubin"])
    try:
        sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.remove(path)
    count = 0
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(.*)", line)
        if m:
            count += 1
            if m.group(1).startswith("EXIT"):
                break
    return count


def table() -> dict[str, int]:
    """Each op's instructions an element (at least 1)."""
    from fusebackend.codegen.triton_ops import OP_TEMPLATES

    base = {1: instructions("a0", 1), 2: instructions("a0 + a1", 2) - 1}
    out = {}
    for names, operands in ((UNARY, 1), (BINARY, 2)):
        for name in names:
            expr = OP_TEMPLATES[name].format(*(f"a{i}" for i in range(operands)))
            out[name] = max(1, instructions(expr, operands) - base[operands])
    return out


def main() -> None:
    import triton

    costs = table()
    print(f"Triton {triton.__version__}, sm_90; instructions an element:")
    for name, count in sorted(costs.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {name:10s} {count}")


if __name__ == "__main__":
    main()
