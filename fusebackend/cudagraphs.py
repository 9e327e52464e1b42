"""CUDA graphs for ``mode="reduce-overhead"``: each compiled graph's calls replay a recorded graph.

At small batches the GPU waits on the host, which launches one kernel or ATen call at a time.
Replaying a CUDA graph launches them all at once. fuse does not record graphs itself: it hands
each compiled graph's call to PyTorch's CUDA graph trees (``torch._inductor.cudagraph_trees``),
as Inductor's reduce-overhead mode and Dynamo's ``cudagraphs`` backend do. The trees give:

- a warm-up call first (where fuse compiles the graph and Triton its kernels), then a recording,
  then replays;
- static inputs (parameters and buffers; in a backward graph, what its forward saved) read where
  they are; every other input copied into the recording's own buffer, and only where its address
  is not that buffer's;
- one memory pool for a device's graphs, forward and backward, so a backward reads what its forward
  saved without a copy;
- a new recording for new ints among the inputs (a new size), and again where a static input has
  moved;
- in-place updates of static inputs (batch norm's running statistics) replayed; a graph that
  writes into any other input runs uncaptured, which the trees decide and log;
- outputs that live in the pool: a later replay of the same graph overwrites them. As Inductor
  documents for its mode, reading an output of a step after the next step has run raises an
  error; keep it with ``.clone()``, or call ``torch.compiler.cudagraph_mark_step_begin()`` where a
  new step begins that the trees cannot see.

What fuse decides, when it compiles each graph (``plan``): which inputs are static, and whether the
graph can be recorded at all. One that cannot runs as it would without the mode, and
``metrics.uncaptured`` says why, a line per graph: tensors on the CPU or on several devices, an op
PyTorch marks unsafe to record (one that synchronizes with the host), an input that is neither
a tensor nor an int, or a backward graph whose forward was not captured. The plan goes into
AOTAutograd's cache with the graph.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch
import torch.fx

from fusebackend import metrics


FORWARD_UNCAPTURED = "its forward graph runs uncaptured"


@dataclasses.dataclass(frozen=True)
class Capture:
    """How one compiled graph's calls are recorded and replayed, or why they are not."""

    kind: str  # forward, backward or inference
    device_index: int | None  # the CUDA device of the graph's tensors
    static_inputs: tuple[int, ...]  # inputs read in place (never copied into the recording's buffers)
    mutated_inputs: tuple[int, ...]  # inputs the graph writes into
    placeholders: tuple[Any, ...]  # the trees' description of the inputs, for their messages
    stack_traces: tuple[str | None, ...]  # each output's source line, for their messages
    skip: str | None  # why the graph runs uncaptured; None where it is recorded


def plan(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], kind: str, dynamo_inputs: int,
         forward: Capture | None = None) -> Capture:
    """The capture plan of AOTAutograd's graph ``gm`` (``kind``). ``dynamo_inputs``: how many
    inputs Dynamo's graph had (AOTAutograd may add parameters in front); ``forward``: a backward
    graph's forward plan."""
    from torch._dynamo.backends.cudagraphs import find_input_mutations, get_device_node_mapping, get_stack_traces
    from torch._inductor.cudagraph_utils import get_placeholder_info
    from torch._inductor.utils import count_tangents

    devices = get_device_node_mapping(gm)
    cuda = [d for d in devices if d.type == "cuda"]
    if kind == "backward":
        static = tuple(range(count_tangents(gm)))  # all but the tangents: saved by the forward, or parameters
    else:
        static = _static_forward_inputs(len(example_inputs) - dynamo_inputs)
    return Capture(
        kind=kind,
        device_index=cuda[0].index if cuda else None,
        static_inputs=static,
        mutated_inputs=tuple(sorted(find_input_mutations(gm.graph))),
        placeholders=tuple(get_placeholder_info(gm.graph)),
        stack_traces=tuple(get_stack_traces(gm)),
        skip=_why_not(gm, example_inputs, devices, forward),
    )


def _static_forward_inputs(lifted: int) -> tuple[int, ...]:
    """A forward graph's static inputs: those AOTAutograd's metadata marks (parameters and buffers,
    which Dynamo passes as inputs), or where it has none, the parameters AOTAutograd lifted."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    marked = getattr(meta, "static_input_indices", None)
    return tuple(marked) if marked is not None else tuple(range(max(lifted, 0)))


def _why_not(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], devices: dict[torch.device, Any],
             forward: Capture | None) -> str | None:
    from torch._inductor.cudagraph_utils import check_multiple_devices_or_any_cpu_nodes, format_default_skip_message
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    if forward is not None and forward.skip is not None:
        return FORWARD_UNCAPTURED
    if reason := check_multiple_devices_or_any_cpu_nodes(dict(devices)):
        return reason
    if node := get_first_incompatible_cudagraph_node(gm):
        return format_default_skip_message(f"an op that cannot be recorded ({node.name}: {node.target})")
    others = sorted({type(a).__name__ for a in example_inputs if not isinstance(a, (torch.Tensor, int, torch.SymInt))})
    if others:
        return format_default_skip_message(f"inputs that are neither tensors nor ints ({', '.join(others)})")
    return None


def wrap(run: Callable[[list[Any]], Any], capture: Capture, name: str) -> Callable[[list[Any]], Any]:
    """``run`` (a boxed call) replayed as a CUDA graph, or ``run`` itself where ``capture.skip``
    (recorded in ``metrics.uncaptured``)."""
    if capture.skip is not None:
        metrics.uncaptured[name] = capture.skip.split(". Found from", 1)[0]  # the log has the source lines
        from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

        log_cudagraph_skip_and_bump_counter(f"fusebackend: {name} runs uncaptured: {capture.skip}")
        if capture.kind == "backward" and capture.device_index is not None and capture.skip != FORWARD_UNCAPTURED:
            return _backward_beside_trees(run, capture.device_index)
        return run
    from torch._inductor.compile_fx import cudagraphify

    # recorded at the first call, with its inputs (their ints key the recordings)
    return cudagraphify(
        run,
        capture.static_inputs,
        device_index=capture.device_index,
        stack_traces=list(capture.stack_traces),
        is_backward=capture.kind == "backward",
        is_inference=capture.kind == "inference",
        placeholders=capture.placeholders,
        mutated_input_idxs=capture.mutated_inputs,
    )


def _backward_beside_trees(run: Callable[[list[Any]], Any], device_index: int) -> Callable[[list[Any]], Any]:
    """An uncaptured backward graph whose forward may have been recorded: the trees are told
    that the backward runs, so that the next forward starts a new step (as Dynamo's cudagraphs
    backend does)."""

    def call(inputs: list[Any]) -> Any:
        from torch._inductor.cudagraph_trees import get_manager

        manager = get_manager(device_index, create_if_none_exists=False)
        if manager is not None:
            manager.set_to_running_backward()
        return run(inputs)

    return call
