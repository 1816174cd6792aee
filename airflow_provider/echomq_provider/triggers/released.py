"""Event-driven scheduling: a DAG run for each flow of a queue that is released.

Using::

    from airflow.sdk import Asset, AssetWatcher, dag, task
    from echomq_provider.triggers.released import EchoFlowReleasedTrigger

    reports = Asset(
        "reports-released",
        watchers=[
            AssetWatcher(
                name="reports-released",
                trigger=EchoFlowReleasedTrigger(queue="reports", watcher="reports-to-dwh"),
            )
        ],
    )

    @dag(schedule=[reports])
    def load():
        @task
        def read(triggering_asset_events=None):
            for events in triggering_asset_events.values():
                for event in events:
                    flow = event.extra["payload"]  # queue, parent_id, released_ms, total, ignored
                    ...  # flow_results(flow) reads its values

The flows are barrier flows added anywhere - a service, a script, another orchestrator - with
no sensor and no polling DAG: the triggerer runs this trigger for the asset, and each flow of
``queue`` released from then on fires one event, so one DAG run.

Once per flow, across triggerers: the trigger is a reader of the release watcher named
``watcher`` (:mod:`echomq_core.flows.release_watch`), whose cursor lives on the server. Two
triggerers running it at once (a takeover while the old one still ran), or one restarted,
never fire the same flow twice; flows released while no triggerer ran fire at the next poll.
A triggerer killed between taking a flow and Airflow writing its event (under a second) loses
that one event; the flow stays readable (``echomq flow ls QUEUE --state closed``). Give each
watched asset its own ``watcher`` name: two assets on one name would split the flows between
them.

``close_flow=True`` (the default) closes each flow as it fires, as a sensor closes what it
read: its ``closed`` retention (1 day by default) starts, and the DAG run reads it until then.
The server being unreachable is logged and retried (the trigger does not fail: an asset's
watcher has nobody to report a failure to), every ``poll_interval`` to 30 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from echomq_core import EchoMQError, InvalidInput
from echomq_core.integration import MAX_TAKE, check_int, check_queue, check_seconds, check_watcher

from ..hooks.echomq import EchoMQHook

#: The longest pause between two tries while the server is unreachable, seconds.
MAX_BACKOFF = 30.0


class EchoFlowReleasedTrigger(BaseEventTrigger):
    """Fires ``{queue, parent_id, released_ms, total, ignored}`` for each barrier flow of
    ``queue`` released after the watcher ``watcher`` first polled; see the module doc.

    :param queue: the flows' (parents') queue.
    :param watcher: the release watcher's name, one per watched asset (letters, digits and
        ``. _ - / @ +``).
    :param echomq_conn_id: the ``echomq`` connection.
    :param prefix: key prefix, overriding the connection's.
    :param poll_interval: seconds between two polls that found nothing (default 1).
    :param close_flow: close each flow as it fires (default True).
    :param batch: the most flows one poll takes (default 100).
    """

    def __init__(
        self,
        *,
        queue: str,
        watcher: str,
        echomq_conn_id: str = EchoMQHook.default_conn_name,
        prefix: str | None = None,
        poll_interval: float = 1.0,
        close_flow: bool = True,
        batch: int = 100,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow's BaseTrigger is untyped
        # refused when the DAG file is parsed, not in the triggerer
        self.queue = check_queue(queue)
        self.watcher = check_watcher(watcher)
        self.echomq_conn_id = echomq_conn_id
        self.prefix = prefix
        self.poll_interval = check_seconds("poll_interval", poll_interval, 0.05, 3600)
        if not isinstance(close_flow, bool):
            raise InvalidInput(f"close_flow must be True or False, got {close_flow!r}")
        self.close_flow = close_flow
        self.batch = check_int("batch", batch, 1, MAX_TAKE)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "queue": self.queue,
                "watcher": self.watcher,
                "echomq_conn_id": self.echomq_conn_id,
                "prefix": self.prefix,
                "poll_interval": self.poll_interval,
                "close_flow": self.close_flow,
                "batch": self.batch,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        client = await EchoMQHook(self.echomq_conn_id, prefix=self.prefix).aget_conn()
        cursor: str | None = None
        pause = self.poll_interval
        try:
            while True:
                try:
                    cursor, taken = await client.take_released(
                        self.queue, self.watcher, cursor, limit=self.batch, close=self.close_flow
                    )
                except EchoMQError as exc:
                    self.log.warning(
                        "Watcher %s of %r: %s: %s; trying again in %.1f s",
                        self.watcher, self.queue, type(exc).__name__, exc, pause,
                    )  # fmt: skip
                    await asyncio.sleep(pause)
                    pause = min(MAX_BACKOFF, pause * 2)
                    continue
                pause = self.poll_interval
                for flow in taken:
                    self.log.info(
                        "Flow %s of %r released (%d children): an event",
                        flow.parent_id, self.queue, flow.total,
                    )  # fmt: skip
                    yield TriggerEvent(flow.to_dict())  # type: ignore[no-untyped-call]
                if not taken:
                    await asyncio.sleep(self.poll_interval)
        finally:
            await client.close()
