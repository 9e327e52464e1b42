"""A process that compiles generated kernels into Triton's cache: ``runtime.CompilePool``'s worker.

Run as a script (``python compile_worker.py PACKAGE_ROOT``), not as a module of the package, so
that it imports Triton and the kernel modules only: ``fusebackend/__init__.py`` and torch are never
imported (a worker starts in a fraction of a second, and creates no CUDA context: the target is
given, not asked of a device). It reads one JSON job a line on stdin and answers one JSON line on
stdout: ``{"id", "module", "path", "fn", "spec", "cache_dir", "target"}`` -> ``{"id", "ok", "error"}``.
A job ``{"id", "launcher", "cache_dir"}`` builds the C launcher of a signature (a list of argument
types) instead, where Triton builds one per signature (3.6 does, with a C compiler).

``spec`` is what Triton's ``jit_cache_hook`` was given when the parent specialized the kernel
for its first launch (``serialize_specialization_data``: the signature, constexprs, attributes,
compile options and target). The worker compiles exactly that with ``triton.compile``, which
writes the binary to Triton's cache; the parent's own compile of the kernel then finds it there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types


def _packages(root: str) -> None:
    """``fusebackend`` and ``fusebackend.kernels`` as bare packages: their submodules import,
    their ``__init__`` files (which import torch) do not run."""
    for name, path in (("fusebackend", root), ("fusebackend.kernels", os.path.join(root, "kernels"))):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [path]
            sys.modules[name] = module


def _module(name: str, path: str) -> types.ModuleType:
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def _as_tuple(value: object) -> object:
    """JSON gave lists where Triton had tuples (nested ones included)."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list) else value


def compile_job(job: dict) -> None:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if job.get("cache_dir"):
        triton.knobs.cache.dir = job["cache_dir"]  # the parent's Triton cache
    fn = getattr(_module(job["module"], job["path"]), job["fn"])
    data = json.loads(job["spec"])

    def constant(value: object) -> object:
        if isinstance(value, dict) and "constexpr" in value:
            return tl.constexpr(_as_tuple(value["constexpr"]))
        if isinstance(value, str) and tl.dtype.is_dtype(value):
            return tl.dtype(value)
        return _as_tuple(value)

    constexprs = {tuple(k): constant(v) for k, v in zip(data["constant_keys"], data["constant_vals"])}
    attrs = {tuple(k): v for k, v in zip(data["attrs_keys"], data["attrs_vals"])}
    signature = {k: _as_tuple(v) for k, v in data["signature"].items()}
    options = {k: _as_tuple(v) for k, v in data["options"].items()}
    source = ASTSource(fn, signature, constexprs, attrs)
    target = data.get("target") or job["target"]  # in the specialization from Triton 3.9 on
    triton.compile(source, target=GPUTarget(**target), options=options)


def build_launcher(job: dict) -> None:
    """Triton's C launcher for one kernel signature, into Triton's cache, where the parent's
    first load of a kernel with that signature finds it (as Triton 3.6's ``CudaLauncher`` builds
    it: only the argument types decide its source)."""
    import triton
    from triton.backends.nvidia import driver as nvidia
    from triton.runtime.build import compile_module_from_src

    if job.get("cache_dir"):
        triton.knobs.cache.dir = job["cache_dir"]
    signature = {i: _as_tuple(t) for i, t in enumerate(job["launcher"])}
    source = nvidia.make_launcher({}, signature, None)
    compile_module_from_src(src=source, name="__triton_launcher", library_dirs=nvidia.library_dirs(),
                            include_dirs=nvidia.include_dirs, libraries=nvidia.libraries)


def main() -> None:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
    _packages(sys.argv[1])
    from fusebackend.config import config

    config.interpret = False  # the helpers as compiled kernels use them (triton_helpers, imported later)
    for line in sys.stdin:
        job = json.loads(line)
        try:
            build_launcher(job) if "launcher" in job else compile_job(job)
            reply = {"id": job["id"], "ok": True, "error": ""}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which compiles it itself
            reply = {"id": job["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
