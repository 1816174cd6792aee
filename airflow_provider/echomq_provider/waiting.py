"""One home for waiting on a flow and for what a task returns once it is released.

Two kinds of task wait on a flow: :class:`~echomq_provider.sensors.echo_flow.EchoFlowSensor`
(a flow another task added) and :class:`~echomq_provider.operators.echo_flow.EchoFlowOperator`
with ``wait_for_completion=True`` (and ``@task.echo_flow``), which waits on the flow it has just
added - one task where the sensor makes two. :class:`FlowWaiting` is what they share: reading
the flow (each read judged, and the operator's next pause set, by the core's
:class:`~echomq_core.flows.waiting.FlowWait`; fail fast on a failed or cancelled parent), the return
value once it is released (the summary, or the values with the summary under the XCom key
:data:`FLOW_KEY`), resuming from :class:`~echomq_provider.triggers.echo_flow.EchoFlowTrigger`'s
event, the progress line, and cancelling the flow when the task gives up on it
(``cancel_on_failure``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from echomq_core import (
    EchoMQ,
    EchoMQError,
    FlowCancelled,
    FlowSnapshot,
    InvalidInput,
    JobNotFound,
    ParentFailed,
)
from echomq_core.checks import check_int
from echomq_core.errors import flow_error
from echomq_core.flows.reads import not_found
from echomq_core.flows.waiting import FAILED, MISSING, FlowWait, Verdict

from . import settle
from ._compat import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    clear_number,
    conf,
    listeners_registered,
    task_state,
)
from .errors import TooManyValues
from .hooks.echomq import EchoMQHook
from .summary import (
    FLOW_KEY,
    PROGRESS_EVERY,
    first_failure,
    log_progress,
    log_released,
    read_released,
)
from .triggers.echo_flow import EchoFlowTrigger

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context

    _Base = BaseOperator
else:
    _Base = object

#: The longest a deferred task takes to notice a release (the trigger's slowest poll).
TRIGGER_POLL_MAX = 1.0
#: The longest a deferrable task reads its flow in its own process before it defers, seconds:
#: a deferral costs rounds of the triggerer (it picks new triggers up about once a second)
#: and of the scheduler (the event, the task's end), so a flow released sooner than that is
#: read without them. It defers sooner when the rate the flow settles at says the rest takes
#: longer than the time left of this (see :meth:`FlowWaiting._in_task_pause`).
IN_TASK_WAIT = 2.0
#: The key of an outlet asset event's ``extra`` under which a waiting task puts its released
#: flow: the reference and the counts (:data:`ASSET_EXTRA_FIELDS`), small whatever N.
ASSET_EXTRA_KEY = "echomq_flow"
#: The summary fields an asset event carries (no ignored failures: they are read from the flow).
ASSET_EXTRA_FIELDS = ("queue", "parent_id", "state", "total", "processed", "ignored", "failed")
#: States of a killed task that mean it was cleared or marked successful, not failed: its
#: flow is left alone.
_NOT_FAILED = frozenset({"success", "restarting", "scheduled", "queued", "up_for_retry", "none"})


def too_many_values(what: str, total: int, max_values: int) -> TooManyValues:
    """The refusal of ``return_values=True`` for ``what`` (a flow, a plan) of ``total``
    children."""
    return TooManyValues(
        f"{what} has {total} children, over max_values={max_values} for "
        "return_values=True: raise max_values, or read the results page by page downstream "
        "instead (echomq_provider.results.flow_results)"
    )


class FlowWaiting(_Base):
    """Mixin of the tasks that wait on a flow. The task's ``__init__`` sets ``echomq_conn_id``
    and ``prefix`` and hands the waiting options to :meth:`_init_waiting`, which checks and
    sets them; it says which flow by :meth:`_flow_ref`."""

    return_values: bool
    max_values: int
    close_flow: bool
    cancel_on_failure: bool
    end_from_trigger: bool | None
    deferrable: bool
    echomq_conn_id: str
    prefix: str | None

    def _init_waiting(
        self,
        *,
        deferrable: bool | None,
        return_values: bool,
        max_values: int,
        close_flow: bool,
        cancel_on_failure: bool,
        end_from_trigger: bool | None,
        settles: bool = True,
    ) -> None:
        """``settles``: the task waits on its flow, so Airflow's failure callbacks settle it
        (:func:`~echomq_provider.settle.install`)."""
        for name, value in (
            ("return_values", return_values),
            ("close_flow", close_flow),
            ("cancel_on_failure", cancel_on_failure),
        ):
            if not isinstance(value, bool):
                raise InvalidInput(f"{self.task_id}: {name} must be True or False, got {value!r}")
        for name, maybe in (("deferrable", deferrable), ("end_from_trigger", end_from_trigger)):
            if maybe is not None and not isinstance(maybe, bool):
                raise InvalidInput(
                    f"{self.task_id}: {name} must be True, False or None, got {maybe!r}"
                )
        self._check_outlets(settles, end_from_trigger)
        self.return_values = return_values
        self.max_values = check_int("max_values", max_values, 1)
        self.close_flow = close_flow
        self.cancel_on_failure = cancel_on_failure
        self.end_from_trigger = end_from_trigger
        # Read at DAG-parse time, not import time, so the setting in force is the one used.
        self.deferrable = (
            conf.getboolean("operators", "default_deferrable", fallback=False)
            if deferrable is None
            else deferrable
        )
        self._hook: EchoMQHook | None = None
        self._in_task: tuple[float, int] | None = None  # (time, settled) of the first read
        self._last_progress: float | None = None
        self._ti_for_kill: Any = None  # the running task instance, for on_kill
        self._epoch_noted = False  # this process recorded the run's clear number on the flow
        self._settles = settles
        if settles:
            settle.install(self)

    def _check_outlets(self, waits: bool, end_from_trigger: bool | None) -> None:
        """Outlets are Assets, each given an event when the flow is released (see
        :meth:`_annotate_outlets`), so: only on a task that waits on its flow (an operator
        that does not would announce the flow when it is added, not when it is released), and
        not with ``end_from_trigger=True`` (a task the trigger ends runs no code on success,
        and Airflow records no outlet event for it)."""
        from ._compat import Asset

        outlets = list(getattr(self, "outlets", None) or ())
        for outlet in outlets:
            if not isinstance(outlet, Asset):
                raise InvalidInput(
                    f"{self.task_id}: outlets must be Assets (airflow.sdk.Asset), each given an "
                    f"event when the flow is released; got {type(outlet).__name__} {outlet!r:.100}"
                )
        if outlets and not waits:
            raise InvalidInput(
                f"{self.task_id}: outlets need wait_for_completion=True (an event when the flow "
                "is released), or put them on the EchoFlowSensor that waits on it"
            )
        if outlets and end_from_trigger:
            raise InvalidInput(
                f"{self.task_id}: outlets need the task to resume on a worker: Airflow records "
                "no asset event for a task its trigger ends (end_from_trigger=True)"
            )

    def _annotate_outlets(self, context: Context, summary: dict[str, Any]) -> None:
        """Put the released flow's reference and counts in each outlet's event ``extra``
        (under :data:`ASSET_EXTRA_KEY`); Airflow records the events when the task succeeds, so
        a DAG with ``schedule=[asset]`` runs on it and reads them from
        ``triggering_asset_events``."""
        outlets = list(getattr(self, "outlets", None) or ())
        if not outlets:
            return
        extra = {field: summary.get(field) for field in ASSET_EXTRA_FIELDS}
        events = context["outlet_events"]
        for outlet in outlets:
            events[outlet].extra[ASSET_EXTRA_KEY] = extra
        names = ", ".join(repr(getattr(outlet, "name", outlet)) for outlet in outlets)
        self.log.info("Flow %s released: an asset event for %s", summary.get("parent_id"), names)

    def _flow_ref(self) -> tuple[str, str]:
        """``(queue, parent_id)`` of the flow waited on; raises ``InvalidInput``."""
        raise NotImplementedError

    # -- reading ---------------------------------------------------------------------------
    def _read(self, context: Context, wait: FlowWait | None = None) -> tuple[EchoMQ, Verdict]:
        """One read of the flow, judged by ``wait`` (the operator's wait; a poke makes its own,
        Airflow keeping the time): ``(client, verdict)``, with a progress line at most every
        :data:`PROGRESS_EVERY` s while it goes on. A failed or cancelled flow raises
        ``AirflowFailException`` naming the failed children; a flow that is not there raises
        :class:`~echomq_core.JobNotFound` naming its queue and id (and the closest registered
        queues when that queue is not one): a wrong reference, prefix or connection, or a flow
        whose retention ended, is not waited on until the timeout."""
        queue, parent_id = self._target()
        client = self._client()
        if wait is None:  # a poke: one read, its pause and timeout are Airflow's
            wait = FlowWait(queue, parent_id, poll=max(self._poke_seconds(), 0.001))
        if not self._epoch_noted:  # a cleared run's try takes the flow up (settle.py)
            self._epoch_noted = True
            cleared = clear_number(context)
            if cleared:
                client.note_epoch(queue, parent_id, cleared)
        verdict = client.perform(wait.read(client.keys))
        snap = verdict.snap
        if verdict.kind == MISSING:
            raise client.perform(not_found(client.keys, queue, parent_id))
        if verdict.never_released:
            failed = client.failed_children(queue, parent_id) if verdict.kind == FAILED else {}
            error = flow_error(queue, parent_id, verdict.kind, failed, snap.error)
            raise AirflowFailException(str(error) + first_failure(client, queue, parent_id))
        if self.return_values and snap.total > self.max_values:
            self._refuse_values(snap)
        if not verdict.done:
            self._progress(context, snap)
        return client, verdict

    def _in_task_pause(self, snap: FlowSnapshot, pause: float, budget: float) -> float | None:
        """A deferrable task's choice after a read of ``snap`` that found children outstanding:
        the seconds to pause before it reads the flow again itself (at most ``pause``), or
        None: defer now. It reads in its own process for at most :data:`IN_TASK_WAIT` s (and
        ``budget``, the time its timeout leaves) from its first read, and defers at once when
        the rate seen since that read says the rest takes longer than the time left; a flow
        that has not moved yet is given the whole time (children that just started)."""
        now, settled = time.monotonic(), snap.total - snap.dependencies
        if self._in_task is None:
            self._in_task = (now, settled)
        began, before = self._in_task
        left = min(began + IN_TASK_WAIT, began + budget) - now
        if left <= 0:
            return None
        if settled > before and snap.dependencies * (now - began) / (settled - before) > left:
            return None
        return min(pause, left)

    def _defer(self, poll_interval: float, seconds_left: float | None) -> NoReturn:
        """Hand the wait to :class:`EchoFlowTrigger` (reads at least every
        :data:`TRIGGER_POLL_MAX` s; a ``timeout`` event after ``seconds_left``); the task
        resumes in :meth:`execute_complete`."""
        queue, parent_id = self._target()
        self._close()
        self.defer(
            trigger=EchoFlowTrigger(
                queue=queue,
                parent_id=parent_id,
                echomq_conn_id=self.echomq_conn_id,
                prefix=self.prefix,
                poll_interval=min(poll_interval, TRIGGER_POLL_MAX),
                timeout_at=None if seconds_left is None else time.time() + seconds_left,
                cancel_on_kill=self.cancel_on_failure,
                end_from_trigger=(
                    not (listeners_registered() or getattr(self, "outlets", None))
                    if self.end_from_trigger is None
                    else self.end_from_trigger
                ),
                return_values=self.return_values,
                max_values=self.max_values,
                close_flow=self.close_flow,
            ),
            method_name="execute_complete",
            timeout=None if seconds_left is None else timedelta(seconds=seconds_left),
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired (on a worker, so the sync client is fine here)."""
        if not isinstance(event, dict):  # dag.test() resumes an end-from-trigger success here
            event = {"status": "success"}
        status = event.get("status")
        queue, parent_id = self._target()
        if status == "success":
            client = self._client()
            return self._succeed(context, client, client.snapshot(queue, parent_id))
        if status == "failed" and "cancelled" in event:
            message = str(FlowCancelled(queue, parent_id, str(event["cancelled"])))
            raise AirflowFailException(message + first_failure(self._client(), queue, parent_id))
        if status == "failed":
            reported = event.get("failed") or {}
            message = str(ParentFailed(queue, parent_id, reported))
            count = int(event.get("failed_count", len(reported)))
            if count > len(reported):
                message += f"; {count} failed children in all"
            raise AirflowFailException(message + first_failure(self._client(), queue, parent_id))
        if status == "timeout":
            raise AirflowSensorTimeout(f"Sensor has timed out: {event.get('message')}")
        if status == "missing":  # the trigger found no such flow: the error the task raises
            raise JobNotFound(str(event.get("message", f"no flow {parent_id!r} in {queue!r}")))
        # Not an AirflowException: as in poke mode, a lost server fails the try (retries
        # apply) and soft_fail does not turn it into a skip.
        raise EchoMQError(f"EchoMQ flow trigger: {event.get('message', event)}")

    def _succeed(self, context: Context, client: EchoMQ, snap: FlowSnapshot) -> Any:
        if self.return_values and snap.total > self.max_values:
            self._refuse_values(snap)
        read = client.perform(
            read_released(
                client.keys,
                client.serializer,
                snap,
                return_values=self.return_values,
                close_flow=self.close_flow,
            )
        )
        if read.closed is not None:
            self.log.info("Flow %s %s: its retention runs from now", snap.parent_id, read.closed)
        log_released(self.log, read)
        self._annotate_outlets(context, read.summary)
        if not self.return_values:
            return read.summary
        context["ti"].xcom_push(key=FLOW_KEY, value=read.summary)
        return read.values

    def _refuse_values(self, snap: FlowSnapshot) -> NoReturn:
        """Fail the task, and only the task: the flow goes on (see ``_GiveUp``)."""
        error = too_many_values(f"flow {snap.parent_id}", snap.total, self.max_values)
        raise AirflowFailException(
            f"{type(error).__name__}: {error}; the flow is left to run"
        ) from error

    def _progress(self, context: Context, snap: FlowSnapshot) -> None:
        """``settled k of N`` at most every :data:`PROGRESS_EVERY` s. Reschedule mode runs
        each poke in a new process, so there the first poke of a process logs only when the
        time since the sensor started crossed a multiple of 30 s since the previous poke."""
        now = time.monotonic()
        if self._last_progress is not None:
            due = now - self._last_progress >= PROGRESS_EVERY
        elif getattr(self, "reschedule", False):
            first = context["ti"].get_first_reschedule_date(context)
            elapsed = 0.0 if first is None else time.time() - first.timestamp()
            before = elapsed - self._poke_seconds()
            due = before < 0 or elapsed // PROGRESS_EVERY != before // PROGRESS_EVERY
        else:
            due = True
        if not due:
            return
        self._last_progress = now
        log_progress(self.log, snap)

    def _poke_seconds(self) -> float:
        raise NotImplementedError

    # -- giving up -------------------------------------------------------------------------
    def on_kill(self) -> None:
        """The task process is being stopped (``execution_timeout``, marked failed, cleared or
        marked successful while running): cancel the flow unless it was cleared or marked
        successful - a cleared task waits on the same flow again."""
        if not self.cancel_on_failure:
            return
        state = None
        ti = self._ti_for_kill
        if ti is not None:
            state = task_state(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)
        if state in _NOT_FAILED:
            self.log.info("Task %s; flow left as it is", state)
            return
        self._cancel("the task was killed" + (f" ({state})" if state else ""))

    class _GiveUp:
        """Cancels the flow when the wrapped step raises a failure, timeout or skip."""

        def __init__(self, task: FlowWaiting) -> None:
            self.task = task

        def __enter__(self) -> None:
            return None

        def __exit__(self, kind: type[BaseException] | None, exc: Any, tb: Any) -> None:
            giving_up = (AirflowFailException, AirflowSensorTimeout, AirflowSkipException)
            if isinstance(exc, Exception) and isinstance(exc.__cause__, TooManyValues):
                # the reader is misconfigured, not the flow: a fixed reader reads it
                self.task.log.info("Flow left as it is: a reader with a higher max_values reads it")
                return
            if kind is not None and issubclass(kind, giving_up):
                why = f"{type(exc).__name__}: {exc}"
                cause = exc.__cause__ or exc.__context__
                if isinstance(cause, Exception):  # soft_fail's skip says why only in its cause
                    why += f" (from {type(cause).__name__}: {cause})"
                self.task._cancel(why)

    def _cancel_when_giving_up(self, context: Context) -> FlowWaiting._GiveUp:
        self._ti_for_kill = context["ti"]
        return self._GiveUp(self)

    def _cancel(self, why: str) -> None:
        if not self.cancel_on_failure:
            return
        try:
            queue, parent_id = self._flow_ref()
            result = self._client().cancel_flow(
                queue, parent_id, reason=f"{self._kind()} {self.task_id}: {why}"[:1000]
            )
        except EchoMQError as exc:  # the failure being raised matters more; say why not
            self.log.error("Could not cancel the flow: %s: %s", type(exc).__name__, exc)
            return
        if result.state == "cancelled":
            self.log.info(
                "Flow %s cancelled: %d children stopped before they started (%s)",
                parent_id,
                result.children,
                why[:200],
            )

    def _kind(self) -> str:
        """How the cancel reason names this task ("sensor wait: ..."): overridden."""
        return "task"

    # -- settling after Airflow failed the task (echomq_provider.settle) --------------------
    def _callback_ref(self, context: Any) -> tuple[str, str]:
        """``(queue, parent_id)`` of the flow, from a callback's context: the task's templated
        fields are rendered here (the dag processor never rendered them), and the run, task
        and map index name the flow (a DAG callback's ``ti`` is another task's)."""
        raise NotImplementedError

    def _rendered(self, value: Any, context: Any) -> Any:
        return None if value is None else self.render_template(value, context)

    def _map_index(self, context: Any) -> int:
        ti = context.get("ti")
        if ti is None or ti.task_id != self.task_id or ti.map_index is None:
            return -1
        return int(ti.map_index)

    # -- plumbing --------------------------------------------------------------------------
    def _target(self) -> tuple[str, str]:
        try:
            return self._flow_ref()
        except InvalidInput as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from exc

    def _client(self) -> EchoMQ:
        if self._hook is None:
            self._hook = EchoMQHook(self.echomq_conn_id, prefix=self.prefix)
        return self._hook.get_conn()

    def _close(self) -> None:
        if self._hook is not None:
            self._hook.close()
            self._hook = None
