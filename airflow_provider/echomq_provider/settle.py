"""What becomes of a flow when Airflow ends the task waiting on it without running its code.

A waiting task (:class:`~echomq_provider.sensors.echo_flow.EchoFlowSensor`, or
:class:`~echomq_provider.operators.echo_flow.EchoFlowOperator` / ``@task.echo_flow`` with
``wait_for_completion``) settles its flow itself whenever its code runs: it closes it once
read, and cancels it when it gives up (a failed flow, a timeout, ``on_kill``, its trigger
cancelled while the task is marked failed). Airflow 3.1 to 3.3 also end task instances without
running any of that code:

=========================================================  ====================================
Airflow ends the task instance                              what Airflow runs then
=========================================================  ====================================
the scheduler fails it: an executor event that does not     the task's ``on_failure_callback``
match its state (a reschedule-mode sensor whose exit was    (``on_retry_callback`` when it has
seen after it was queued again: "finished with state        tries left), in the dag processor
success, but the task instance's state attribute is         (a ``TaskCallbackRequest``); only
queued"), no heartbeat for ``task_instance_heartbeat_       if the task has one
timeout`` (a lost worker), queued past ``task_queued_
timeout``
marked failed (UI, REST API) while nothing of it runs:      nothing of the task: Airflow runs no
reschedule mode between two pokes, up for retry, queued     task callback for a state set by
                                                            hand; the run then fails, and the
                                                            DAG's ``on_failure_callback`` runs in
                                                            the dag processor
its process killed from outside (SIGKILL, out of memory)   nothing of the task (its supervisor
                                                            reports the failure); the run fails
=========================================================  ====================================

So every waiting task carries two callbacks, added beside the user's own: :func:`on_task_failure`
in its ``on_failure_callback`` and :func:`on_dag_run_failure` in its DAG's (added when the task
is created inside the DAG). Both apply one rule, :func:`settle_action`, to the flow's state
read at that moment: a flow still held (or failed) is cancelled (``cancel_on_failure``), a
released barrier flow nobody closed is closed (``close_flow``; its results stay readable for
the ``closed`` retention, so a cleared sensor reads it again), anything else is left. A flow
the reader cannot take (``return_values`` over ``max_values``) is left as it is: a reader's
misconfiguration never cancels the work. No retry callback is added: the next try waits on
the same flow. The rule reads state, so running it twice, or after the task's own code settled
the flow, changes nothing.

The dag processor runs a callback when it gets to it, seconds or minutes later; a task cleared
meanwhile waits on its flow again. So every try of an adding or waiting task in a cleared run
records the run's clear number on the flow (its epoch, :meth:`echomq_core.EchoMQ.note_epoch`:
the adding task before it repairs the flow, a waiting task at its first read), and a callback
run in the dag processor leaves a flow whose epoch is above the clear number its own context
carries (the run as it was when the task failed): a newer attempt has taken the flow up. The
rest of this paragraph is about a callback that comes after the clear but before the newer
attempt started. So there (on Airflow 3.2 and 3.3, whose dag processor can
read task states) a callback first reads the task instance's state and leaves the flow to a
task that is no longer failed (queued, running, up for retry, ...). Airflow 3.1's dag processor
cannot read it, and a failed run is often cleared at once: there the DAG's callback closes a
released flow but leaves a held one (its children still run; ``echomq flow cancel`` stops
them), while the task's callback, sent the moment the scheduler fails the task, settles as on
3.2.

Mapped waiting tasks (``.expand()``) are not covered by either callback: Airflow builds them
without running their ``__init__``; they settle their flows only from their own code.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from echomq_core import EchoMQError

from ._compat import AIRFLOW_3_2, clear_number, task_state
from .hooks.echomq import EchoMQHook
from .waiting import FlowWaiting

if TYPE_CHECKING:
    from echomq_core import FlowSnapshot

log = logging.getLogger(__name__)

#: States of a task instance done with its flow: a failure callback may settle the flow.
DONE = frozenset({"failed", "upstream_failed", "skipped", "success", "removed"})


def settle_action(
    snap: FlowSnapshot,
    *,
    cancel_on_failure: bool,
    close_flow: bool,
    return_values: bool,
    max_values: int,
) -> str | None:
    """What a failed waiting task's callback does to its flow: ``"cancel"``, ``"close"`` or
    None (leave it). See the module doc."""
    if snap.outcome in ("missing", "cancelled"):
        return None
    if return_values and snap.total > max_values:
        return None  # the reader is misconfigured; a fixed reader reads the flow
    if snap.outcome in ("waiting", "failed"):
        return "cancel" if cancel_on_failure else None
    if snap.parent_state == "released":  # a barrier flow nobody closed
        return "close" if close_flow else None
    return None


def on_task_failure(context: Any) -> None:
    """A waiting task's ``on_failure_callback``: settle its flow (see the module doc)."""
    task = context.get("task")
    if isinstance(task, FlowWaiting):
        settle_flow(task, context, "the task failed")


def on_dag_run_failure(context: Any) -> None:
    """A DAG's ``on_failure_callback``: settle the flow of each of its waiting tasks."""
    dag = context.get("dag")
    for task in getattr(dag, "tasks", ()):
        if isinstance(task, FlowWaiting):
            try:
                settle_flow(task, context, "the DAG run failed", run_failed=True)
            except Exception:  # one task's flow must not keep the others' unsettled
                log.exception("Could not settle the flow of %s", task.task_id)


def settle_flow(task: FlowWaiting, context: Any, why: str, *, run_failed: bool = False) -> None:
    """Settle ``task``'s flow once Airflow failed it, by :func:`settle_action`: in the task
    process, or in the dag processor where none of its code ran (``run_failed``: the DAG's
    callback). Never raises for EchoMQ's errors: it logs them. A task that does not wait (the
    operator without ``wait_for_completion``) leaves its flow to the task that waits on it."""
    if not task._settles:
        return
    try:
        queue, parent_id = task._callback_ref(context)
    except Exception as exc:  # an upstream that never ran, a template that needs more
        task.log.info("No flow to settle (%s: %s)", type(exc).__name__, exc)
        return
    may_cancel = True
    if task._ti_for_kill is None:  # not run here: the dag processor, when it gets to it
        if AIRFLOW_3_2:  # a clear may have come first: the task waits on its flow again
            map_index = task._map_index(context)
            state = task_state(task.dag_id, context["run_id"], task.task_id, map_index)
            if state is not None and state not in DONE:
                task.log.info("%s", left_to_task(task, state, queue, parent_id))
                return
        else:  # 3.1 cannot tell; a run that failed is often cleared at once: no cancel
            may_cancel = not run_failed
    hook = EchoMQHook(task.echomq_conn_id, prefix=task.prefix)
    try:
        client = hook.get_conn()
        mine = clear_number(context) if task._ti_for_kill is None else None
        epoch = client.note_epoch(queue, parent_id) if mine is not None else None
        if mine is not None and epoch is not None and epoch > mine:
            task.log.info(
                "Flow %s left to a newer attempt of the run: %s when the run had been "
                "cleared %d times; taken up since by the attempt after clear %d",
                parent_id,
                why,
                mine,
                epoch,
            )
            return
        snap = client.snapshot(queue, parent_id)
        action = settle_action(
            snap,
            cancel_on_failure=task.cancel_on_failure,
            close_flow=task.close_flow,
            return_values=task.return_values,
            max_values=task.max_values,
        )
        if action == "cancel" and not may_cancel:
            task.log.info(
                "Flow %s left %s: Airflow 3.1 cannot tell whether the task was cleared since",
                parent_id,
                snap.outcome,
            )
        elif action == "cancel":
            reason = f"{task._kind()} {task.task_id}: {why} ({snap.outcome})"
            result = client.cancel_flow(queue, parent_id, reason=reason[:1000])
            task.log.info(
                "Flow %s cancelled (%s): %d children stopped before they started",
                parent_id,
                why,
                result.children,
            )
        elif action == "close":
            state = client.close_flow(queue, parent_id)
            task.log.info("Flow %s %s (%s): its retention runs from now", parent_id, state, why)
    except EchoMQError as exc:
        task.log.error("Could not settle flow %s: %s: %s", parent_id, type(exc).__name__, exc)
    finally:
        hook.close()


def left_to_task(task: FlowWaiting, state: str, queue: str, parent_id: str) -> str:
    """What a callback that leaves the flow to a task no longer failed logs. "Left to it" only
    when the server holds the flow (an earlier try added it); the first try that failed before
    adding anything (a connection not defined, a plan that raised) has no flow to leave, and
    saying it had one sends the reader looking for a flow that never was."""
    hook = EchoMQHook(task.echomq_conn_id, prefix=task.prefix)
    try:
        outcome = hook.get_conn().snapshot(queue, parent_id).outcome
    except Exception as exc:  # the callback never raises; the log says what it could not read
        return (
            f"Task {task.task_id} is {state}; whether an earlier try added flow {parent_id} "
            f"could not be read ({type(exc).__name__}: {exc}): nothing settled"
        )
    finally:
        hook.close()
    if outcome == "missing":
        return (
            f"Task {task.task_id} is {state}; no flow {parent_id} in queue {queue!r} (no "
            "earlier try added it): nothing to settle"
        )
    return f"Task {task.task_id} is {state} again: flow {parent_id} left to it ({outcome})"


def install(task: Any) -> None:
    """Add :func:`on_task_failure` to ``task``'s failure callbacks and
    :func:`on_dag_run_failure` to its DAG's (once), keeping those already there."""
    callbacks = list(task.on_failure_callback or ())
    if on_task_failure not in callbacks:
        task.on_failure_callback = [*callbacks, on_task_failure]
    dag = task.dag if task.has_dag() else None
    if dag is None:
        return
    existing = dag.on_failure_callback
    dag_callbacks = list(existing) if isinstance(existing, list) else [existing] if existing else []
    if on_dag_run_failure not in dag_callbacks:
        dag.on_failure_callback = [*dag_callbacks, on_dag_run_failure]
        dag.has_on_failure_callback = True  # computed once, when the DAG was made
