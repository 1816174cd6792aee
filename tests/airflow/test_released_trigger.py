"""EchoFlowReleasedTrigger against a real server, run as a triggerer runs an asset watcher's
trigger: its own event loop, ``run()`` iterated for as long as it yields. The flows are barrier
flows of one queue, their children settled by hand (claim, complete) so each test controls
when a flow is released."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from echomq_provider.triggers.released import EchoFlowReleasedTrigger

from echomq_core import Child, EchoMQ, InvalidInput
from echomq_core.wire.calls import Call, Op

pytestmark = pytest.mark.onlystandalone

QUEUE = "released"


@pytest.fixture
def client(standalone_server: Any, prefix: str, echomq_conn: str) -> Iterator[EchoMQ]:
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        yield mq


def release(mq: EchoMQ, names: list[str]) -> list[str]:
    """Barrier flows ``JOB-<name>`` of one child each, released in order."""
    for name in names:
        mq.add_flow(QUEUE, [Child({"n": 1})], parent_id=f"JOB-{name}", barrier=True)
    queue = mq.queue(QUEUE)
    for job in queue.claim(len(names)):
        queue.complete(job, 1)
    return [f"JOB-{name}" for name in names]


async def collect(
    trigger: EchoFlowReleasedTrigger, into: list[dict[str, Any]], stop: asyncio.Event
) -> None:
    """Iterate the trigger as the triggerer does, its events into ``into``, until ``stop``:
    then cancel it, as a triggerer stopping does (its client closes)."""

    async def iterate() -> None:
        async for event in trigger.run():
            into.append(event.payload)

    task = asyncio.create_task(iterate())
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def watching(mq: EchoMQ) -> bool:
    """Whether the watcher's cursor is on the server: a trigger has polled."""
    key = mq.keys.watch(QUEUE, "to-dwh")
    return bool(mq.perform(exists(key)))


def exists(key: str) -> Op[int]:
    (found,) = yield [Call.cmd("EXISTS", key)]
    return int(found)


def trigger(**options: Any) -> EchoFlowReleasedTrigger:
    return EchoFlowReleasedTrigger(queue=QUEUE, watcher="to-dwh", poll_interval=0.05, **options)


async def until(condition: Any, seconds: float = 90) -> None:
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not reached")


def test_each_released_flow_fires_once_across_two_triggerers_and_a_restart(
    client: EchoMQ,
) -> None:
    """Two instances of the trigger (two triggerers after a takeover) run at once while flows
    are released; one is stopped, flows are released while none runs, a new one starts: every
    flow fired exactly once, with its reference and size, and closed."""

    async def scenario() -> tuple[list[dict[str, Any]], list[str]]:
        events: list[dict[str, Any]] = []
        stop_a, stop_b, stop_c = asyncio.Event(), asyncio.Event(), asyncio.Event()
        a = asyncio.create_task(collect(trigger(), events, stop_a))
        await until(lambda: watching(client))  # flows from now on are the watcher's
        b = asyncio.create_task(collect(trigger(), events, stop_b))
        ids = await asyncio.to_thread(release, client, [f"a{i:02d}" for i in range(20)])
        await until(lambda: len(events) >= 20)
        stop_a.set(), stop_b.set()
        await asyncio.gather(a, b)
        ids += await asyncio.to_thread(release, client, [f"b{i:02d}" for i in range(5)])
        c = asyncio.create_task(collect(trigger(), events, stop_c))
        await until(lambda: len(events) >= 25)
        await asyncio.sleep(0.3)  # nothing more comes
        stop_c.set()
        await c
        return events, ids

    events, ids = asyncio.run(scenario())
    assert sorted(e["parent_id"] for e in events) == sorted(ids)
    assert {(e["queue"], e["total"], e["ignored"]) for e in events} == {(QUEUE, 1, 0)}
    assert {client.snapshot(QUEUE, pid).parent_state for pid in ids} == {"closed"}


def test_close_flow_false_leaves_the_flows_released(client: EchoMQ) -> None:
    async def scenario() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        stop = asyncio.Event()
        task = asyncio.create_task(collect(trigger(close_flow=False), events, stop))
        await until(lambda: watching(client))
        await asyncio.to_thread(release, client, ["open1", "open2"])
        await until(lambda: len(events) == 2)
        stop.set()
        await task
        return events

    events = asyncio.run(scenario())
    assert [e["parent_id"] for e in events] == ["JOB-open1", "JOB-open2"]
    assert {client.snapshot(QUEUE, e["parent_id"]).parent_state for e in events} == {"released"}


def test_serialize_round_trips() -> None:
    made = trigger(close_flow=False, batch=7, prefix="pfx")
    classpath, kwargs = made.serialize()
    assert classpath == "echomq_provider.triggers.released.EchoFlowReleasedTrigger"
    assert EchoFlowReleasedTrigger(**kwargs).serialize() == (classpath, kwargs)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"queue": "bad name"}, "invalid queue name"),
        ({"watcher": "a:b"}, "invalid watcher name"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"batch": 0}, "batch"),
        ({"close_flow": "yes"}, "close_flow"),
    ],
)
def test_bad_arguments_are_refused_when_the_dag_is_parsed(
    options: dict[str, Any], match: str
) -> None:
    arguments = {"queue": QUEUE, "watcher": "w", **options}
    with pytest.raises(InvalidInput, match=match):
        EchoFlowReleasedTrigger(**arguments)
