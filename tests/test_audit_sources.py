"""Which nodes of the model a kernel computes (``fusebackend/provenance.py``), and the zoo's audit
setting each slow fuse kernel beside Inductor's kernels for the same nodes
(``benchmarks/zoo/audit.py``): fuse's artifacts name each kernel's source nodes (Dynamo's node
names), through the graph cache too; Inductor's generated code is read for the same names; the
match sums the time of Inductor's kernels that share a node. Inductor's own Triton code needs a
GPU: its format is tested on a copy, and its C++ code for a CPU on a real compile."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import fusebackend
from benchmarks.zoo import audit, report
from benchmarks.zoo.measure import StepProfile
from benchmarks.zoo.run import VariantStats, ZooRow


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(x)
        activated = torch.nn.functional.gelu(hidden)
        return torch.softmax(self.norm(activated) * 2, -1)


def _through(backend: Callable[..., Any], names: list[str]) -> Callable[..., Any]:
    """``backend``, noting the names of the nodes of each Dynamo graph it is given."""
    def compile_fn(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        names.extend(n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output", "get_attr"))
        return backend(gm, example_inputs)

    return compile_fn


def _run_fuse(model: torch.nn.Module, *args: torch.Tensor) -> list[str]:
    names: list[str] = []
    with torch.no_grad():
        torch.compile(model, backend=_through(fusebackend.fuse, names))(*args)
    return names


def test_each_kernel_names_the_dynamo_nodes_it_computes() -> None:
    names = _run_fuse(Block(), torch.randn(4, 8))
    art = fusebackend.last_compiled()
    (kernel,) = art.kernels
    # the GELU, the norm, the scaling and the softmax in one kernel; the linear is an ATen call
    assert art.sources == {kernel: ("activated", "layer_norm", "mul", "softmax")}
    assert set(art.sources[kernel]) | {"hidden"} == set(names)
    assert "    source nodes: activated, layer_norm, mul, softmax" in art.schedule.splitlines()
    assert "    source nodes: hidden" in art.schedule.splitlines()  # under the extern addmm
    assert "activated" not in art.kernels[kernel]  # kernels of every layer share their text


def test_a_recomputed_chain_is_named_in_each_kernel_that_computes_it() -> None:
    # d = (x.float() - mean) * 2 is recomputed by the column sum's kernel and the row sum's:
    # both compute the upcast, the mean's scaling, the subtraction and the product
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        d = (xf - xf.mean(0)) * 2
        return d.sum(0), d.sum(1)

    with fusebackend.config.patch(graph_cache=False):
        torch.compile(fn, backend="fuse")(torch.randn(24, 40, dtype=torch.bfloat16))
    art = fusebackend.last_compiled()
    assert "recomputed in each reader" in art.schedule
    row_sums, column_sums = sorted(art.sources.values(), key=lambda s: s[-1], reverse=True)
    assert row_sums == ("xf", "mean", "sub", "d", "sum_2")
    assert column_sums == ("xf", "mean", "sub", "d", "sum_1")


def test_sources_survive_the_graph_cache() -> None:
    model, x = Block(), torch.randn(4, 8)
    _run_fuse(model, x)
    first = fusebackend.last_compiled().sources
    torch._dynamo.reset()
    fusebackend.dump.clear()
    fusebackend.metrics.reset()
    _run_fuse(model, x)
    assert fusebackend.metrics.cache_hits == 1
    assert fusebackend.last_compiled().sources == first and first


def test_backward_kernels_name_only_the_forward_nodes_they_recompute() -> None:
    model = Block()
    x = torch.randn(4, 8, requires_grad=True)
    with fusebackend.config.patch(graph_cache=False):
        torch.compile(model, backend="fuse")(x).sum().backward()
    backward = [a for a in fusebackend.history() if a.name.startswith("backward")]
    assert backward and backward[0].kernels
    named = {n for a in backward for s in a.sources.values() for n in s}
    assert named <= {"hidden", "activated", "layer_norm", "mul", "softmax"}
    assert "nodes without one" in backward[0].schedule
    sources = audit.fuse_sources(fusebackend.history())
    assert all(step == "backward" for k in backward[0].kernels for step, _ in sources[k])


@pytest.mark.full  # Inductor's C++ compile, 13 s: pytest --full
def test_inductor_on_a_cpu_names_its_aten_calls_not_its_cpp_kernels() -> None:
    # torch 2.13: Inductor's C++ kernels have no source-node comment (its Triton kernels do);
    # its ATen calls do, with Dynamo's names, the ones fuse gives
    names: list[str] = []
    mark = audit.inductor_code_mark()
    from torch._inductor.compile_fx import compile_fx

    with torch.no_grad():  # inference: one graph (each C++ compile takes seconds)
        torch.compile(Block(), backend=_through(compile_fx, names))(torch.randn(4, 8))
    codes = audit.inductor_code_since(mark)
    (forward,) = [c for c in codes if c.startswith("# AOT ID:")]
    assert audit.graph_pass(forward.splitlines()[0]) == "forward"
    found = audit.inductor_sources(codes)
    assert found and all(k.startswith("cpp_fused") for k in found)
    assert all(not s or {n for _, n in s} <= set(names) for s in found.values())
    commented = [line for line in forward.splitlines() if "Source Nodes: [" in line]
    assert commented and all("Source Nodes: [hidden]" in line for line in commented)  # the addmm


# Inductor's Triton code for a GPU as torch's codegen writes it (triton.py, wrapper.py): a
# comment block above each kernel's definition, and the first line of it above its launch
TRITON_CODE = """# AOT ID: ['0_forward']
import torch
async_compile = AsyncCompile()


# kernel path: /tmp/inductor/ab/cabc.py
# Topologically Sorted Source Nodes: [activated, layer_norm], Original ATen: [aten.gelu, aten.native_layer_norm]
# Source node to ATen node mapping:
#   activated => add, erf, mul
#   layer_norm => var_mean
# Graph fragment:
#   %mul : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%addmm, 0.5), kwargs = {})
triton_per_fused_gelu_native_layer_norm_0 = async_compile.triton('triton_per_fused_gelu_native_layer_norm_0', '''
@triton.jit
def triton_per_fused_gelu_native_layer_norm_0(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK: tl.constexpr):
    tmp0 = tl.load(in_ptr0 + (r0_1 + 8*x0), xmask, other=0.0)
    tl.store(out_ptr0 + (x0), tmp0, xmask)
''', device_str='cuda')


triton_poi_fused_mul_1 = async_compile.triton('triton_poi_fused_mul_1', '''
@triton.jit
def triton_poi_fused_mul_1(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    tl.store(out_ptr0 + (x0), tmp0, xmask)
''', device_str='cuda')


async_compile.wait(globals())


def call(args):
    primals_1, primals_2, primals_3 = args
    buf0 = empty_strided_cuda((4, 8), (8, 1), torch.float32)
    # Topologically Sorted Source Nodes: [hidden], Original ATen: [aten.t, aten.addmm]
    extern_kernels.addmm(primals_2, primals_3, reinterpret_tensor(primals_1, (8, 8), (1, 8), 0), out=buf0)
    buf1 = empty_strided_cuda((4, 8), (8, 1), torch.float32)
    # Topologically Sorted Source Nodes: [activated, layer_norm], Original ATen: [aten.gelu, aten.native_layer_norm]
    stream0 = get_raw_stream(0)
    triton_per_fused_gelu_native_layer_norm_0.run(buf0, buf1, 4, 8, stream=stream0)
    # Topologically Sorted Source Nodes: [mul], Original ATen: [aten.mul]
    stream0 = get_raw_stream(0)
    triton_poi_fused_mul_1.run(buf1, buf0, 32, stream=stream0)
    return (buf0, )
"""


def test_inductors_triton_code_names_each_kernels_source_nodes() -> None:
    backward = TRITON_CODE.replace("0_forward", "0_backward").replace("[mul]", "[mul, mul_12]")
    found = audit.inductor_sources([TRITON_CODE, backward])
    assert found == {
        "triton_per_fused_gelu_native_layer_norm_0": {(step, n) for step in ("forward", "backward")
                                                      for n in ("activated", "layer_norm")},
        # named at its launch alone; the extern addmm's comment names no kernel
        "triton_poi_fused_mul_1": {("forward", "mul"), ("backward", "mul"), ("backward", "mul_12")},
    }


def _kernels(**sources: tuple[str, ...]) -> dict[str, frozenset[audit.Source]]:
    return {k: frozenset(("backward" if k.endswith("_bw") else "forward", n) for n in names)
            for k, names in sources.items()}


def test_each_slow_kernel_is_set_beside_inductors_kernels_for_the_same_nodes() -> None:
    # two layers' softmax kernels (one family) and a kernel whose nodes have no source
    fuse = _kernels(fused_red3_mul_amax=("mul", "softmax"), fused_red9_mul_amax=("mul_1", "softmax_1"),
                    fused_pw5_mul=())
    inductor = _kernels(triton_per_fused_softmax_0=("mul", "softmax"),
                        triton_per_fused_add_softmax_1=("mul_1", "softmax_1", "add_3"),
                        triton_poi_fused_add_2=("add_3",),
                        triton_per_fused_softmax_bw=("softmax",),  # a backward kernel recomputing it
                        triton_poi_fused_mul_3=("mul",))  # not launched in the step profiled
    profile = StepProfile({"triton_per_fused_softmax_0": (1, 40.0), "triton_per_fused_add_softmax_1": (1, 45.0),
                           "triton_poi_fused_add_2": (1, 10.0), "triton_per_fused_softmax_bw": (1, 30.0),
                           "sm90_gemm": (2, 500.0)})
    rows = [audit.KernelAudit("fused_red*_mul_amax", 2, 2, 300.0, 30.0, 0.1, 0.3),
            audit.KernelAudit("fused_pw*_mul", 1, 1, 100.0, 20.0, 0.2, 0.1)]
    softmax, alone = audit.beside_inductor(rows, fuse, inductor, profile)
    assert softmax.inductor_kernels == ["triton_per_fused_add_softmax_1", "triton_per_fused_softmax_0"]
    assert softmax.inductor_us == 85.0
    assert softmax.inductor_overlap == 0.8  # add_3 is Inductor's alone: 4 nodes in common of 5
    assert alone == rows[1] and alone.inductor_us is None and alone.inductor_kernels == []

    fuse_stats = VariantStats("fuse", generated_us=1000.0, library_us=500.0, floor_us=200.0,
                              slow_kernels=[audit.dataclasses.asdict(r) for r in (softmax, alone)])
    (line,) = report.audit_lines([ZooRow("bert", "inference", variants=[fuse_stats])])
    assert ("fused_red*_mul_amax 300 us (10% of floor, 30% of the step, 2 kernels; Inductor's kernels for the "
            "same nodes: 85 us (2 kernels; 80% of the nodes either computes are common))") in line
    assert "fused_pw*_mul 100 us (20% of floor, 10% of the step)" in line


def test_the_runner_audits_fuse_beside_inductors_profile_of_the_same_mode() -> None:
    # run_model's last step, on made-up profiles (profiling needs a GPU): fuse@reduce-overhead's
    # slow kernel is set beside inductor@reduce-overhead's kernels, not plain inductor's
    from types import SimpleNamespace

    from benchmarks.zoo import run

    body = "@triton.jit\ndef k(in_ptr0, out_ptr0):\n    # reads 1000000 B, writes 1000000 B\n    x = 1\n"
    floors = audit.kernel_floors([("fused_red3_mul_amax", body)])  # 2 MB: 2000 us at 1 GB/s
    sources = {"fuse@reduce-overhead": _kernels(fused_red3_mul_amax=("mul", "softmax")),
               "inductor@reduce-overhead": _kernels(triton_per_fused_softmax_0=("mul", "softmax")),
               "inductor": _kernels(triton_per_fused_softmax_7=("mul", "softmax"))}
    profiles = {"fuse@reduce-overhead": StepProfile({"fused_red3_mul_amax": (1, 8000.0), "sm90_gemm": (1, 2000.0)}),
                "inductor@reduce-overhead": StepProfile({"triton_per_fused_softmax_0": (1, 2500.0)}),
                "inductor": StepProfile({"triton_per_fused_softmax_7": (1, 3000.0)})}
    stats = VariantStats("fuse@reduce-overhead")
    run._audit(stats, profiles, floors, sources, SimpleNamespace(bandwidth=1e9))
    assert stats.status == "ok" and stats.floor_us == 2000.0
    (slow,) = stats.slow_kernels
    assert slow["name"] == "fused_red*_mul_amax" and slow["of_floor"] == 0.25
    assert slow["inductor_kernels"] == ["triton_per_fused_softmax_0"] and slow["inductor_us"] == 2500.0
    assert slow["inductor_overlap"] == 1.0
