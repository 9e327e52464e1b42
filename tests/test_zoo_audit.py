"""The zoo's kernel audit (``benchmarks/zoo/audit.py``) and its report lines, on made-up figures:
floors read from kernel headers and grouped as the runtime shares functions, each kernel's time
against its floor, the kernels flagged, and a model's loss against Inductor by cause. The
profiling itself needs a GPU (the zoo runner on one)."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.zoo import audit, report
from benchmarks.zoo.measure import StepProfile
from benchmarks.zoo.run import VariantStats, ZooRow


def _kernel(name: str, body: str, read: int, written: int) -> tuple[str, str]:
    return name, f"@triton.jit\ndef {name}(in_ptr0, out_ptr0):\n    # buf1 (stored)\n" \
                 f"    # reads {read} B, writes {written} B\n    {body}\n"


def test_floors_group_the_kernels_one_function_serves() -> None:
    # the same block in two layers (same source but the name and comments) is one function, shown
    # under one name: its floor is both kernels'
    kernels = [_kernel("fused_pw0_add", "x = 1", 1000, 500), _kernel("fused_pw7_add", "x = 1", 1000, 500),
               _kernel("fused_red1_sum", "y = 2", 4000, 8)]
    floors = audit.kernel_floors(kernels)
    assert floors["fused_pw0_add"] == floors["fused_pw7_add"]
    assert floors["fused_pw0_add"].floor_bytes == 3000 and floors["fused_pw0_add"].names == ("fused_pw0_add", "fused_pw7_add")
    assert floors["fused_red1_sum"].floor_bytes == 4008


def test_audit_sets_each_kernel_against_its_floor_and_flags_the_slow_ones() -> None:
    floors = audit.kernel_floors([_kernel("fused_pw0_add", "x = 1", 3_000_000, 1_000_000),
                                  _kernel("fused_red1_sum", "y = 2", 1_000_000, 0)])
    # 1e9 bytes/s: 4 MB take 4000 us, 1 MB 1000 us
    profile = StepProfile({"fused_pw0_add": (1, 5000.0), "fused_red1_sum": (1, 4000.0), "sm90_gemm": (2, 1000.0)})
    rows = audit.audit(profile, floors, 1e9)
    assert [r.name for r in rows] == ["fused_red*_sum", "fused_pw*_add"]  # the worst against its floor first
    red, pw = rows
    assert red.floor_us == 1000.0 and red.of_floor == 0.25 and red.share == 0.4
    assert pw.of_floor == 0.8 and pw.share == 0.5
    assert [r.name for r in audit.flagged(rows)] == ["fused_red*_sum"]
    assert profile.generated_us() == 9000.0 and profile.total_us == 10000.0 and profile.launches == 4


def test_the_kernels_of_one_block_in_every_layer_are_audited_together() -> None:
    # two layers' rotary kernels whose sources differ (a constant of each layer): two functions,
    # audited as one family, whose share of the step is flagged though each alone is under 2%
    kernels = [_kernel(f"fused_pw{k}_index_mul_neg", f"x = {k}", 1_000_000, 1_000_000) for k in (12, 58)]
    profile = StepProfile({"fused_pw12_index_mul_neg": (1, 15.0), "fused_pw58_index_mul_neg": (1, 15.0),
                           "sm90_gemm": (1, 970.0)})
    (row,) = audit.audit(profile, audit.kernel_floors(kernels), 1e12)  # 2 MB each: 2 us of floor each
    assert row.name == "fused_pw*_index_mul_neg" and row.kernels == 2 and row.launches == 2
    assert row.us == 30.0 and row.floor_us == 4.0 and row.share == 0.03
    assert audit.flagged([row]) == [row]


def test_a_kernel_launched_by_every_layer_moves_its_bytes_at_each_launch() -> None:
    # one layer's graph, compiled once and called by each of 12 layers: 12 launches of one kernel
    floors = audit.kernel_floors([_kernel("fused_red2_mul_sum", "y = 2", 1_000_000, 0)])
    (row,) = audit.audit(StepProfile({"fused_red2_mul_sum": (12, 24.0)}), floors, 1e12)  # 1 us of floor a launch
    assert row.launches == 12 and row.floor_us == 12.0 and row.of_floor == 0.5


def test_the_report_gives_the_audit_and_the_loss_by_cause() -> None:
    fuse = VariantStats("fuse", median_ms=3.0, speedup=1.0, host_ms=3.2, gpu_ms=2.5, peak_mib=1100.0,
                        generated_us=1500.0, library_us=1000.0, floor_us=600.0,
                        slow_kernels=[{"name": "fused_red1_sum", "kernels": 1, "launches": 1, "us": 800.0,
                                       "floor_us": 100.0, "of_floor": 0.125, "share": 0.32}])
    inductor = VariantStats("inductor", median_ms=2.0, speedup=1.5, host_ms=2.1, gpu_ms=2.0, peak_mib=1000.0,
                            generated_us=1000.0, library_us=1000.0)
    row = ZooRow("vae", "inference", variants=[VariantStats("eager", "ref", median_ms=3.0, speedup=1.0), inductor, fuse])
    (line,) = report.audit_lines([row])
    assert "fuse's kernels 1.50 ms (their floor 0.60 ms, 40% of it)" in line
    assert "Inductor's kernels 1.00 ms" in line and "fused_red1_sum 800 us (12% of floor, 32% of the step)" in line
    cause = report.loss_causes(row)
    assert cause == ("vae (inference): +1.00 ms a step; GPU kernels: generated +0.50 ms, library +0.00 ms; "
                     "host beyond the GPU: fuse 0.70 ms, Inductor 0.10 ms; peak +100 MiB")
    faster = ZooRow("vit", "inference", variants=[dataclasses.replace(fuse, median_ms=1.0), inductor])
    assert report.loss_causes(faster) is None
    assert "## Kernels against their floor" in report.markdown([row], {"size": "real", "dtype": "bf16", "copy_gbps": 3000})


@pytest.mark.parametrize("name", ["fused_pw0_add", "triton_poi_fused_add_0"])
def test_generated_kernels_are_told_from_library_ones(name: str) -> None:
    profile = StepProfile({name: (1, 10.0), "void cutlass::Kernel2<...>": (1, 30.0)})
    assert profile.generated_us() == 10.0


def test_kernels_of_two_graphs_with_one_name_share_a_floor() -> None:
    # a training step's forward and backward both have a fused_pw4_clone, of different sources:
    # two functions, shown under one name by the profiler, whose time is both kernels'
    kernels = [_kernel("fused_pw4_clone", "x = 1", 1000, 1000), _kernel("fused_pw4_clone", "y = 2", 300, 300),
               _kernel("fused_pw9_clone", "y = 2", 300, 300)]
    floors = audit.kernel_floors(kernels)
    assert floors["fused_pw4_clone"].floor_bytes == 2000 + 1200
    assert floors["fused_pw9_clone"].floor_bytes == 1200  # its group's alone
