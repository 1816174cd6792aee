"""A flow with a success threshold (``min_success``) as the Airflow trigger hands it on:
released with its tolerated failures listed (the summary and a warning naming them), failed
when the threshold was missed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from echomq_provider.triggers.echo_flow import EchoFlowTrigger

from echomq_core import Child, EchoMQ

pytestmark = pytest.mark.onlystandalone

QUEUE = "trig-th"


@pytest.fixture
def client(standalone_server: Any, prefix: str, echomq_conn: str) -> Iterator[EchoMQ]:
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        yield mq


def _run(mq: EchoMQ, deaths: int) -> Any:
    parent_id = f"JOB-af/dag/task/{time.monotonic_ns()}"
    kids = [Child({"n": i}, max_attempts=1) for i in range(6)]
    ref = mq.add_flow(QUEUE, kids, parent_id=parent_id, barrier=True, min_success=4)
    queue = mq.queue(QUEUE)
    for job in queue.claim(6):
        if job.payload["n"] < deaths:
            queue.fail(job, f"bad row {job.payload['n']}")
        else:
            queue.complete(job, job.payload["n"])
    trigger = EchoFlowTrigger(
        queue=ref.queue, parent_id=ref.parent_id, poll_interval=0.05, end_from_trigger=True
    )
    return ref, asyncio.run(asyncio.wait_for(anext(trigger.run()), 10))


def test_released_with_failures_listed(
    client: EchoMQ, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.triggers.base import TaskSuccessEvent

    _, event = _run(client, deaths=2)
    assert isinstance(event, TaskSuccessEvent)
    summary = event.xcoms["return_value"]
    assert (summary["state"], summary["failed"], summary["allowed"]) == ("released", 2, 2)
    assert summary["failed_children"] == {"0": "bad row 0", "1": "bad row 1"}
    # Airflow's task logging (structlog) writes the trigger's log lines to stdout
    said = [line for line in capsys.readouterr().out.splitlines() if "[warning" in line]
    assert any("2 of 6 children failed (min_success allows 2): 0, 1" in m for m in said), said


def test_failed_under_the_threshold(client: EchoMQ) -> None:
    ref, event = _run(client, deaths=3)
    assert event.payload["status"] == "failed"
    assert client.snapshot(QUEUE, ref.parent_id).parent_state == "failed"
