"""EchoFlowTrigger: the deferrable half of EchoFlowSensor, run by the triggerer.

It polls one flow with the async client until the flow settles, then fires one event and
ends. The event is small on purpose (it is stored in the metadata DB): a status and counts.
The children's results are read by the sensor when it resumes on a worker, not carried here.

==============  ===========================================================================
``status``      the event also holds
==============  ===========================================================================
``success``     ``snapshot``: the flow's counts (the parent is released; 0 outstanding)
``failed``      ``failed``: up to :data:`MAX_REPORTED` failed child ids -> error, and
                ``failed_count``: a fail-parent child died, so the parent failed
``timeout``     ``message``: ``timeout_at`` passed before the flow settled
``error``       ``message``: EchoMQ refused or could not reach the server
==============  ===========================================================================

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

from airflow.triggers.base import BaseTrigger, TriggerEvent

from echomq_core import AsyncEchoMQ, EchoMQError

from ..hooks.echomq import EchoMQHook

#: The most failed children an event names (the rest are counted): events live in the DB.
MAX_REPORTED = 20


class EchoFlowTrigger(BaseTrigger):
    """Fire once when the flow ``parent_id`` in ``queue`` is released or has failed.

    :param queue: the parent's queue.
    :param parent_id: the parent's id.
    :param echomq_conn_id: the ``echomq`` connection (fetched asynchronously).
    :param prefix: key prefix, overriding the connection's.
    :param poll_interval: seconds between reads.
    :param timeout_at: epoch seconds after which a ``timeout`` event fires (None: never).
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
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow's BaseTrigger is untyped
        self.queue = queue
        self.parent_id = parent_id
        self.echomq_conn_id = echomq_conn_id
        self.prefix = prefix
        self.poll_interval = float(poll_interval)
        self.timeout_at = None if timeout_at is None else float(timeout_at)
        self._client: AsyncEchoMQ | None = None

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
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # The client is closed before the event is yielded: after a single-event trigger
        # yields, the triggerer may never resume the generator, so nothing must stay open
        # across the yield. Cancellation (the task was cleared, the triggerer moved it) runs
        # the ``finally`` too.
        try:
            event = await self._wait()
        finally:
            await self.cleanup()
        yield TriggerEvent(event)  # type: ignore[no-untyped-call]

    async def cleanup(self) -> None:
        """Close the client if one is open (idempotent; Airflow calls it on every exit)."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def _wait(self) -> dict[str, Any]:
        where = f"flow {self.parent_id} in queue {self.queue!r}"
        try:
            self._client = client = await EchoMQHook(
                self.echomq_conn_id, prefix=self.prefix
            ).aget_conn()
            while True:
                snap = await client.snapshot(self.queue, self.parent_id)
                if snap.outcome in ("failed", "cancelled"):
                    failed = await client.failed_children(self.queue, self.parent_id)
                    reported = dict(sorted(failed.items())[:MAX_REPORTED])
                    event = {
                        "status": "failed",
                        "failed": reported,
                        "failed_count": len(failed),
                        "snapshot": snap.to_dict(),
                    }
                    if snap.outcome == "cancelled":
                        event["cancelled"] = snap.error or ""
                    return event
                if snap.outcome == "released":
                    return {"status": "success", "snapshot": snap.to_dict()}
                if self.timeout_at is not None and time.time() >= self.timeout_at:
                    return {
                        "status": "timeout",
                        "snapshot": snap.to_dict(),
                        "message": f"{where} not released by its deadline "
                        f"({snap.dependencies} of {snap.total} outstanding)",
                    }
                self.log.debug(
                    "%s: %d of %d children outstanding", where, snap.dependencies, snap.total
                )
                await asyncio.sleep(self._next_sleep())
        except EchoMQError as exc:
            return {"status": "error", "message": f"{where}: {type(exc).__name__}: {exc}"}

    def _next_sleep(self) -> float:
        if self.timeout_at is None:
            return self.poll_interval
        return max(0.0, min(self.poll_interval, self.timeout_at - time.time()))
