"""What each step of this process added: the barrier flows ``EchoMQResource.add_flow`` added,
by (run id, step key), until the step's output stores them.

Why: a step's output is checked only in ``EchoMQIOManager.handle_output``, after the step has
added its flows (a range step returns ``{partition: FlowRef}``, and only then can one see that
it named the wrong partitions). When the IO manager refuses an output, the flows that step
added have no handle and no reader; it cancels them (:func:`take`), so nothing is left
fanned out for a step that failed. A flow stored under a handle is dropped from the record
(:func:`stored`): a later refusal of another output of the same step must not cancel it.

Why per process and not on the resource: the IO manager is another object than the resource,
and a step's compute and its ``handle_output`` always run in one process (the in-process
executor's, or the step process of the multiprocess executor), with Dagster's current
execution context in scope for the compute (``OpExecutionContext.get()``). A flow added
outside a step's compute (a thread of its own, a script) is not recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from dagster import OpExecutionContext

from echomq_core import FlowRef

_lock = threading.Lock()
#: (run id, step key) -> {(queue, parent id): flow}, in the order the step added them.
_added: dict[tuple[str, str], dict[tuple[str, str], FlowRef]] = {}


def current_step() -> tuple[str, str] | None:
    """(run id, step key) of the step whose compute is running here, or None outside one."""
    try:
        context = OpExecutionContext.get()
        return context.run_id, context.get_step_execution_context().step.key
    except Exception:  # no execution context in scope: a script, a thread of the step's own
        return None


def record(flow: FlowRef) -> None:
    """Note that the current step (if any) added ``flow``."""
    step = current_step()
    if step is None:
        return
    with _lock:
        _added.setdefault(step, {})[(flow.queue, flow.parent_id)] = flow


def stored(run_id: str, step_key: str, flows: Iterable[FlowRef]) -> None:
    """``flows`` now have a handle: a refusal no longer cancels them."""
    with _lock:
        added = _added.get((run_id, step_key))
        if added is None:
            return
        for flow in flows:
            added.pop((flow.queue, flow.parent_id), None)
        if not added:
            del _added[(run_id, step_key)]


def take(run_id: str, step_key: str) -> list[FlowRef]:
    """The flows the step added and no output stored, forgotten from now on."""
    with _lock:
        return list(_added.pop((run_id, step_key), {}).values())


def forget_run(run_id: str) -> None:
    """Drop what the steps of ``run_id`` added (the run's resources are torn down)."""
    with _lock:
        for key in [k for k in _added if k[0] == run_id]:
            del _added[key]
