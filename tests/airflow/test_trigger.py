"""EchoFlowTrigger against a real server, run the way a triggerer runs it (its own event loop).

The children are settled by hand here (claim, complete / fail through the queue API) so each
test controls exactly when the flow moves. Parent and children share a queue, so no Pump is
needed. The connection comes from ``AIRFLOW_CONN_ECHOMQ_DEFAULT`` through the trigger's
async connection fetch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from echomq_provider.triggers.echo_flow import EchoFlowTrigger

from echomq_core import Child, EchoMQ, FlowRef

pytestmark = pytest.mark.onlystandalone

QUEUE = "trig"


@pytest.fixture
def client(standalone_server: Any, prefix: str, echomq_conn: str) -> Iterator[EchoMQ]:
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        yield mq


def add_flow(mq: EchoMQ, children: list[Child] | None = None, barrier: bool = False) -> FlowRef:
    return mq.add_flow(
        QUEUE,
        children or [Child({"n": 1}), Child({"n": 2})],
        parent_id=f"JOB-trig-{time.monotonic_ns()}",
        barrier=barrier,
    )


def complete_all(mq: EchoMQ) -> None:
    queue = mq.queue(QUEUE)
    for job in queue.claim(10):
        queue.complete(job, job.payload["n"] * 10)


def trigger_for(ref: FlowRef, **options: Any) -> EchoFlowTrigger:
    return EchoFlowTrigger(queue=ref.queue, parent_id=ref.parent_id, poll_interval=0.05, **options)


async def first_event(trigger: EchoFlowTrigger, timeout: float = 10.0) -> Any:
    return await asyncio.wait_for(anext(trigger.run()), timeout)


def test_serialize_round_trips() -> None:
    try:
        from airflow.sdk._shared.module_loading import import_string
        from airflow.sdk.serde import deserialize, serialize
    except ImportError:  # Airflow 3.1
        from airflow.sdk.module_loading import import_string  # type: ignore[no-redef]
        from airflow.serialization.serde import (  # type: ignore[no-redef]
            deserialize,
            serialize,
        )

    trigger = EchoFlowTrigger(
        queue="q",
        parent_id="JOB-p",
        echomq_conn_id="other",
        prefix="pfx",
        poll_interval=2,
        timeout_at=1234.5,
        max_values=50,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "echomq_provider.triggers.echo_flow.EchoFlowTrigger"
    # As the task runner ships it to the triggerer: serde-encoded, re-imported by path.
    rebuilt = import_string(classpath)(**deserialize(serialize(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs == {
        "queue": "q",
        "parent_id": "JOB-p",
        "echomq_conn_id": "other",
        "prefix": "pfx",
        "poll_interval": 2.0,
        "timeout_at": 1234.5,
        "cancel_on_kill": True,
        "end_from_trigger": False,
        "return_values": False,
        "max_values": 50,
        "close_flow": False,
    }


def test_success_when_count_reaches_zero(client: EchoMQ) -> None:
    ref = add_flow(client)
    complete_all(client)
    event = asyncio.run(first_event(trigger_for(ref)))
    assert event.payload["status"] == "success"
    assert event.payload["snapshot"]["dependencies"] == 0
    assert event.payload["snapshot"]["processed"] == 2


def test_end_from_trigger_ends_the_task_with_its_xcom(client: EchoMQ) -> None:
    """What the task would return on resuming, done in the trigger: the summary (the flow
    closed), or the values in spec order with the summary under ``flow``."""
    from airflow.triggers.base import TaskSuccessEvent

    ref = add_flow(client, barrier=True)  # as the operator adds: read and closed by a task
    complete_all(client)
    event = asyncio.run(first_event(trigger_for(ref, end_from_trigger=True, close_flow=True)))
    assert isinstance(event, TaskSuccessEvent)
    summary = event.xcoms["return_value"]
    assert (summary["parent_id"], summary["state"], summary["processed"]) == (
        ref.parent_id,
        "closed",
        2,
    )
    assert client.snapshot(QUEUE, ref.parent_id).parent_state == "closed"

    ref = add_flow(client, barrier=True)
    complete_all(client)
    trigger = trigger_for(ref, end_from_trigger=True, return_values=True)
    event = asyncio.run(first_event(trigger))
    assert event.xcoms["return_value"] == [10, 20]  # spec order
    assert event.xcoms["flow"]["state"] == "released"  # close_flow=False: left released
    # a failure is not ended here: the task resumes to raise it (retries, callbacks, soft_fail)
    failing = add_flow(client, [Child({"n": 1}, max_attempts=1)])
    queue = client.queue(QUEUE)
    [job] = queue.claim(1)
    queue.fail(job, "boom")
    event = asyncio.run(first_event(trigger_for(failing, end_from_trigger=True)))
    assert not isinstance(event, TaskSuccessEvent) and event.payload["status"] == "failed"


def test_the_pause_shrinks_as_the_flow_nears_its_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """poll_interval at most; while children settle, the time the rest should take at the
    rate seen since the last read, never under FAST_POLL; the deadline still caps it."""
    from echomq_provider.triggers import echo_flow

    from echomq_core import FlowSnapshot

    clock = [100.0]
    monkeypatch.setattr(echo_flow.time, "monotonic", lambda: clock[0])

    def snap(settled: int, total: int = 1000) -> FlowSnapshot:
        return FlowSnapshot("q", "JOB-p", "held", total, total - settled, settled, 0, 0)

    wait = EchoFlowTrigger(queue="q", parent_id="JOB-p", poll_interval=1.0)._flow_wait()
    assert wait.judge(snap(0)).pause == 1.0  # no rate yet
    clock[0] += 1.0
    assert wait.judge(snap(0)).pause == 1.0  # nothing settled: no rate
    clock[0] += 1.0
    assert wait.judge(snap(200)).pause == 1.0  # 200/s, 800 to go: 4 s, capped
    clock[0] += 1.0
    assert wait.judge(snap(900)).pause == pytest.approx(100 / 700)  # 700/s, 100 to go
    clock[0] += 0.1
    assert wait.judge(snap(999)).pause == echo_flow.FAST_POLL  # 1 to go at 990/s
    timed = EchoFlowTrigger(
        queue="q", parent_id="JOB-p", poll_interval=1.0, timeout_at=time.time() + 0.01
    )
    assert timed._flow_wait().judge(snap(0)).pause <= 0.01


def test_no_event_while_children_outstanding(client: EchoMQ) -> None:
    ref = add_flow(client)

    async def scenario() -> Any:
        trigger = trigger_for(ref)
        with pytest.raises(TimeoutError):  # polls for a while, fires nothing
            await first_event(trigger, timeout=0.5)
        assert trigger._client is None  # cancelled: its client was closed on the way out
        # cancelled with no task marked failed (here: no task at all; in a triggerer: a
        # shutdown, a move, a clear): the flow is left as it is
        assert client.snapshot(ref.queue, ref.parent_id).parent_state == "held"
        await trigger.cleanup()  # idempotent
        # The children settle while a new instance (as after a triggerer restart) polls.
        waiting = asyncio.ensure_future(first_event(trigger_for(ref)))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await asyncio.to_thread(complete_all, client)
        return await waiting

    event = asyncio.run(scenario())
    assert event.payload["status"] == "success"


def test_failure_event_when_parent_fails(client: EchoMQ) -> None:
    ref = add_flow(
        client,
        [Child({"n": 1}), Child({"n": 2}, ignore_dependency_on_failure=True), Child({"n": 3})],
    )
    queue = client.queue(QUEUE)
    jobs = {job.payload["n"]: job for job in queue.claim(10)}
    queue.fail(jobs[2], "ignored boom", retry=False)
    queue.fail(jobs[3], "disk full", retry=False)
    event = asyncio.run(first_event(trigger_for(ref)))
    assert event.payload["status"] == "failed"
    assert event.payload["failed"] == {f"{ref.parent_id}.2": "disk full"}
    assert event.payload["failed_count"] == 1


def test_timeout_event_after_deadline(client: EchoMQ) -> None:
    ref = add_flow(client)
    started = time.monotonic()
    event = asyncio.run(first_event(trigger_for(ref, timeout_at=time.time() + 0.3)))
    assert event.payload["status"] == "timeout"
    assert "2 of 2 outstanding" in event.payload["message"]
    assert time.monotonic() - started < 5


def test_error_event_when_server_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    from echomq_core.server import free_port

    monkeypatch.setenv("AIRFLOW_CONN_ECHOMQ_DEFAULT", f"echomq://127.0.0.1:{free_port()}/0")
    event = asyncio.run(first_event(EchoFlowTrigger(queue="q", parent_id="JOB-x")))
    assert event.payload["status"] == "error"
    assert "JOB-x" in event.payload["message"]
