"""EchoFlowSensor: wait until a flow's children have all settled, then hand on their results.

Using::

    wait = EchoFlowSensor(task_id="wait", flow=fan_out.output, deferrable=True)
    summarise(wait.output["children_values"], wait.output["ignored_failures"])

Success is the parent released: ``dependencies()`` reads 0 and the parent left ``held``
(one atomic ``snapshot`` read gives both). The sensor then pushes two XComs -
``children_values`` (child id -> result) and ``ignored_failures`` (child id -> error, for
ignore-on-failure children that died) - and returns the flow's counts as its return value.

Modes, all with the same outcome:

* ``poke`` - polls in the worker slot every ``poke_interval``.
* ``reschedule`` - one poll per run; the slot is freed between polls.
* deferrable (``deferrable=True``; default ``[operators] default_deferrable``) - one poll, then
  :class:`~echomq_provider.triggers.echo_flow.EchoFlowTrigger` polls in the triggerer with
  the async client and the slot is freed until it fires.

Fail fast: when the parent has failed (a fail-parent child died) the sensor fails at once
with ``AirflowFailException`` naming the failed children and their errors - no retries, as
a failed flow does not recover by waiting - instead of sitting out its timeout.

``timeout`` and ``soft_fail`` mean the same in every mode: past ``timeout`` seconds the
sensor fails with ``AirflowSensorTimeout``; with ``soft_fail=True`` a timeout *or* a failed
parent marks it skipped instead. An unreachable server is neither: it fails the try with the
EchoMQ error (so ``retries`` apply) in every mode.

A flow that does not exist (wrong id or prefix) is waited on, with a warning on each poll,
until the timeout: a flow may be added by a system outside this DAG after the sensor starts.
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
from echomq_core.errors import flow_error

from .._compat import (
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
    conf,
)
from ..flow_specs import flow_target
from ..hooks.echomq import EchoMQHook
from ..triggers.echo_flow import EchoFlowTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

CHILDREN_VALUES_KEY = "children_values"
IGNORED_FAILURES_KEY = "ignored_failures"


class EchoFlowSensor(BaseSensorOperator):
    """Wait for a flow; push ``children_values`` and ``ignored_failures``.

    :param flow: the flow: an :class:`EchoFlowOperator`'s output (``operator.output``),
        a mapping with ``queue`` and ``parent_id``, or a :class:`~echomq_core.FlowRef`.
    :param parent_queue: with ``parent_id``, the flow named directly (instead of ``flow``).
        (Not ``queue``: that is every operator's executor queue.)
    :param parent_id: the parent's id.
    :param echomq_conn_id: the ``echomq`` connection.
    :param prefix: key prefix, overriding the connection's.
    :param deferrable: wait in the triggerer. Default: ``[operators] default_deferrable``.
    :param poke_interval: seconds between reads, in every mode (default 5: a read is one
        cheap atomic script call).
    :param close_flow: close a barrier flow (``EchoFlowOperator``'s default) once its results
        are read, so its ``closed`` retention starts (default True). A cleared sensor still
        reads a closed flow until that retention ends.
    """

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
        close_flow: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.close_flow = close_flow
        if flow is None and (parent_queue is None or parent_id is None):
            raise InvalidInput(f"{self.task_id}: give flow, or both parent_queue and parent_id")
        self.flow = flow
        self.parent_queue = parent_queue
        self.parent_id = parent_id
        self.echomq_conn_id = echomq_conn_id
        self.prefix = prefix
        # Read at DAG-parse time, not import time, so the setting in force is the one used.
        self.deferrable = (
            conf.getboolean("operators", "default_deferrable", fallback=False)
            if deferrable is None
            else deferrable
        )
        self._hook: EchoMQHook | None = None

    # -- modes ----------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        try:
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
                    poll_interval=self.poke_interval,
                    timeout_at=started + self.timeout,
                ),
                method_name="execute_complete",
                timeout=timedelta(seconds=self.timeout),
            )
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
        if snap.outcome != "released":
            if snap.outcome == "missing":
                self.log.warning(
                    "No flow %s in queue %r (wrong id or prefix?); waiting", parent_id, queue
                )
            else:
                self.log.info(
                    "Flow %s: %d of %d children outstanding",
                    parent_id,
                    snap.dependencies,
                    snap.total,
                )
            return PokeReturnValue(False)
        return PokeReturnValue(True, self._succeed(context, client, snap))

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired (on a worker, so the sync client is fine here)."""
        try:
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
        finally:
            self._close()

    # -- helpers --------------------------------------------------------------------------
    def _succeed(self, context: Context, client: EchoMQ, snap: FlowSnapshot) -> dict[str, Any]:
        values = client.children_values(snap.queue, snap.parent_id)
        ignored = client.ignored_failures(snap.queue, snap.parent_id)
        ti = context["ti"]
        ti.xcom_push(key=CHILDREN_VALUES_KEY, value=values)
        ti.xcom_push(key=IGNORED_FAILURES_KEY, value=ignored)
        if self.close_flow and snap.parent_state == "released":  # a barrier flow, now read
            state = client.close_flow(snap.queue, snap.parent_id)
            self.log.info("Flow %s %s: its retention runs from now", snap.parent_id, state)
        self.log.info(
            "Flow %s released: %d results, %d ignored failures",
            snap.parent_id,
            len(values),
            len(ignored),
        )
        return snap.to_dict()

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
