"""The Airflow adapters on a flow that is not there (issue 48, item 5): the sensor's poke, the
trigger's event and the task resuming from it, and the results readers raise
:class:`~echomq_core.JobNotFound` at once, naming the queue and the id, with the closest
registered queue when the queue name is wrong - never a wait until the timeout."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest
from echomq_provider.results import flow_results, flow_slices
from echomq_provider.sensors.echo_flow import EchoFlowSensor
from echomq_provider.triggers.echo_flow import EchoFlowTrigger

from echomq_core import Child, EchoMQ, InvalidInput, JobNotFound

from .test_results import _NoXCom

pytestmark = pytest.mark.onlystandalone

#: ids as the provider derives them (dag / task / run id / map index: they hold '/')
PID = "JOB-af/reports/fan_out/manual__2026-12-07T00.00.00+00.00/-1"
TYPO = "JOB-af/reports/fan_out/manual__2026-12-07T00.00.00+00.00/1"


@pytest.fixture
def added(standalone_server: Any, prefix: str, echomq_conn: str) -> None:
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        mq.add_flow("reports", [Child(1, queue="reports.work")], parent_id=PID, barrier=True)


CASES = [
    ("reports", TYPO, f"no flow {re.escape(repr(TYPO))} in queue 'reports': never added"),
    (
        "reprots",
        PID,
        f"no flow {re.escape(repr(PID))} in queue 'reprots': .*did you mean 'reports'\\?",
    ),
]


@pytest.mark.parametrize(("queue", "parent_id", "says"), CASES)
def test_a_poke_raises_at_once(added: None, queue: str, parent_id: str, says: str) -> None:
    sensor = EchoFlowSensor(
        task_id="wait", parent_queue=queue, parent_id=parent_id, timeout=600, poke_interval=5
    )
    started = time.monotonic()
    try:
        with pytest.raises(JobNotFound, match=says):
            sensor.poke({"ti": _NoXCom()})  # type: ignore[typeddict-item]
    finally:
        sensor._close()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(("queue", "parent_id", "says"), CASES)
def test_the_trigger_says_missing_and_the_task_raises_it(
    added: None, queue: str, parent_id: str, says: str
) -> None:
    trigger = EchoFlowTrigger(queue=queue, parent_id=parent_id, poll_interval=5.0)
    event = asyncio.run(asyncio.wait_for(anext(trigger.run()), 10))
    assert event.payload["status"] == "missing"
    sensor = EchoFlowSensor(task_id="wait", parent_queue=queue, parent_id=parent_id)
    try:
        with pytest.raises(JobNotFound, match=says):
            sensor.execute_complete({}, event.payload)  # type: ignore[arg-type]
    finally:
        sensor._close()


@pytest.mark.parametrize(("queue", "parent_id", "says"), CASES)
def test_the_results_readers_raise_at_once(
    added: None, queue: str, parent_id: str, says: str
) -> None:
    flow = {"queue": queue, "parent_id": parent_id}
    with pytest.raises(JobNotFound, match=says):
        list(flow_results(flow))
    with pytest.raises(JobNotFound, match=says):
        list(flow_results(flow, follow=True))
    with pytest.raises(JobNotFound, match=says):
        flow_slices(flow, size=10)


def test_the_operators_specs_may_be_a_generator() -> None:
    """Issue 48, item 7: what ``@task.echo_flow`` returns (or ``children=``) may be a generator
    of specs, keyed ones too; it is read once. A mapping or a string is still refused."""
    from echomq_provider.flow_specs import to_children

    taken = []

    def specs() -> Any:
        for n in range(3):
            taken.append(n)
            yield {"payload": n, "key": f"k{n}"}

    children = to_children(specs(), default_queue="work", parent_id="JOB-gen")
    assert taken == [0, 1, 2]
    assert [(c.payload, c.queue) for c in children] == [(0, "work"), (1, "work"), (2, "work")]
    assert len({c.id for c in children}) == 3
    assert [c.payload for c in to_children(n * n for n in range(4))] == [0, 1, 4, 9]
    for bad in ({"payload": 1}, "[1, 2]", 7):
        with pytest.raises(InvalidInput, match="must be a list"):
            to_children(bad)
