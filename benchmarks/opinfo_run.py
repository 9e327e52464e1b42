"""The OpInfo sweep: every op of PyTorch's ``op_db`` with float32 samples, compiled with
``backend="fuse"`` and compared with eager on the same inputs.

``run_op(op)`` takes an OpInfo's first samples (two by default) on which eager runs, compiles a
function calling the op with ``torch.compile(fn, backend="fuse", fullgraph=False)`` afresh for
each sample, and returns an ``OpResult`` on two axes:

- ``status``, the outputs against eager's: ``match``, ``mismatch``, ``error`` (the compiled call
  raised where eager did not), ``timeout`` (the op ran past its time limit), ``skipped`` (eager
  raised on every sample, or there was none);
- ``kind``, what the backend did with it: ``eager_graph`` (a graph fell back to running eagerly:
  ``fusebackend.metrics.eager_graphs``), else ``kernels`` (kernels were generated for some
  sample), else ``aten_only`` (graphs compiled, every op an ATen call), else ``no_graph`` (Dynamo
  handed the backend no graph: the op ran in Python).

The test ``tests/test_opinfo.py`` asserts on these per op; ``python -m benchmarks.opinfo`` runs
every op and prints the figures and lists. This lives under ``benchmarks/`` because that is the
package both the tests and a ``python -m`` CLI import from (``tests/`` is not a package).

Outputs whose values are undefined are compared on structure, shape and dtype only: see
``METADATA_ONLY``. As a safety net, a sample whose eager outputs differ between two eager calls
(seeded differently) is compared the same way and marked ``varies``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import signal
import time
import warnings
from typing import Any, Callable, Iterator

import torch
from torch.utils import _pytree as pytree
import torch._dynamo
import torch._dynamo.utils

import fusebackend

# Why each op is compared on metadata only. Uninitialized: the output's values are whatever the
# allocator returned. Random: values come from a generator, and ours (Triton's counter-based one)
# is not eager's, so only the structure, shapes and dtypes can agree. Ops random in some samples
# only are left to the probe in ``_run_sample`` (eager called twice): today
# nn.functional.multi_head_attention_forward (its second sample trains, with dropout) and
# nn.functional.scaled_dot_product_attention (its fourth sample has dropout_p=0.5).
METADATA_ONLY: dict[str, str] = {
    "empty": "uninitialized output",
    "empty_like": "uninitialized output",
    "empty_strided": "uninitialized output",
    "empty_permuted": "uninitialized output",
    "new_empty": "uninitialized output",
    "new_empty_strided": "uninitialized output",
    "resize_": "uninitialized output (the grown part)",
    "resize_as_": "uninitialized output (the grown part)",
    "bernoulli": "random",
    "cauchy": "random",
    "exponential": "random",
    "geometric": "random",
    "log_normal": "random",
    "normal": "random",
    "normal.in_place": "random",
    "normal.number_mean": "random",
    "uniform": "random",
    "multinomial": "random",
    "rand_like": "random",
    "randn": "random",
    "randn_like": "random",
    "randint": "random",
    "randint_like": "random",
    "nn.functional.dropout": "random",
    "nn.functional.dropout2d": "random",
    "nn.functional.dropout3d": "random",
    "nn.functional.alpha_dropout": "random",
    "nn.functional.feature_alpha_dropout.with_train": "random",
    "nn.functional.rrelu": "random (its samples use training=True)",
    "nn.functional.fractional_max_pool2d": "random (pooling regions are sampled)",
    "nn.functional.fractional_max_pool3d": "random (pooling regions are sampled)",
    "svd_lowrank": "random (a random projection)",
    "pca_lowrank": "random (a random projection)",
}

# fp32 tolerances (rtol, atol). Tight is torch.testing's own for float32: a few units in the last
# place, which any correct elementwise computation meets. Where the compiled graph reduces (sums,
# means, norms, softmax, matrix products, scans), the backend adds the terms in another order than
# ATen, and decompositions (softmax as amax/exp/sum/div, var as mean then sum of squares) change
# the order again: each reordering costs up to about n * eps of the sum of the terms' magnitudes,
# and with op_db's values (up to ~10) and rows of up to a few hundred that reaches 1e-5 relative
# and 1e-4 absolute where terms cancel. Such samples get the looser pair.
TIGHT = (1.3e-6, 1e-5)
REDUCTION = (1e-5, 1e-4)
OTHER_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.complex128: (1e-7, 1e-7),
    # half types are computed in fp32 and rounded once; eager rounds after every op
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}

# ATen ops (as the compiled graph spells them) whose result depends on the order of a sum.
_REDUCING = re.compile(
    r"aten\.(_?(sum|nansum|prod|mean|nanmean|var|std|var_mean|std_mean|norm|linalg_vector_norm|"
    r"logsumexp|cumsum|cumprod|logcumsumexp|mm|bmm|addmm|baddbmm|addbmm|addmv|dot|vdot|mv|"
    r"convolution|softmax|log_softmax|safe_softmax|native_layer_norm|native_group_norm|"
    r"native_batch_norm|native_batch_norm_legit|native_batch_norm_legit_no_training|"
    r"scatter_add|scatter_reduce|index_add|index_put|index_reduce|embedding_bag|"
    r"avg_pool\dd|adaptive_avg_pool\dd|cdist_forward|pdist_forward|segment_reduce|"
    r"linalg_\w+|_linalg_\w+|cholesky\w*|triangular_solve|fft_\w+|_fft_\w+|einsum|kl_div|"
    r"mse_loss|l1_loss|nll_loss\w*|binary_cross_entropy\w*|smooth_l1_loss|huber_loss|"
    r"upsample_\w+|grid_sampler_\dd|_upsample_\w+|trace|dist|renorm|histc)\b)"
)

DEFAULT_SAMPLES = 2
DEFAULT_TIME_LIMIT = 120.0  # seconds per op: the slowest ops here take ~30 s
_SAMPLES_SCANNED = 16  # samples looked at for ones eager can run, at most


@dataclasses.dataclass
class OpResult:
    """What one op did: see the module docstring for ``status`` and ``kind``."""

    name: str
    status: str
    kind: str
    samples: int = 0  # samples compiled and compared
    seconds: float = 0.0
    graphs: int = 0  # graphs compiled by the backend, summed over samples
    kernels: int = 0
    eager_graphs: int = 0
    cache_hits: int = 0  # graphs loaded from fuse's on-disk cache (a warm run: opinfo.py --warm)
    cache_misses: int = 0  # graphs compiled and stored there
    fallbacks: list[str] = dataclasses.field(default_factory=list)  # ATen ops left as calls
    compared: str = "values"  # or why only structure, shapes and dtypes were compared
    problems: list[str] = dataclasses.field(default_factory=list)  # per sample, one line each
    warnings: list[str] = dataclasses.field(default_factory=list)  # first lines, the backend's first
    graph_breaks: list[str] = dataclasses.field(default_factory=list)  # Dynamo's reasons
    notes: list[str] = dataclasses.field(default_factory=list)


class OpTimeout(BaseException):
    """Raised by the per-op alarm. A BaseException, so that the backend's own ``except
    Exception`` (which runs a failing graph eagerly) does not swallow it."""


def op_name(op: Any) -> str:
    """An OpInfo's name with its variant, as the test ids and the report spell it."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def float32_ops(device: str = "cpu") -> list[Any]:
    """Every OpInfo of ``op_db`` whose supported dtypes on ``device`` include float32."""
    # Importing op_db freezes torch.backends' global flags (PyTorch's test harness wants them
    # set through context managers only); give them back, so that other code in this process
    # may still set e.g. torch.backends.cudnn.allow_tf32.
    frozen = torch.backends.flags_frozen()
    from torch.testing._internal.common_methods_invocations import op_db

    if not frozen:  # the flag is a global of torch.backends' own module (the attribute is a wrapper's)
        torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
    device_type = torch.device(device).type
    return [op for op in op_db if torch.float32 in op.supported_dtypes(device_type)]


def ensure_backend() -> None:
    """Register ``backend="fuse"`` where the package is on the path but not installed."""
    try:
        torch._dynamo.lookup_backend("fuse")
    except Exception:
        torch._dynamo.register_backend(name="fuse")(fusebackend.fuse)


def first_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else ""


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(str(exc))}"


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``OpTimeout`` inside the block after ``seconds`` (main thread only; elsewhere, or
    with ``None``, no limit). Python code is interrupted between bytecodes, which is where the
    interpreted kernels and the compiler spend their time."""
    if not seconds or not _in_main_thread():
        yield
        return

    def _alarm(signum: int, frame: Any) -> None:
        raise OpTimeout(f"over the time limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def clone(obj: Any) -> Any:
    """A deep copy of a sample's inputs that keeps every tensor's sizes, strides and storage
    offset (a transposed or sliced input stays one), so eager and compiled calls get equal,
    separate inputs (some ops write into theirs)."""
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.is_conj() or obj.is_neg() or obj.is_quantized:
            return obj.clone()
        with torch.no_grad():
            out = torch.empty((0,), dtype=obj.dtype, device=obj.device)
            out.set_(obj.untyped_storage().clone(), obj.storage_offset(), obj.size(), obj.stride())
        return out.requires_grad_(obj.requires_grad) if obj.is_leaf else out
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*[clone(x) for x in obj])
    if isinstance(obj, (list, tuple)):
        return type(obj)(clone(x) for x in obj)
    if isinstance(obj, dict):
        return {k: clone(v) for k, v in obj.items()}
    return obj


def compare(actual: Any, expected: Any, tolerance: tuple[float, float] | None, where: str = "output") -> str | None:
    """None when ``actual`` matches eager's ``expected``, else one line saying where and how.

    Same structure (tuples, lists, dicts, return types), same tensor shapes, dtypes and layouts;
    with ``tolerance`` (fp32's rtol, atol) also the values: NaN equal to NaN, integers and
    booleans exact, other floating dtypes by ``OTHER_TOLERANCE``. ``tolerance=None`` compares
    metadata only.
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{where}: {type(actual).__name__}, eager a tensor"
        meta_a, meta_e = _meta(actual), _meta(expected)
        if meta_a != meta_e:
            return f"{where}: {meta_a}, eager {meta_e}"
        if tolerance is None or expected.numel() == 0:
            return None
        return _compare_values(actual, expected, tolerance, where)
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{where}: {_shape_of(actual)}, eager {_shape_of(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            problem = compare(a, e, tolerance, f"{where}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            return f"{where}: {_shape_of(actual)}, eager {_shape_of(expected)}"
        for k in expected:
            problem = compare(actual[k], expected[k], tolerance, f"{where}[{k!r}]")
            if problem:
                return problem
        return None
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        if tolerance is None or (math.isnan(expected) and math.isnan(actual)):
            return None
        rtol, atol = tolerance
        return None if math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol) else f"{where}: {actual} != {expected}"
    if type(actual) is not type(expected) and not (isinstance(actual, (int, float)) and isinstance(expected, (int, float))):
        return f"{where}: {type(actual).__name__}, eager {type(expected).__name__}"
    if tolerance is not None and actual != expected:
        return f"{where}: {actual!r} != {expected!r}"
    return None


def _meta(t: torch.Tensor) -> str:
    return f"{t.dtype} {list(t.shape)} {t.layout} {t.device.type}"


def _shape_of(obj: Any) -> str:
    if isinstance(obj, (list, tuple)):
        return f"{type(obj).__name__} of {len(obj)}"
    if isinstance(obj, dict):
        return f"dict of {sorted(map(str, obj))}"
    return type(obj).__name__


def _compare_values(actual: torch.Tensor, expected: torch.Tensor, tolerance: tuple[float, float], where: str) -> str | None:
    actual, expected = actual.detach(), expected.detach()
    if expected.layout != torch.strided:
        actual, expected = actual.to_dense(), expected.to_dense()
    if expected.is_conj() or expected.is_neg():
        expected = expected.resolve_conj().resolve_neg()
    if actual.is_conj() or actual.is_neg():
        actual = actual.resolve_conj().resolve_neg()
    if not (expected.dtype.is_floating_point or expected.dtype.is_complex):
        if torch.equal(actual, expected):
            return None
        bad = int((actual != expected).sum())
        return f"{where}: {bad} of {expected.numel()} elements differ ({expected.dtype})"
    rtol, atol = tolerance if expected.dtype in (torch.float32, torch.complex64) else OTHER_TOLERANCE.get(expected.dtype, tolerance)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
    except AssertionError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return f"{where}: " + "; ".join(lines[1:4] if len(lines) > 1 else lines)
    return None


def _reduces() -> bool:
    """Whether a graph compiled since the last ``dump.clear()`` sums in an order of its own."""
    return any(_REDUCING.search(a.aten_graph) for a in fusebackend.history())


@contextlib.contextmanager
def plain_seed_wrapper() -> Iterator[None]:
    """Inside the block, op_db's ``wrapper_set_seed(fn, *args)`` just calls ``fn(*args)``.

    op_db wraps its random ops (and a few others, such as ``item``) in it; its
    ``freeze_rng_state`` is a context manager Dynamo cannot trace, so without this those ops
    would graph-break and never reach the backend. The op's lambda reads the name from its
    module's globals at call time, so swapping the module attribute is enough. Seeding is ours:
    each call here sets its seed itself.
    """
    import sys

    from torch.testing._utils import wrapper_set_seed

    def call_through(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    patched = [m for name, m in list(sys.modules.items())
               if name.startswith("torch.testing._internal") and getattr(m, "wrapper_set_seed", None) is wrapper_set_seed]
    for module in patched:
        module.wrapper_set_seed = call_through
    try:
        yield
    finally:
        for module in patched:
            module.wrapper_set_seed = wrapper_set_seed


def _eager_call(op: Any, sample: Any, seed: int) -> tuple[Any, Any]:
    """The op's outputs, and its inputs after the call (in-place ops write into them)."""
    inputs = clone((sample.input, tuple(sample.args), dict(sample.kwargs)))
    torch.manual_seed(seed)
    return op.op(inputs[0], *inputs[1], **inputs[2]), inputs


def _compiled_call(op: Any, sample: Any) -> tuple[Any, Any]:
    fn_op = op.op

    def call(inp: Any, args: tuple, kwargs: dict) -> Any:
        return fn_op(inp, *args, **kwargs)

    inputs = clone((sample.input, tuple(sample.args), dict(sample.kwargs)))
    torch.manual_seed(0)
    compiled = torch.compile(call, backend="fuse", fullgraph=False)
    return compiled(*inputs), inputs


def run_op(op: Any, device: str = "cpu", samples: int = DEFAULT_SAMPLES,
           limit: float | None = DEFAULT_TIME_LIMIT) -> OpResult:
    """Compile ``op`` on its first ``samples`` samples that eager runs; compare; classify."""
    ensure_backend()
    name = op_name(op)
    result = OpResult(name=name, status="skipped", kind="no_graph",
                      compared=METADATA_ONLY.get(name, "values"))
    statuses: list[str] = []
    warning_lines: list[str] = []
    fallbacks: set[str] = set()
    start = time.perf_counter()
    try:
        # warnings from making samples and from eager are PyTorch's; the compiled call records its own
        with time_limit(limit), plain_seed_wrapper(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            for index, sample in enumerate(op.sample_inputs(device, torch.float32)):
                if result.samples >= samples or index >= _SAMPLES_SCANNED:
                    break
                status = _run_sample(op, sample, index, result, warning_lines, fallbacks)
                if status is not None:
                    statuses.append(status)
                    result.samples += 1
    except OpTimeout as exc:
        statuses.append("timeout")
        result.problems.append(f"after {result.samples} samples: {exc}")
    finally:
        torch._dynamo.reset()
    result.seconds = round(time.perf_counter() - start, 3)
    result.fallbacks = sorted(fallbacks)
    backend_first = sorted(set(warning_lines), key=lambda w: (not w.startswith("fusebackend"), warning_lines.index(w)))
    result.warnings = backend_first
    for status in ("mismatch", "error", "timeout", "match"):
        if status in statuses:
            result.status = status
            break
    if result.eager_graphs:
        result.kind = "eager_graph"
    elif result.kernels:
        result.kind = "kernels"
    elif result.graphs:
        result.kind = "aten_only"
    return result


def _run_sample(op: Any, sample: Any, index: int, result: OpResult, warning_lines: list[str],
                fallbacks: set[str]) -> str | None:
    """One sample: eager twice (seeds 0 and 1), then compiled; None if eager raised."""
    try:
        expected = _eager_call(op, sample, seed=0)
        again = _eager_call(op, sample, seed=1)
    except Exception:
        return None
    metadata_only = result.name in METADATA_ONLY
    if not metadata_only and compare(again[0], expected[0], (0.0, 0.0)) is not None:
        metadata_only = True  # eager varies from call to call: random or uninitialized values
        result.notes.append(f"sample {index}: eager's outputs vary between calls; compared metadata only")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    fusebackend.metrics.reset()
    fusebackend.dump.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            actual: Any = _compiled_call(op, sample)
            raised: BaseException | None = None
        except Exception as exc:
            raised = exc
    m = fusebackend.metrics
    result.graphs += m.graphs_compiled
    result.kernels += m.kernels_generated
    result.eager_graphs += m.eager_graphs
    result.cache_hits += m.cache_hits
    result.cache_misses += m.cache_misses
    fallbacks.update(m.fallbacks)
    warning_lines.extend(first_line(str(w.message)) for w in caught)
    for reason in torch._dynamo.utils.counters["graph_break"]:
        line = first_line(str(reason))
        if line not in result.graph_breaks:
            result.graph_breaks.append(line)
    if raised is not None:
        result.problems.append(f"sample {index}: {describe_error(raised)}")
        return "error"
    if metadata_only:
        tolerance = None
    else:
        tolerance = REDUCTION if _reduces() else TIGHT
    # outputs, then the inputs as the call left them
    problem = compare(actual[0], expected[0], tolerance) or compare(actual[1], expected[1], tolerance, "input")
    if problem is None and tolerance is REDUCTION and compare(actual, expected, TIGHT) is not None:
        result.notes.append(f"sample {index}: within the reduction tolerance only")
    if problem is not None and tolerance is not None and _no_further_from_float64(op, sample, actual[0], expected[0]):
        result.notes.append(f"sample {index}: differs from eager, but is no further from a float64 run than twice "
                            f"eager's distance ({problem})")
        problem = None
    if problem is not None:
        result.problems.append(f"sample {index}: {problem}")
        return "mismatch"
    return "match"


def _no_further_from_float64(op: Any, sample: Any, actual: Any, expected: Any) -> bool:
    """Whether every floating output is no further from the op run in float64 than twice eager's
    float32 distance, elementwise, plus fp32's tight tolerance: where eager itself is inexact (a
    special function near a pole, say), a closer answer is not a wrong one."""
    widen = lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
    try:
        inputs = pytree.tree_map(widen, clone((sample.input, tuple(sample.args), dict(sample.kwargs))))
        torch.manual_seed(0)
        exact = op.op(inputs[0], *inputs[1], **inputs[2])
    except Exception:
        return False
    got, want, ref = pytree.tree_leaves(actual), pytree.tree_leaves(expected), pytree.tree_leaves(exact)
    if not (len(got) == len(want) == len(ref)):
        return False
    rtol, atol = TIGHT
    for a, e, x in zip(got, want, ref):
        if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor) and isinstance(x, torch.Tensor)):
            continue
        if not e.is_floating_point() or a.shape != e.shape:
            return False
        x = x.double()
        fuse_err = (a.double() - x).abs().nan_to_num(0.0)
        eager_err = (e.double() - x).abs().nan_to_num(0.0)
        if not bool((fuse_err <= 2 * eager_err + atol + rtol * x.abs()).all()):
            return False
        if not torch.equal(torch.isnan(a), torch.isnan(e)):
            return False
    return True


def run_ops(ops: list[Any], device: str = "cpu", samples: int = DEFAULT_SAMPLES,
            limit: float | None = DEFAULT_TIME_LIMIT,
            progress: Callable[[OpResult, int, int], None] | None = None) -> list[OpResult]:
    """``run_op`` over ``ops`` in order; ``progress(result, i, n)`` after each."""
    results = []
    for i, op in enumerate(ops):
        results.append(run_op(op, device, samples, limit))
        if progress is not None:
            progress(results[-1], i + 1, len(ops))
    return results
