"""EchoFlowSensor: wait until a flow's children have all settled; hand on a reference to them.

Using::

    wait = EchoFlowSensor(task_id="wait", flow=fan_out.output, deferrable=True)

    @task
    def summarise(flow: dict) -> int:               # values read page by page, not from XCom
        return sum(value for _index, value in flow_results(flow))

    summarise(wait.output)

Success is the parent released: the parent left ``held`` and nothing is outstanding (one atomic
``snapshot`` read). The return value (XCom) is then small whatever N - the flow's reference and
counts, and at most :data:`MAX_REPORTED` ignored failures::

    {"queue": ..., "parent_id": ..., "state": "closed", "total": 200, "processed": 199,
     "ignored": 1, "failed": 0, "repairs": 0, "ignored_failures": {"17": "ValueError: ..."}}

Children are named by *label*: the index of their spec in the operator's ``children`` (as a
string in the JSON above), or the ``key`` their spec gave. The values themselves are read by a
downstream task from the server, page by page
(:func:`~echomq_provider.results.flow_results`), fine at 200,000 children.

``return_values=True`` instead returns the values themselves - a list in the order of the
specs (``None`` for a child whose failure was ignored), or ``{key: value}`` when the specs
gave keys - so ``.expand()`` maps over them; the summary above goes to the XCom key ``flow``.
Only below ``max_values`` children (default 1,024, Airflow's own ``max_map_length``): above
it the sensor fails at once with :class:`~echomq_provider.errors.TooManyValues` (XCom lives in
the metadata database; read big flows page by page).

Modes, all with the same outcome:

* ``poke`` - polls in the worker slot every ``poke_interval``.
* ``reschedule`` - one poll per run; the slot is freed between polls.
* deferrable (``deferrable=True``; default ``[operators] default_deferrable``) - one poll, then
  :class:`~echomq_provider.triggers.echo_flow.EchoFlowTrigger` polls in the triggerer with
  the async client, at least once a second, and the slot is freed until it fires.

Progress: every mode logs ``settled k of N (processed, ignored, failed)`` at INFO, at most
every 30 s (:data:`PROGRESS_EVERY`).

Fail fast: when the parent has failed (a fail-parent child died) the sensor fails at once
with ``AirflowFailException`` naming the failed children and their errors - no retries, as
a failed flow does not recover by waiting - instead of sitting out its timeout.

Cancel (``cancel_on_failure=True``, the default): whenever the sensor gives up on the flow - a
child failed it, ``timeout`` passed (``soft_fail`` or not), the task was killed
(``execution_timeout``, marked failed while running or deferred) - it cancels the flow first:
no child that has not started will start (see ``EchoMQ.cancel_flow``). Clearing the operator
then repairs it (see :class:`~echomq_provider.operators.echo_flow.EchoFlowOperator`).

``timeout`` and ``soft_fail`` mean the same in every mode: past ``timeout`` seconds the
sensor fails with ``AirflowSensorTimeout``; with ``soft_fail=True`` a timeout *or* a failed
parent marks it skipped instead. An unreachable server is neither: it fails the try with the
EchoMQ error (so ``retries`` apply; nothing is cancelled) in every mode.

A flow that does not exist (wrong id or prefix) is waited on, with a warning on each progress
line, until the timeout: a flow may be added by a system outside this DAG after the sensor
starts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from echomq_core import (
    EchoMQ,
    EchoMQError,
    FlowCancelled,
    FlowSnapshot,
    InvalidInput,
    ParentFailed,
)
from echomq_core.checks import check_int
from echomq_core.errors import flow_error

from .._compat import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    conf,
    task_state,
)
from ..errors import TooManyValues
from ..flow_specs import child_label, flow_target
from ..hooks.echomq import EchoMQHook
from ..plugins.links import EchoFlowSensorLink
from ..triggers.echo_flow import MAX_REPORTED, EchoFlowTrigger, progress_line

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The XCom key of the summary when the return value holds the values.
FLOW_KEY = "flow"
#: The most seconds between two progress lines.
PROGRESS_EVERY = 30.0
#: The longest a deferred sensor takes to notice a release (the trigger's slowest poll).
TRIGGER_POLL_MAX = 1.0
#: States of a killed task that mean it was cleared or marked successful, not failed: its
#: flow is left alone.
_NOT_FAILED = frozenset({"success", "restarting", "scheduled", "queued", "up_for_retry", "none"})


class EchoFlowSensor(BaseSensorOperator):
    """Wait for a flow; return its reference and counts (or, on request, its values).

    :param flow: the flow: an :class:`EchoFlowOperator`'s output (``operator.output``),
        a mapping with ``queue`` and ``parent_id``, or a :class:`~echomq_core.FlowRef`.
    :param parent_queue: with ``parent_id``, the flow named directly (instead of ``flow``).
        (Not ``queue``: that is every operator's executor queue.)
    :param parent_id: the parent's id.
    :param echomq_conn_id: the ``echomq`` connection.
    :param prefix: key prefix, overriding the connection's.
    :param deferrable: wait in the triggerer. Default: ``[operators] default_deferrable``.
    :param poke_interval: seconds between reads in poke and reschedule mode (default 5: a read
        is one cheap atomic script call); deferred, the trigger reads at least every second.
    :param return_values: return the values themselves (for ``.expand()``), not the summary;
        see the module doc. Default False.
    :param max_values: the most children ``return_values`` accepts (default 1,024).
    :param close_flow: close a barrier flow (``EchoFlowOperator``'s default) once it is
        released, so its ``closed`` retention starts (default True). Downstream readers and a
        cleared sensor still read a closed flow until that retention ends.
    :param cancel_on_failure: cancel the flow when the sensor fails, times out or is killed
        (default True).
    """

    #: "EchoMQ flow" on the task instance: the flow's page in the dashboard the plugin
    #: mounts in the api-server (see :mod:`echomq_provider.plugins`).
    operator_extra_links = (EchoFlowSensorLink(),)
    template_fields: Sequence[str] = ("flow", "parent_queue", "parent_id")
    ui_color = "#c6e2f4"

    def __init__(
        self,
        *,
        flow: Any = None,
        parent_queue: str | None = None,
        parent_id: str | None = None,
        echomq_conn_id: str = EchoMQHook.default_conn_name,
        prefix: str | None = None,
        deferrable: bool | None = None,
        poke_interval: timedelta | float = 5.0,
        return_values: bool = False,
        max_values: int = 1024,
        close_flow: bool = True,
        cancel_on_failure: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        if flow is None and (parent_queue is None or parent_id is None):
            raise InvalidInput(f"{self.task_id}: give flow, or both parent_queue and parent_id")
        for name, value in (
            ("return_values", return_values),
            ("close_flow", close_flow),
            ("cancel_on_failure", cancel_on_failure),
        ):
            if not isinstance(value, bool):
                raise InvalidInput(f"{self.task_id}: {name} must be True or False, got {value!r}")
        self.flow = flow
        self.parent_queue = parent_queue
        self.parent_id = parent_id
        self.echomq_conn_id = echomq_conn_id
        self.prefix = prefix
        self.return_values = return_values
        self.max_values = check_int("max_values", max_values, 1)
        self.close_flow = close_flow
        self.cancel_on_failure = cancel_on_failure
        # Read at DAG-parse time, not import time, so the setting in force is the one used.
        self.deferrable = (
            conf.getboolean("operators", "default_deferrable", fallback=False)
            if deferrable is None
            else deferrable
        )
        self._hook: EchoMQHook | None = None
        self._last_progress: float | None = None
        self._ti_for_kill: Any = None  # the running task instance, for on_kill

    # -- modes ----------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        try:
            with self._cancel_when_giving_up(context):
                if not self.deferrable:
                    return super().execute(context)
                started = time.time()
                try:
                    first = self.poke(context)  # settled already, or failed: no need to defer
                except AirflowFailException as exc:
                    # As BaseSensorOperator.execute and resume_execution treat it in the other
                    # modes: soft_fail / never_fail turn a failed flow into a skip.
                    if self.soft_fail or self.never_fail:
                        raise AirflowSkipException(f"Skipping ({exc})") from exc
                    raise
                if first:
                    return first.xcom_value
                queue, parent_id = self._target()
                self.defer(
                    trigger=EchoFlowTrigger(
                        queue=queue,
                        parent_id=parent_id,
                        echomq_conn_id=self.echomq_conn_id,
                        prefix=self.prefix,
                        poll_interval=min(self._poke_seconds(), TRIGGER_POLL_MAX),
                        timeout_at=started + self.timeout,
                        cancel_on_kill=self.cancel_on_failure,
                    ),
                    method_name="execute_complete",
                    timeout=timedelta(seconds=self.timeout),
                )
        finally:
            self._close()

    def resume_execution(
        self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context
    ) -> Any:
        # Covers execute_complete and a deferral that timed out in the triggerer ("__fail__").
        try:
            with self._cancel_when_giving_up(context):
                return super().resume_execution(next_method, next_kwargs, context)
        finally:
            self._close()

    def poke(self, context: Context) -> PokeReturnValue:
        queue, parent_id = self._target()
        client = self._client()
        snap = client.snapshot(queue, parent_id)
        if snap.outcome in ("failed", "cancelled"):
            failed = client.failed_children(queue, parent_id) if snap.outcome == "failed" else {}
            error = flow_error(queue, parent_id, snap.outcome, failed, snap.error)
            raise AirflowFailException(str(error))
        if self.return_values and snap.total > self.max_values:
            self._refuse_values(snap)
        if snap.outcome != "released":
            self._progress(context, snap)
            return PokeReturnValue(False)
        return PokeReturnValue(True, self._succeed(context, client, snap))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired (on a worker, so the sync client is fine here)."""
        status = event.get("status")
        queue, parent_id = self._target()
        if status == "success":
            client = self._client()
            return self._succeed(context, client, client.snapshot(queue, parent_id))
        if status == "failed" and "cancelled" in event:
            raise AirflowFailException(
                str(FlowCancelled(queue, parent_id, str(event["cancelled"])))
            )
        if status == "failed":
            reported = event.get("failed") or {}
            message = str(ParentFailed(queue, parent_id, reported))
            count = int(event.get("failed_count", len(reported)))
            if count > len(reported):
                message += f"; {count} failed children in all"
            raise AirflowFailException(message)
        if status == "timeout":
            raise AirflowSensorTimeout(f"Sensor has timed out: {event.get('message')}")
        # Not an AirflowException: as in poke mode, a lost server fails the try (retries
        # apply) and soft_fail does not turn it into a skip.
        raise EchoMQError(f"EchoMQ flow trigger: {event.get('message', event)}")

    def on_kill(self) -> None:
        """The task process is being stopped (``execution_timeout``, marked failed, cleared or
        marked successful while running): cancel the flow unless it was cleared or marked
        successful - a cleared sensor waits on the same flow again."""
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

    # -- helpers --------------------------------------------------------------------------
    class _GiveUp:
        """Cancels the flow when the wrapped step raises a failure, timeout or skip."""

        def __init__(self, sensor: EchoFlowSensor) -> None:
            self.sensor = sensor

        def __enter__(self) -> None:
            return None

        def __exit__(self, kind: type[BaseException] | None, exc: Any, tb: Any) -> None:
            giving_up = (AirflowFailException, AirflowSensorTimeout, AirflowSkipException)
            if kind is not None and issubclass(kind, giving_up):
                why = f"{type(exc).__name__}: {exc}"
                cause = exc.__cause__ or exc.__context__
                if isinstance(cause, Exception):  # soft_fail's skip says why only in its cause
                    why += f" (from {type(cause).__name__}: {cause})"
                self.sensor._cancel(why)

    def _cancel_when_giving_up(self, context: Context) -> EchoFlowSensor._GiveUp:
        self._ti_for_kill = context["ti"]
        return self._GiveUp(self)

    def _cancel(self, why: str) -> None:
        if not self.cancel_on_failure:
            return
        try:
            queue, parent_id = flow_target(self.flow, self.parent_queue, self.parent_id)
            result = self._client().cancel_flow(
                queue, parent_id, reason=f"sensor {self.task_id}: {why}"[:1000]
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

    def _progress(self, context: Context, snap: FlowSnapshot) -> None:
        """``settled k of N`` at most every :data:`PROGRESS_EVERY` s. Reschedule mode runs
        each poke in a new process, so there the first poke of a process logs only when the
        time since the sensor started crossed a multiple of 30 s since the previous poke."""
        now = time.monotonic()
        if self._last_progress is not None:
            due = now - self._last_progress >= PROGRESS_EVERY
        elif self.reschedule:
            first = context["ti"].get_first_reschedule_date(context)
            elapsed = 0.0 if first is None else time.time() - first.timestamp()
            before = elapsed - self._poke_seconds()
            due = before < 0 or elapsed // PROGRESS_EVERY != before // PROGRESS_EVERY
        else:
            due = True
        if not due:
            return
        self._last_progress = now
        if snap.outcome == "missing":
            self.log.warning(
                "No flow %s in queue %r (wrong id or prefix?); waiting", snap.parent_id, snap.queue
            )
        else:
            self.log.info("%s", progress_line(snap))

    def _succeed(self, context: Context, client: EchoMQ, snap: FlowSnapshot) -> Any:
        queue, parent_id = snap.queue, snap.parent_id
        values: Any = None
        if self.return_values:
            if snap.total > self.max_values:
                self._refuse_values(snap)
            values = self._values(client, snap)
        ignored = client.ignored_failures(queue, parent_id)
        if self.close_flow and snap.parent_state == "released":  # a barrier flow, now read
            state = client.close_flow(queue, parent_id)
            self.log.info("Flow %s %s: its retention runs from now", parent_id, state)
            snap = client.snapshot(queue, parent_id)
        summary = {
            key: value for key, value in snap.to_dict().items() if key not in ("parent_state",)
        }
        summary["state"] = snap.parent_state
        summary["ignored_failures"] = {
            str(child_label(parent_id, child)): error
            for child, error in sorted(ignored.items())[:MAX_REPORTED]
        }
        self.log.info(
            "Flow %s released: %d results, %d ignored failures",
            parent_id,
            snap.processed,
            snap.ignored,
        )
        if not self.return_values:
            return summary
        context["ti"].xcom_push(key=FLOW_KEY, value=summary)
        return values

    def _values(self, client: EchoMQ, snap: FlowSnapshot) -> Any:
        """The values in spec order (``None`` where a failure was ignored), or by key."""
        labelled = [
            (child_label(snap.parent_id, child), value)
            for child, value in client.iter_children_values(snap.queue, snap.parent_id)
        ]
        if any(isinstance(label, str) for label, _ in labelled):
            return {str(label): value for label, value in labelled}
        ordered: list[Any] = [None] * snap.total
        for label, value in labelled:
            if isinstance(label, int) and 0 <= label < snap.total:
                ordered[label] = value
        return ordered

    def _refuse_values(self, snap: FlowSnapshot) -> None:
        error = TooManyValues(
            f"flow {snap.parent_id} has {snap.total} children, over max_values="
            f"{self.max_values} for return_values=True: read its results page by page "
            "downstream instead (echomq_provider.results.flow_results)"
        )
        raise AirflowFailException(f"{type(error).__name__}: {error}") from error

    def _poke_seconds(self) -> float:
        interval = self.poke_interval
        return interval.total_seconds() if isinstance(interval, timedelta) else float(interval)

    def _target(self) -> tuple[str, str]:
        try:
            return flow_target(self.flow, self.parent_queue, self.parent_id)
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
