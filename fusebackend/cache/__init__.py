"""The on-disk cache of compiled graphs: a second process loads what the first compiled.

``compile_graph`` asks ``load(key)`` before it lowers a graph and ``store(key, entry)`` after it
compiled one. An entry holds what running and inspecting the graph needs: the wrapper's source
and its constants, each kernel's source and launch, and the texts a dump shows. A hit skips
lowering, scheduling and code generation; the kernels' binaries come from Triton's own cache
(its folder, ``TRITON_CACHE_DIR``), where Triton put them when the first process compiled them.

The key (``graph_key``) covers everything that changes what is generated: the ATen graph's nodes
(op, target, arguments, and the Dynamo node each comes from, which the schedule names:
``provenance.py``), the value metadata of each and the tensors it holds, each input's sizes, strides,
dtype and device, how many outputs are the user's, every fusebackend option but the folders,
whether kernels run in the interpreter, the GPU's compute capability, and the versions of
Python, torch, Triton and fusebackend, whose own source files are hashed so that an edited
checkout misses too. The graph's name is not in it: a graph compiled under another name (another
process compiled other graphs first) is the same graph.

An entry is one file, ``<cache_dir>/graphs/<key>.fgraph``: a magic line, a one-line JSON header
(what ``python -m fusebackend.cache`` lists), the SHA-256 of the payload, and the payload (a
pickle, as Inductor's caches are: the folder must be trusted like code). Files are written to a
temporary name and renamed into place, so a reader sees a whole entry or none, and two processes
writing the same entry both succeed. An entry that is truncated or whose payload does not match its
digest is reported once (a warning) and recompiled, and the new entry replaces it. A cache folder
that cannot be written costs one warning: graphs are then compiled and not stored, and kernel
modules (which Triton imports from files) go to a temporary folder.

Entries travel in PyTorch's portable cache artifacts (``torch.compiler.save_cache_artifacts`` /
``load_cache_artifacts``), beside AOTAutograd's: see "Portable artifacts" below.

    python -m fusebackend.cache           # the folder, its entries and their sizes
    python -m fusebackend.cache --clear   # delete fusebackend's entries and kernel modules
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import os
import pickle
import sys
import tempfile
import time
import warnings
from typing import Any, Sequence

import torch

from fusebackend.config import config, use_interpreter
from fusebackend.provenance import source_name
from fusebackend.signature import input_key

MAGIC = b"FUSEGRAPH 1\n"  # the file format's version: a change of format is a new magic
SUFFIX = ".fgraph"
# options that say where files go or how compiling is done, not what is compiled
_NOT_KEYED = ("dump_dir", "cache_dir", "graph_cache", "compile_threads")


@dataclasses.dataclass
class KernelRecord:
    """One generated kernel as the loader needs it (``pipeline._load``)."""

    name: str
    source: str
    grid: int
    launch: dict[str, Any]
    arg_dtypes: tuple[torch.dtype, ...]  # each pointer argument's dtype (for compiling ahead of the launch)
    sizes: tuple[int, ...]
    # mode="max-autotune": the other candidates, (source, grid, launch) each, and the positions
    # of the arguments the kernel stores into (kernels/autotune.py)
    variants: tuple[tuple[str, int, dict[str, Any]], ...] = ()
    written: tuple[int, ...] = ()
    # rows of a symbolic length: the RBLOCK up to which ``<name>_persistent`` (in ``source``) runs
    # a call's rows (codegen.KernelSource.short_rows)
    short_rows: int | None = None


@dataclasses.dataclass
class Entry:
    """A compiled graph as the cache keeps it."""

    name: str  # the graph's name when it was compiled
    device: str  # the device its kernels run on
    wrapper: str
    constants: dict[str, Any]
    kernels: list[KernelRecord]
    texts: dict[str, str]  # aten_graph, ir, fused_ir, schedule: for dumps (dump.CompiledArtifacts)
    fallbacks: dict[str, int]  # the ATen ops its lowering left as calls (metrics.fallbacks)
    fx_values: dict[str, str]  # for config.check_kernels (ir.IRGraph.fx_values)
    # each kernel's source nodes (provenance.py), for dumps (dump.CompiledArtifacts.sources)
    sources: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# the key


def graph_key(gm: torch.fx.GraphModule | str, args: Sequence[Any], user_outputs: int | None,
              autotune: bool = False, symbolic_sizes: bool = False) -> str:
    """The cache key of compiling ``gm`` for ``args`` (with autotuning candidates: ``autotune``):
    a hex SHA-256. ``gm`` may be given by its ``module_digest``. ``symbolic_sizes``: the compile
    for every size, keyed by the graph's traced sizes (in its digest) and the inputs'
    dtypes and devices, not by ``args``' sizes: a process that meets other sizes loads it."""
    h = hashlib.sha256()
    add = _adder(h)
    add(MAGIC, options_digest(), user_outputs, autotune)
    if symbolic_sizes:
        add("symbolic", tuple((a.dtype, a.device) if isinstance(a, torch.Tensor) else type(a) for a in args))
    else:
        add(input_key(args))
    for device in sorted({str(a.device) for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"}):
        add(device, _device_facts(device))
    add(gm if isinstance(gm, str) else module_digest(gm))
    return h.hexdigest()


def module_digest(gm: torch.fx.GraphModule) -> str:
    """The graph's share of its key: a hex SHA-256 of its nodes, their value metadata and the
    attributes it reads (``_add_module``)."""
    h = hashlib.sha256()
    _add_module(gm, _adder(h))
    return h.hexdigest()


def _adder(h: Any) -> Any:
    def add(*parts: Any) -> None:
        for part in parts:
            h.update(part if isinstance(part, bytes) else repr(part).encode())
            h.update(b"\x00")

    return add


def options_digest() -> str:
    """A hash of what, besides the graph and its inputs, decides what fuse generates: the
    versions of Python, torch, Triton and fusebackend (its source files), every option but the
    folders, and whether kernels run in the interpreter."""
    options = sorted((f.name, getattr(config, f.name)) for f in dataclasses.fields(config) if f.name not in _NOT_KEYED)
    return hashlib.sha256(repr((_versions(), options, use_interpreter())).encode()).hexdigest()


def key_or_none(gm: torch.fx.GraphModule | str, args: Sequence[Any], user_outputs: int | None,
                autotune: bool = False, symbolic_sizes: bool = False) -> str | None:
    """``graph_key``, or None where a value of the graph cannot be keyed (an attribute of a kind
    never seen): the graph is then compiled and not cached, never failed for it."""
    try:
        return graph_key(gm, args, user_outputs, autotune, symbolic_sizes)
    except Exception:
        return None


def _add_module(gm: torch.fx.GraphModule, add: Any) -> None:
    """Each node (its op, target and arguments: the graph's code, without generating it), its
    value metadata, and each attribute the graph reads."""
    for node in gm.graph.nodes:
        add(node.op, node.name, str(node.target), node.args, node.kwargs, _describe(node.meta.get("val")),
            source_name(node))
        if node.op == "get_attr":
            value = attribute(gm, str(node.target))
            if isinstance(value, torch.fx.GraphModule):
                _add_module(value, add)
            elif isinstance(value, torch.Tensor):
                add(_describe(value), _tensor_digest(value))
            else:
                add(type(value).__name__, repr(value))


def attribute(gm: torch.nn.Module, target: str) -> Any:
    """The module's attribute at a dotted get_attr target; None where there is none."""
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _describe(value: Any) -> Any:
    """What compiling depends on in one FX value (a fake tensor's layout; nested values)."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride() if value.layout == torch.strided else None,
                value.dtype, value.device.type, value.layout)
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return type(value).__name__


def _tensor_digest(t: torch.Tensor) -> str:
    data = t.detach().to("cpu").contiguous().reshape(-1)  # a 0-dim tensor has no byte view
    return hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()


@functools.cache
def _versions() -> tuple[str, ...]:
    import triton

    return (sys.version.split()[0], torch.__version__, getattr(triton, "__version__", "?"), _package_digest())


@functools.cache
def _package_digest() -> str:
    """A hash of fusebackend's own source files: an edited checkout compiles anew."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as fh:
                    h.update(fh.read())
    return h.hexdigest()


@functools.cache
def _device_facts(device: str) -> tuple[Any, ...]:
    d = torch.device(device)
    return torch.cuda.get_device_capability(d), torch.cuda.get_device_name(d)


# ---------------------------------------------------------------------------------------------
# the folder


_unwritable_warned: set[str] = set()
_corrupt_warned: set[str] = set()


def folder(kind: str) -> str | None:
    """``<cache_dir>/<kind>``, made if missing; None where it cannot be written (one warning
    per cache folder and process)."""
    path = os.path.join(config.cache_dir, kind)
    if _writable(path):
        return path
    root = config.cache_dir
    if root not in _unwritable_warned:
        _unwritable_warned.add(root)
        warnings.warn(
            f"fusebackend: the cache folder {root} cannot be written; compiled graphs are not cached "
            "and kernel modules go to a temporary folder (FUSE_CACHE_DIR chooses the folder)",
            stacklevel=3,
        )
    return None


@functools.cache
def _writable_at(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, suffix=".probe")
        os.close(fd)
        os.remove(probe)
        return True
    except OSError:
        return False


def _writable(path: str) -> bool:
    # a folder that became writable later is seen by a new process; one that stopped being
    # writable fails a write, which ``write_atomic`` reports
    return _writable_at(path)


@functools.cache
def temporary_folder(kind: str) -> str:
    """A folder of this process's own, for kernel modules where the cache folder is read-only."""
    return tempfile.mkdtemp(prefix=f"fusebackend-{kind}-")


def write_atomic(path: str, data: bytes) -> bool:
    """Write ``data`` to ``path`` through a temporary file renamed into place; False on failure."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
        return False


# ---------------------------------------------------------------------------------------------
# entries


def entry_path(key: str) -> str:
    return os.path.join(config.cache_dir, "graphs", key + SUFFIX)


def _path(key: str) -> str | None:
    """Where the entry of ``key`` is, or None where the folder cannot be written."""
    return None if folder("graphs") is None else entry_path(key)


def store(key: str, entry: Entry) -> bool:
    """Write ``entry`` under ``key``; False where it cannot be (a value that does not pickle, a
    folder that cannot be written)."""
    if not config.graph_cache:
        return False
    path = _path(key)
    if path is None:
        return False
    try:
        payload = pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # a constant that does not pickle: this graph is compiled each time
        return False
    header = {"name": entry.name, "kernels": len(entry.kernels), "created": time.time(),
              "versions": list(_versions()[:3])}
    data = MAGIC + json.dumps(header).encode() + b"\n" + hashlib.sha256(payload).digest() + payload
    _record_artifact(key, data)
    if not write_atomic(path, data):
        if config.cache_dir not in _unwritable_warned:
            _unwritable_warned.add(config.cache_dir)
            warnings.warn(f"fusebackend: could not write the cache entry {path}; compiled graphs are not cached",
                          stacklevel=3)
        return False
    return True


def load(key: str) -> Entry | None:
    """The entry under ``key``, or None: a miss, or a corrupt entry (reported once per file)."""
    if not config.graph_cache:
        return None
    path = _path(key)
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
        entry = decode(data)
    except Exception as exc:
        report_corrupt(path, exc)
        return None
    _record_artifact(key, data)
    return entry


def decode(data: bytes) -> Entry:
    """An entry from a file's bytes; raises ``ValueError`` saying what is wrong with them."""
    if not data.startswith(MAGIC):
        raise ValueError("not a fusebackend cache entry of this format")
    end = data.find(b"\n", len(MAGIC))
    if end < 0 or len(data) < end + 1 + 32:
        raise ValueError("truncated")
    digest, payload = data[end + 1:end + 33], data[end + 33:]
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError("truncated or changed: its payload does not match its digest")
    entry = pickle.loads(payload)
    if not isinstance(entry, Entry):
        raise ValueError(f"holds a {type(entry).__name__}, not an entry")
    return entry


def report_corrupt(path: str, exc: BaseException) -> None:
    if path not in _corrupt_warned:
        _corrupt_warned.add(path)
        warnings.warn(f"fusebackend: the cache entry {path} is unreadable ({exc}); compiling the graph again",
                      stacklevel=4)


# ---------------------------------------------------------------------------------------------
# portable artifacts
#
# fuse's compiled graphs in PyTorch's portable cache artifacts.
#
# ``torch.compiler.save_cache_artifacts()`` returns the bytes of every cache entry the process
# wrote or read (Inductor's graphs, AOTAutograd's results, autotuning choices...), and
# ``torch.compiler.load_cache_artifacts(data)`` writes them into a fresh machine's cache folders,
# so that its first compile loads instead of compiling. fuse's entries go with them: ``store``
# and ``load`` record each entry they write or read (``_record_artifact``), as an artifact of type
# ``fusebackend`` whose key is the entry's key and whose content is the entry file's bytes;
# loading writes it into ``FUSE_CACHE_DIR`` (``FuseGraphArtifact.populate_cache``), where the
# first compile of the graph finds it. With AOTAutograd's artifacts (which hold fuse's ATen
# graphs), a process loaded with them lowers no graph.
#
# The kernels' binaries do not travel: the entry holds each kernel's source, and Triton compiles
# them at the first load (in worker processes, ``kernels/precompile.py``), or finds them in its
# own cache (``TRITON_CACHE_DIR``).
#
# PyTorch reads the artifacts' types when it unpacks them, and knows only its own: import
# fusebackend before ``load_cache_artifacts`` (``torch.compile(model, backend="fuse")`` imports it
# only when it is called). Without it PyTorch logs a warning and loads nothing.

ARTIFACT_TYPE = "fusebackend"

try:  # PyTorch's portable caches (torch.compiler._cache), in every version fuse supports
    from torch.compiler._cache import CacheArtifact, CacheArtifactFactory, CacheArtifactManager
except ImportError:  # pragma: no cover - an older torch: entries stay on this machine
    CacheArtifactManager = None
else:

    @CacheArtifactFactory.register
    class FuseGraphArtifact(CacheArtifact):
        """One compiled graph: its key and its entry file's bytes (``store``'s format)."""

        def populate_cache(self) -> None:
            if folder("graphs") is not None:
                write_atomic(entry_path(self.key), self.content)

        @staticmethod
        def type() -> str:
            return ARTIFACT_TYPE


def _record_artifact(key: str, data: bytes) -> None:
    """Record the entry ``data`` under ``key`` for ``torch.compiler.save_cache_artifacts``."""
    if CacheArtifactManager is not None:
        CacheArtifactManager.record_artifact(ARTIFACT_TYPE, key, data)


# ---------------------------------------------------------------------------------------------
# python -m fusebackend.cache


def _header(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return {}
            return json.loads(f.readline())
    except (OSError, ValueError):
        return {}


def _files(kind: str) -> list[str]:
    where = os.path.join(config.cache_dir, kind)
    if not os.path.isdir(where):
        return []
    return [os.path.join(where, f) for f in sorted(os.listdir(where))]


def _size(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def describe(limit: int = 20) -> str:
    """What the cache folder holds: its entries (newest first) and kernel modules, with sizes."""
    graphs = [p for p in _files("graphs") if p.endswith(SUFFIX)]
    kernels = [p for p in _files("kernels") if p.endswith(".py")]
    lines = [f"fusebackend cache: {config.cache_dir}",
             f"  compiled graphs: {len(graphs)} ({_size(graphs) / 1024:.1f} KiB)",
             f"  kernel and wrapper modules: {len(kernels)} ({_size(kernels) / 1024:.1f} KiB)",
             f"  kernel binaries: in Triton's cache ({_triton_cache_dir()}), "
             "not listed or cleared here"]
    newest = sorted(graphs, key=os.path.getmtime, reverse=True)
    for path in newest[:limit]:
        head = _header(path)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(path)))
        lines.append(f"    {os.path.basename(path)[:16]}  {when}  {head.get('name', '?')}, "
                     f"{head.get('kernels', '?')} kernels, {os.path.getsize(path) / 1024:.1f} KiB"
                     + ("" if head else "  (unreadable)"))
    if len(newest) > limit:
        lines.append(f"    ... and {len(newest) - limit} more")
    return "\n".join(lines)


def _triton_cache_dir() -> str:
    import triton

    knobs = getattr(triton, "knobs", None)
    return knobs.cache.dir if knobs is not None else "Triton's default folder"


def clear() -> int:
    """Delete fusebackend's entries and kernel modules (not Triton's binaries); how many files."""
    removed = 0
    for kind in ("graphs", "kernels"):
        for path in _files(kind):
            if os.path.isfile(path):
                os.remove(path)
                removed += 1
    return removed


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fusebackend.cache",
                                     description="Show or clear fusebackend's cache of compiled graphs.")
    parser.add_argument("--clear", action="store_true", help="delete the compiled graphs and kernel modules")
    parser.add_argument("--dir", default=None, help="the cache folder (default: FUSE_CACHE_DIR or ~/.cache/fusebackend)")
    parser.add_argument("--limit", type=int, default=20, help="entries listed, newest first")
    args = parser.parse_args(argv)
    with config.patch(**({"cache_dir": args.dir} if args.dir else {})):
        if args.clear:
            print(f"removed {clear()} files from {config.cache_dir}")
        print(describe(args.limit))

