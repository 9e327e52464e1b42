"""Inspection: what one compilation produced, as text, kept in memory and optionally on disk.

``CompiledArtifacts`` holds the ATen graph, the IR before and after fusion, the schedule with its
byte accounting and refused fusions, every kernel's source and the wrapper. ``last()`` returns
the artifacts of the most recent compilation; with ``FUSE_DUMP_DIR`` set, each compilation also
writes them to ``<dir>/<graph name>/``.
"""

from __future__ import annotations

import dataclasses
import os

from fusebackend.config import config


@dataclasses.dataclass
class CompiledArtifacts:
    name: str
    aten_graph: str
    ir: str
    fused_ir: str
    schedule: str
    kernels: dict[str, str]
    wrapper: str
    stage_seconds: dict[str, float]
    dump_path: str | None = None
    # mode="max-autotune": each tuned kernel's candidates, their times and the choice, as text
    # (kernels/autotune.py); filled in at the kernels' first calls
    autotune: dict[str, str] = dataclasses.field(default_factory=dict)
    # each kernel's source nodes: the Dynamo graph's nodes (the model's lines) it computes, as
    # Inductor names them above its kernels (provenance.py); the schedule lists them too
    sources: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def kernel_count(self) -> int:
        return len(self.kernels)

    def __str__(self) -> str:
        parts = [f"== {self.name}: aten graph ==", self.aten_graph, "== IR ==", self.ir,
                 "== after fusion ==", self.fused_ir, "== schedule ==", self.schedule]
        for name, src in self.kernels.items():
            parts += [f"== kernel {name} ==", src]
        parts += ["== wrapper ==", self.wrapper]
        if self.autotune:
            parts += ["== autotune ==", autotune_text(self.autotune)]
        return "\n".join(parts)


_history: list[CompiledArtifacts] = []


def record(artifacts: CompiledArtifacts) -> None:
    _history.append(artifacts)
    del _history[:-256]
    if config.dump_dir:
        artifacts.dump_path = write(artifacts, config.dump_dir)


def note_autotune(artifacts: CompiledArtifacts, kernel: str, text: str) -> None:
    """Record a kernel's autotuning (``autotune.Tuner``), in the dump folder too where there is one."""
    artifacts.autotune[kernel] = text
    if artifacts.dump_path is not None:
        with open(os.path.join(artifacts.dump_path, "autotune.txt"), "w") as f:
            f.write(autotune_text(artifacts.autotune))


def autotune_text(tuned: dict[str, str]) -> str:
    return "\n".join(f"{kernel}:\n{text}" for kernel, text in tuned.items())


def last() -> CompiledArtifacts | None:
    """Artifacts of the most recently compiled graph (None before any compilation)."""
    return _history[-1] if _history else None


def history() -> list[CompiledArtifacts]:
    return list(_history)


def clear() -> None:
    _history.clear()


def write(artifacts: CompiledArtifacts, root: str) -> str:
    folder = os.path.join(root, artifacts.name)
    os.makedirs(folder, exist_ok=True)
    files = {
        "aten_graph.py": artifacts.aten_graph,
        "ir.txt": artifacts.ir,
        "ir_fused.txt": artifacts.fused_ir,
        "schedule.txt": artifacts.schedule,
        "wrapper.py": artifacts.wrapper,
    }
    for name, src in artifacts.kernels.items():
        files[f"kernel_{name}.py"] = src
    for fname, text in files.items():
        with open(os.path.join(folder, fname), "w") as f:
            f.write(text)
    return folder
