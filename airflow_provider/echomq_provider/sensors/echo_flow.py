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
it the sensor fails at its first read with :class:`~echomq_provider.errors.TooManyValues` (XCom
lives in the metadata database; read big flows page by page) and leaves the flow running: a
reader's misconfiguration does not cancel the work.

Modes, all with the same outcome:

* ``poke`` - polls in the worker slot every ``poke_interval``.
* ``reschedule`` - one poll per run; the slot is freed between polls.
* deferrable (``deferrable=True``; default ``[operators] default_deferrable``) - reads in the
  slot for up to 2 s (a flow released by then is read without the seconds a deferral costs;
  one the settle rate says will take longer defers at once: see
  :data:`~echomq_provider.waiting.IN_TASK_WAIT`), then
  :class:`~echomq_provider.triggers.echo_flow.EchoFlowTrigger` polls in the triggerer with
  the async client, at least once a second, and the slot is freed until it fires. On a
  release the trigger ends the task itself (``end_from_trigger``; default: unless plugins
  registered listeners): no worker resumes it.

Outlets: Assets in ``outlets`` each get an event when the flow is released, with its
reference and counts in the event's ``extra`` under ``echomq_flow``, for a DAG scheduled on
them (see :meth:`~echomq_provider.waiting.FlowWaiting._check_outlets` for what is refused).

Progress: every mode logs ``settled k of N (processed, ignored, failed)`` at INFO, at most
every 30 s (:data:`~echomq_provider.triggers.echo_flow.PROGRESS_EVERY`).

Fail fast: when the parent has failed (a fail-parent child died) the sensor fails at once
with ``AirflowFailException`` naming the failed children and their errors, and the first
one's traceback (its last 4 KiB, from its last attempt) - no retries, as
a failed flow does not recover by waiting - instead of sitting out its timeout.

Cancel (``cancel_on_failure=True``, the default): whenever the sensor gives up on the flow - a
child failed it, ``timeout`` passed (``soft_fail`` or not), the task was killed
(``execution_timeout``, marked failed while running or deferred) - it cancels the flow first:
no child that has not started will start (see ``EchoMQ.cancel_flow``). Clearing the operator
then repairs it (see :class:`~echomq_provider.operators.echo_flow.EchoFlowOperator`). When
Airflow fails the sensor without running its code (marked failed between two reschedule-mode
pokes, a lost heartbeat, its process killed), the failure callbacks the sensor adds to itself
and its DAG cancel a held flow and close a released one (:mod:`echomq_provider.settle`).

``timeout`` and ``soft_fail`` mean the same in every mode: past ``timeout`` seconds the
sensor fails with ``AirflowSensorTimeout``; with ``soft_fail=True`` a timeout *or* a failed
parent marks it skipped instead. An unreachable server is neither: it fails the try with the
EchoMQ error (so ``retries`` apply; that try cancels nothing) in every mode; after the last
try the failure callback settles the flow, if the server answers by then.

A flow that does not exist - a wrong id, queue, prefix or connection, or a flow whose retention
ended - fails the sensor at its first read with :class:`~echomq_core.JobNotFound`, in every
mode (deferred: the trigger's ``missing`` event), naming the queue and id and the closest
registered queues; it is not waited on until the timeout. Not an Airflow exception, so
``retries`` apply: a sensor on a flow that a system outside this DAG adds later runs after that
add, or retries until it is there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from echomq_core import FlowWait, InvalidInput

from .. import settle
from .._compat import AirflowFailException, AirflowSkipException
from ..flow_specs import flow_target
from ..hooks.echomq import EchoMQHook
from ..plugins.links import EchoFlowSensorLink
from ..summary import FLOW_KEY
from ..waiting import FlowWaiting

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["FLOW_KEY", "EchoFlowSensor"]


class EchoFlowSensor(FlowWaiting, BaseSensorOperator):
    """Wait for a flow; return its reference and counts (or, on request, its values).

    :param flow: the flow: an :class:`EchoFlowOperator`'s output (``operator.output``),
        a mapping with ``queue`` and ``parent_id``, or a :class:`~echomq_core.FlowRef`.
    :param parent_queue: with ``parent_id``, the flow named directly (instead of ``flow``).
        (Not ``queue``: that is every operator's executor queue.)
    :param parent_id: the parent's id.
    :param echomq_conn_id: the ``echomq`` connection.
    :param prefix: key prefix, overriding the connection's.
    :param deferrable: wait in the triggerer (after up to 2 s of reads in the task, see the
        module doc). Default: ``[operators] default_deferrable``.
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
    :param end_from_trigger: deferred, let the trigger end the task once the flow is released
        (its reads, ``close_flow`` and the XCom done there) instead of resuming it on a
        worker: a scheduling round less, and no spurious failure when the flow is released
        within seconds of deferring (an Airflow 3.2/3.3 race, see
        :meth:`~echomq_provider.triggers.echo_flow.EchoFlowTrigger._end`). Default None: yes,
        unless plugins registered listeners (OpenLineage does; Airflow refuses a DAG whose
        task sets ``end_from_trigger=True`` beside listeners, which would not run). A
        failure, a timeout or a lost server still resume on a worker.
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
        end_from_trigger: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        if flow is None and (parent_queue is None or parent_id is None):
            raise InvalidInput(f"{self.task_id}: give flow, or both parent_queue and parent_id")
        self.flow = flow
        self.parent_queue = parent_queue
        self.parent_id = parent_id
        self.echomq_conn_id = echomq_conn_id
        self.prefix = prefix
        self._init_waiting(
            deferrable=deferrable,
            return_values=return_values,
            max_values=max_values,
            close_flow=close_flow,
            cancel_on_failure=cancel_on_failure,
            end_from_trigger=end_from_trigger,
        )
        settle.install(self)

    # -- modes ----------------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        try:
            with self._cancel_when_giving_up(context):
                if not self.deferrable:
                    return super().execute(context)
                started = time.time()
                wait: FlowWait | None = None
                self._in_task = None
                while True:
                    try:  # settled already, or failed: no need to defer
                        if wait is None:  # a bad reference fails (or skips) as a failed flow
                            wait = FlowWait(*self._target(), poll=self._poke_seconds())
                        client, verdict = self._read(context, wait)
                    except AirflowFailException as exc:
                        # As BaseSensorOperator.execute and resume_execution treat it in the
                        # other modes: soft_fail / never_fail turn a failed flow into a skip.
                        if self.soft_fail or self.never_fail:
                            raise AirflowSkipException(f"Skipping ({exc})") from exc
                        raise
                    if verdict.ready:
                        return self._succeed(context, client, verdict.snap)
                    left = max(0.0, started + self.timeout - time.time())
                    pause = self._in_task_pause(verdict.snap, verdict.pause, left)
                    if pause is None:
                        self._defer(self._poke_seconds(), left)
                    time.sleep(pause)
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
        client, verdict = self._read(context)
        if not verdict.ready:
            return PokeReturnValue(False)
        return PokeReturnValue(True, self._succeed(context, client, verdict.snap))

    # -- FlowWaiting ----------------------------------------------------------------------
    def _flow_ref(self) -> tuple[str, str]:
        return flow_target(self.flow, self.parent_queue, self.parent_id)

    def _callback_ref(self, context: Any) -> tuple[str, str]:
        return flow_target(
            self._rendered(self.flow, context),
            self._rendered(self.parent_queue, context),
            self._rendered(self.parent_id, context),
        )

    def _poke_seconds(self) -> float:
        interval = self.poke_interval
        return interval.total_seconds() if isinstance(interval, timedelta) else float(interval)

    def _kind(self) -> str:
        return "sensor"
