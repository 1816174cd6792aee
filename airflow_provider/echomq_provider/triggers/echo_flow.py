"""EchoFlowTrigger: the deferrable half of EchoFlowSensor, run by the triggerer.

It polls one flow with the async client until the flow settles, then fires one event and
ends; what each read means and when the next comes is the core's
:class:`~echomq_core.flows.waiting.FlowWait`, driven here with ``await``. The event is small on
purpose (it is stored in the metadata DB): a status and counts.

On success with ``end_from_trigger`` (the waiting task's default unless plugins registered
listeners), the trigger ends the task itself: it does the reads the task would do on resuming
(the summary, or the values with ``return_values``) and ``close_flow`` with the async client,
stores the task's XCom and yields ``TaskSuccessEvent``; no worker resumes the task. Should a
read or the XCom store fail, it yields the normal event below and the task resumes on a
worker, which does the same. Without ``end_from_trigger`` the results are read by the task
when it resumes, not carried in the event.

==============  ===========================================================================
``status``      the event also holds
==============  ===========================================================================
``success``     ``snapshot``: the flow's counts (the parent is released; 0 outstanding)
``failed``      ``failed``: up to :data:`MAX_REPORTED` failed child ids -> error, and
                ``failed_count``: a fail-parent child died, so the parent failed
``timeout``     ``message``: ``timeout_at`` passed before the flow settled
``missing``     ``message``: there is no such flow (a wrong reference, prefix or connection, or
                its retention ended); the task raises it as :class:`~echomq_core.JobNotFound`
``error``       ``message``: EchoMQ refused or could not reach the server
==============  ===========================================================================

Progress: ``settled k of N (processed, ignored, failed)`` at INFO at most every 30 s (the
triggerer ships trigger logs to the task's log).

Killed: when the triggerer cancels the trigger, it asks the API server for the task's state;
``failed`` (a user marked the deferred sensor failed, or the DAG run) cancels the flow when
``cancel_on_kill`` (the sensor's ``cancel_on_failure``) - but a triggerer shutting down, the
trigger moving to another triggerer, a clear or a mark-success leave it alone. The same check
runs on Airflow 3.1 to 3.3 (3.3's ``BaseTrigger.on_kill`` fires for clears and mark-success
too, so the state decides either way).

Why the trigger keeps its own deadline (``timeout_at``, epoch seconds) besides the
``timeout`` given to ``defer()``: the triggerer enforces the latter, but an in-process run
(``dag.test()``) does not, and a sensor's timeout must behave the same everywhere.

Why poll rather than subscribe: a flow settles through many writes from many workers; the
parent's state and counter are one cheap atomic read (``flow_snapshot``), and a poll every
few seconds costs the server nothing, survives reconnects and needs no keyspace events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from echomq_core import AsyncEchoMQ, EchoMQError, FlowSnapshot
from echomq_core.flows.reads import not_found
from echomq_core.flows.waiting import CANCELLED, FAST_POLL, MISSING, FlowWait

from .._compat import aset_xcom, atask_state
from ..hooks.echomq import EchoMQHook
from ..summary import (
    FLOW_KEY,
    MAX_REPORTED,
    PROGRESS_EVERY,
    log_progress,
    log_released,
    progress_line,
    read_released,
)

__all__ = ["FAST_POLL", "MAX_REPORTED", "EchoFlowTrigger", "progress_line"]

#: The warm-up question of this triggerer process (see :meth:`EchoFlowTrigger._warm_up`):
#: its event loop and the task asking it; one per process, kept so the task is not collected.
_warm_up: tuple[asyncio.AbstractEventLoop, asyncio.Task[None]] | None = None


class EchoFlowTrigger(BaseTrigger):
    """Fire once when the flow ``parent_id`` in ``queue`` is released or has failed.

    :param queue: the parent's queue.
    :param parent_id: the parent's id.
    :param echomq_conn_id: the ``echomq`` connection (fetched asynchronously).
    :param prefix: key prefix, overriding the connection's.
    :param poll_interval: seconds between reads, at most: while children settle, the pause
        shrinks to the time the rest should take at the rate seen since the last read (down
        to :data:`FAST_POLL`), so a release is noticed about when it happens.
    :param timeout_at: epoch seconds after which a ``timeout`` event fires (None: never).
    :param cancel_on_kill: cancel the flow when the task is marked failed while deferred.
    :param end_from_trigger: on success, end the task here (``TaskSuccessEvent`` carrying its
        XCom) instead of resuming it on a worker: the reads, ``close_flow`` and the summary are
        done with the async client.
    :param return_values: with ``end_from_trigger``: the XCom is the values (the summary goes
        to the key ``flow``), as the task's own ``return_values``.
    :param max_values: with ``return_values``: the most children whose values the XCom
        takes; over it the task resumes on a worker, which refuses them (``TooManyValues``)
        without touching the flow. None: no limit.
    :param close_flow: with ``end_from_trigger``: close a released barrier flow.
    """

    def __init__(
        self,
        *,
        queue: str,
        parent_id: str,
        echomq_conn_id: str = EchoMQHook.default_conn_name,
        prefix: str | None = None,
        poll_interval: float = 5.0,
        timeout_at: float | None = None,
        cancel_on_kill: bool = True,
        end_from_trigger: bool = False,
        return_values: bool = False,
        max_values: int | None = None,
        close_flow: bool = False,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow's BaseTrigger is untyped
        self.queue = queue
        self.parent_id = parent_id
        self.echomq_conn_id = echomq_conn_id
        self.prefix = prefix
        self.poll_interval = float(poll_interval)
        self.timeout_at = None if timeout_at is None else float(timeout_at)
        self.cancel_on_kill = bool(cancel_on_kill)
        self.end_from_trigger = bool(end_from_trigger)
        self.return_values = bool(return_values)
        self.max_values = None if max_values is None else int(max_values)
        self.close_flow = bool(close_flow)
        self._client: AsyncEchoMQ | None = None
        self._wait_state: FlowWait | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "queue": self.queue,
                "parent_id": self.parent_id,
                "echomq_conn_id": self.echomq_conn_id,
                "prefix": self.prefix,
                "poll_interval": self.poll_interval,
                "timeout_at": self.timeout_at,
                "cancel_on_kill": self.cancel_on_kill,
                "end_from_trigger": self.end_from_trigger,
                "return_values": self.return_values,
                "max_values": self.max_values,
                "close_flow": self.close_flow,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # The client is closed before the event is yielded: after a single-event trigger
        # yields, the triggerer may never resume the generator, so nothing must stay open
        # across the yield. Cancellation (the task was cleared, the triggerer moved it) runs
        # the ``finally`` too.
        ended: TriggerEvent | None = None
        self._warm_up()
        try:
            event = await self._wait()
            if event["status"] == "success" and self.end_from_trigger:
                ended = await self._end(event)
        except asyncio.CancelledError:
            if self.cancel_on_kill:
                await self._cancel_if_marked_failed()
            raise
        finally:
            await self.cleanup()
        yield ended or TriggerEvent(event)  # type: ignore[no-untyped-call]

    async def _end(self, event: dict[str, Any]) -> TriggerEvent | None:
        """The task's success, ended here: what the waiting task would return on resuming,
        as its XCom. None (resume on a worker, which does the same) when a read fails.

        Ending here is also what keeps a fast flow from failing the task: when the trigger
        fires before the scheduler has taken the deferring process's exit, Airflow (3.2, 3.3)
        sees that stale "success" of a task it has re-queued and fails it as changed
        externally; a task the triggerer ended is already a success."""
        assert self._client is not None
        client, parent_id = self._client, self.parent_id
        try:
            snap = await client.snapshot(self.queue, parent_id)
            if self.return_values and self.max_values is not None and snap.total > self.max_values:
                return None  # too many values for the XCom: the task refuses them on a worker
            read = await client.connection.perform(
                read_released(
                    client.keys,
                    client.serializer,
                    snap,
                    return_values=self.return_values,
                    close_flow=self.close_flow,
                )
            )
        except EchoMQError as exc:
            self.log.warning(
                "Flow %s released, but not read here (%s: %s): the task resumes to read it",
                parent_id,
                type(exc).__name__,
                exc,
            )
            return None
        if read.closed is not None:
            self.log.info("Flow %s %s: its retention runs from now", parent_id, read.closed)
        log_released(self.log, read)
        xcoms: dict[str, Any] = {"return_value": read.summary}
        if self.return_values:
            xcoms = {"return_value": read.values, FLOW_KEY: read.summary}
        ti = getattr(self, "task_instance", None)
        if ti is None:  # run outside a triggerer (tests): the event carries them
            return TaskSuccessEvent(xcoms=xcoms)
        try:
            for key, value in xcoms.items():
                await aset_xcom(ti, key, value)
        except Exception as exc:  # a task that resumes stores them itself
            self.log.warning(
                "Could not store the XCom here (%s: %s): the task resumes", type(exc).__name__, exc
            )
            return None
        return TaskSuccessEvent()

    def _warm_up(self) -> None:
        """Have the triggerer's supervisor make its API client now, while the flow runs.

        Ending the task here stores its XCom through the supervisor (``SetXCom``), and the
        supervisor builds its client - an in-process Execution API app, seconds of work - on
        the first request that needs it, blocking every request meanwhile. Built-in triggers
        that end a task without XComs never ask, so the first EchoMQ trigger of a fresh
        triggerer paid those seconds between reading the release and firing its event. So the
        first trigger of a process that may end its task asks one cheap question (the task's
        state, :func:`~echomq_provider._compat.atask_state`, which never raises) in the
        background at its start; its reply is not needed, only its side effect."""
        global _warm_up
        ti = getattr(self, "task_instance", None)
        loop = asyncio.get_running_loop()
        if not self.end_from_trigger or ti is None or (_warm_up and _warm_up[0] is loop):
            return

        async def ask() -> None:
            started = time.monotonic()
            await atask_state(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)
            self.log.info(
                "Triggerer's supervisor ready to store XComs (%.2f s)", time.monotonic() - started
            )

        _warm_up = (loop, loop.create_task(ask()))

    async def cleanup(self) -> None:
        """Close the client if one is open (idempotent; Airflow calls it on every exit)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def _cancel_if_marked_failed(self) -> None:
        ti = getattr(self, "task_instance", None)
        if ti is None:  # run outside a triggerer (tests, dag.test()): nobody marked anything
            return
        state = await atask_state(ti.dag_id, ti.run_id, ti.task_id, ti.map_index)
        if state not in ("failed", "upstream_failed"):
            return
        try:
            client = (
                self._client
                or await EchoMQHook(self.echomq_conn_id, prefix=self.prefix).aget_conn()
            )
            self._client = client
            result = await client.cancel_flow(
                self.queue, self.parent_id, reason=f"task {ti.task_id} was marked {state}"
            )
        except EchoMQError as exc:
            self.log.error(
                "Could not cancel flow %s: %s: %s", self.parent_id, type(exc).__name__, exc
            )
            return
        self.log.info(
            "Task marked %s: flow %s cancelled (%d children stopped)",
            state,
            self.parent_id,
            result.children,
        )

    async def _wait(self) -> dict[str, Any]:
        where = f"flow {self.parent_id} in queue {self.queue!r}"
        last_progress: float | None = None
        try:
            wait = self._flow_wait(fresh=True)
            self._client = client = await EchoMQHook(
                self.echomq_conn_id, prefix=self.prefix
            ).aget_conn()
            while True:
                verdict = await client.connection.perform(wait.read(client.keys))
                snap = verdict.snap
                if verdict.kind == MISSING:  # the task raises it as JobNotFound on resuming
                    gone = not_found(client.keys, self.queue, self.parent_id)
                    missing = await client.perform(gone)
                    return {"status": "missing", "message": str(missing)}
                if verdict.never_released:
                    failed = await client.failed_children(self.queue, self.parent_id)
                    reported = dict(sorted(failed.items())[:MAX_REPORTED])
                    event = {
                        "status": "failed",
                        "failed": reported,
                        "failed_count": len(failed),
                        "snapshot": snap.to_dict(),
                    }
                    if verdict.kind == CANCELLED:
                        event["cancelled"] = snap.error or ""
                    return event
                if verdict.ready:
                    return {"status": "success", "snapshot": snap.to_dict()}
                if verdict.gave_up:
                    why = f": {verdict.hint}" if verdict.hint else ""
                    return {
                        "status": "timeout",
                        "snapshot": snap.to_dict(),
                        "message": f"{where} not released by its deadline "
                        f"({snap.dependencies} of {snap.total} outstanding){why}",
                    }
                now = time.monotonic()
                if last_progress is None or now - last_progress >= PROGRESS_EVERY:
                    last_progress = now
                    log_progress(self.log, snap)
                await asyncio.sleep(verdict.pause)
        except EchoMQError as exc:
            return {"status": "error", "message": f"{where}: {type(exc).__name__}: {exc}"}

    def _flow_wait(self, *, fresh: bool = False) -> FlowWait:
        """This run's :class:`~echomq_core.flows.waiting.FlowWait`: pauses of ``poll_interval`` from
        the first (the task read the flow just before it deferred), ``timeout_at`` as the
        time left from now."""
        if fresh or self._wait_state is None:
            left = None if self.timeout_at is None else max(0.0, self.timeout_at - time.time())
            self._wait_state = FlowWait(
                self.queue,
                self.parent_id,
                poll=self.poll_interval,
                timeout=left,
                first=self.poll_interval,
            )
        return self._wait_state

    def _next_sleep(self, snap: FlowSnapshot) -> float:
        """The pause after a read of ``snap`` (see :mod:`echomq_core.flows.waiting`):
        ``poll_interval``, shortened to the time the flow should take to settle at the rate it
        settled since the last read (at least :data:`FAST_POLL`) and to the time left before
        ``timeout_at``."""
        return self._flow_wait().judge(snap).pause
