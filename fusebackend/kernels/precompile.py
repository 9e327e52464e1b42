"""Compiling a loaded graph's kernels at once, before their first launches.

``precompile`` (called by ``pipeline``) specializes each kernel as its first launch will, has
worker processes (``compile_worker.py``, ``CompilePool``) compile them into Triton's cache in
parallel, then loads them in threads; the launch finds each compiled.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import torch

from fusebackend.config import config, use_interpreter
from fusebackend.kernels.runtime import Launcher


def precompile(kernels: list[tuple[Launcher, tuple[torch.dtype, ...], tuple[int, ...]]],
               device: torch.device, in_workers: bool = True) -> None:
    """Compile a loaded graph's kernels to binaries now, several at once, rather than one by one
    at their first launches: ``(launcher, pointer dtypes, sizes)`` for each kernel.
    ``in_workers=False`` (a graph from fuse's cache, whose binaries Triton has cached) skips
    step 2: starting the workers would cost more than reading the binaries.

    Each kernel is specialized as its first launch will be (Triton's ``warmup``, each pointer
    given by its dtype and taken as 16-byte aligned as allocations are, the sizes as they are,
    the launch's constexprs and options), so that the launch finds its binary compiled. Three
    steps:

    1. Here, one kernel after another: what Triton would compile (``_specialization``: Triton's
       ``jit_cache_hook`` sees it and stops the compile). A kernel Triton already holds (shared
       with a graph loaded before) has nothing to compile.
    2. Worker processes (``CompilePool``) compile those into Triton's on-disk cache, in parallel.
       Threads would not do: much of Triton's compile is Python (its code generator), which
       holds the interpreter's lock. Where Triton builds a C launcher per signature (3.6 does,
       with a C compiler, about half a second each), other workers build each signature's at
       the same time.
    3. Threads then load each kernel as its first launch would (``warmup``: the binary from
       Triton's cache; ``_init_handles``: the module into the GPU's context, and its launcher,
       from Triton's cache too).

    A kernel that fails
    in a worker is compiled in step 3; one that fails there is compiled again at its first
    launch, which raises (the graph falls back) as it did before. Nothing to do in the
    interpreter, or with ``config.compile_threads`` below 2.
    """
    threads = config.compile_threads
    if use_interpreter() or threads < 2 or not kernels or device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    unique: dict[tuple[int, Any], int] = {}  # a kernel shared by several launches, specialized alike, once
    for k, (launcher, dtypes, sizes) in enumerate(kernels):
        launch = tuple(sorted(launcher.launch.items()))
        unique.setdefault((id(launcher.kernel), (dtypes, sizes, launcher.grid, launch)), k)
    kernels = [kernels[k] for k in unique.values()]
    specs: list[str | None] = [None] * len(kernels)
    if in_workers:
        with torch.cuda.device(index):
            specs = [_specialization(*k) for k in kernels]
    workers = _worker_pool(threads)
    # Triton 3.6 builds a C launcher per signature at a kernel's first load: the workers build
    # them at once, while they compile the kernels (the signatures are the specializations')
    signatures = [_launcher_signature(spec) for spec in specs]
    building = {sig: _thread_pool(threads).submit(workers.build_launcher, sig)
                for sig in dict.fromkeys(signatures) if sig is not None}

    def load(k: int) -> None:
        launcher, dtypes, sizes = kernels[k]
        if specs[k] is not None:
            workers.compile(launcher.kernel, specs[k])
        if signatures[k] is not None:
            building[signatures[k]].result()  # its launcher built, not built again here
        try:
            with torch.cuda.device(index):  # a thread's current device is its own
                compiled = launcher.kernel.warmup(*dtypes, *sizes, grid=launcher.grid, **launcher.launch)
                init = getattr(compiled, "_init_handles", None)
                if init is not None:
                    init()
        except Exception:
            pass  # compiled at the first launch, which reports the error

    list(_thread_pool(threads).map(load, range(len(kernels))))


def _launcher_signature(spec: str | None) -> tuple[Any, ...] | None:
    """The argument types of a specialization (JSON) where this Triton builds a C launcher per
    signature (3.6 does; 3.9 does not), else None."""
    if spec is None or not _builds_launchers():
        return None
    import json

    return tuple(_hashable(t) for t in json.loads(spec)["signature"].values())


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


@functools.cache
def _builds_launchers() -> bool:
    try:
        from triton.backends.nvidia import driver as nvidia
    except ImportError:
        return False
    return hasattr(nvidia, "make_launcher")


def _specialization(launcher: Launcher, dtypes: tuple[torch.dtype, ...], sizes: tuple[int, ...]) -> str | None:
    """What Triton would compile for the kernel's first launch, as it serializes it (JSON), or
    None where it holds the kernel compiled already or this Triton does not say."""
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.runtime, "jit_cache_hook"):
        return None
    seen: list[str] = []

    def hook(**kwargs: Any) -> bool:
        seen.append(kwargs["compile"]["specialization_data"])
        return True  # compile nothing now

    saved = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        launcher.kernel.warmup(*dtypes, *sizes, grid=launcher.grid, **launcher.launch)
    except Exception:
        return None
    finally:
        knobs.runtime.jit_cache_hook = saved
    return seen[0] if seen else None


class CompilePool:
    """Processes running ``compile_worker.py``, each compiling one kernel at a time into
    Triton's cache; started as jobs need them, up to ``size``, and kept for the process's life
    (each ends when this process closes its input)."""

    def __init__(self, size: int) -> None:
        import queue
        import threading

        self.size = size
        self.idle: Any = queue.SimpleQueue()
        self.started = 0
        self.lock = threading.Lock()
        self.jobs = 0
        self.failures: list[str] = []  # the last workers' errors (the kernels were compiled here instead)

    def compile(self, kernel: Any, spec: str) -> bool:
        """Compile ``kernel`` (a ``@triton.jit`` function of a generated module) as ``spec``
        says; False where the worker failed (the caller compiles it itself)."""
        module = sys.modules.get(kernel.fn.__module__)
        if module is None or not getattr(module, "__file__", None):
            return False
        return self._run({"module": module.__name__, "path": module.__file__, "fn": kernel.fn.__name__,
                          "spec": spec, "target": _target()}, kernel.fn.__name__)

    def build_launcher(self, signature: tuple[Any, ...]) -> bool:
        """Build the C launcher of kernels with these argument types (Triton 3.6's), as the
        first load of such a kernel would; False where the worker failed."""
        return self._run({"launcher": list(signature)}, f"launcher {signature}")

    def _run(self, job: dict[str, Any], what: str) -> bool:
        import json
        import triton

        with self.lock:
            self.jobs += 1
            job = {"id": self.jobs, "cache_dir": triton.knobs.cache.dir, **job}
        worker = self._take()
        if worker is None:
            return False
        try:
            worker.stdin.write(json.dumps(job) + "\n")
            worker.stdin.flush()
            reply = json.loads(worker.stdout.readline())
        except Exception:  # a worker that died: another is started for the next job
            worker.kill()
            with self.lock:
                self.started -= 1
            return False
        self.idle.put(worker)
        if not reply.get("ok"):
            self.failures.append(f"{what}: {reply.get('error')}")
            del self.failures[:-20]
        return bool(reply.get("ok"))

    def _take(self) -> Any:
        import queue

        try:
            return self.idle.get_nowait()
        except queue.Empty:
            pass
        with self.lock:
            start = self.started < self.size
            if start:
                self.started += 1
        if not start:
            return self.idle.get()
        try:
            return self._start()
        except OSError:
            with self.lock:
                self.started -= 1
            return None

    def prestart(self) -> None:
        """Start every worker now (each imports Triton while this process traces the model)."""
        while True:
            with self.lock:
                if self.started >= self.size:
                    return
                self.started += 1
            try:
                self.idle.put(self._start())
            except OSError:
                with self.lock:
                    self.started -= 1
                return

    @staticmethod
    def _start() -> Any:
        import subprocess

        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        worker = os.path.join(package, "kernels", "compile_worker.py")
        return subprocess.Popen([sys.executable, worker, package], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)


def start_compile_workers(device: torch.device | None) -> None:
    """Start the worker processes of ``precompile`` ahead of the first graph that needs them
    (``compile_graph`` calls this before it lowers a graph on a GPU). Started while Dynamo
    traces, sixteen imports of Triton slowed its tracing of BERT by a second on an H200."""
    threads = config.compile_threads
    if device is not None and device.type == "cuda" and threads >= 2 and not use_interpreter():
        _worker_pool(threads).prestart()


def _target() -> dict[str, Any]:
    """The current device's compile target, as Triton describes it (its specialization data
    carries it from Triton 3.9 on, not in 3.6)."""
    from triton.runtime import driver

    return dict(vars(driver.active.get_current_target()))


@functools.cache
def _worker_pool(size: int) -> CompilePool:
    return CompilePool(size)


@functools.cache
def _thread_pool(threads: int) -> Any:
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fusebackend-compile")
