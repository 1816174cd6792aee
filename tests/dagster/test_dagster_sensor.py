"""echomq_flow_sensor across several evaluations, with flows released by real workers."""

# No ``from __future__ import annotations``: Dagster reads asset annotations at definition.
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from dagster import DagsterInstance, asset
from dagster_echomq import EchoMQResource, echomq_flow_sensor, flow_from_tags
from dagster_echomq.sensor import parse_cursor
from dagster_support import client_url, evaluate_sensor

from echomq_core import Child, EchoMQ, FlowRef, ParentFailed, Pump

PARENT = "sn-parent"


@asset
def report() -> None:
    """What the sensor's runs would materialize (the sensor only requests them)."""


@pytest.mark.onlystandalone
def test_sensor_requests_exactly_one_run_per_released_flow(
    backend: Any,
    prefix: str,
    workers: Callable[..., Any],
    instance: DagsterInstance,
    capfd: pytest.CaptureFixture[str],
) -> None:
    url = client_url(backend)
    mq = EchoMQ(url, prefix=prefix)
    # The Pump that releases these cross-queue flows: deployed next to the workers, not
    # part of any Dagster run (the sensor itself runs none).
    pump = Pump(mq, interval=0.01, discover_every=0.1).start()
    try:
        a = mq.add_flow(
            PARENT,
            [Child({"n": i}, queue="sn-a") for i in range(3)],
            parent_id="JOB-a",
            barrier=True,
        )
        b = mq.add_flow(
            PARENT,
            [Child({"n": i}, queue="sn-b") for i in range(3)],
            parent_id="JOB-b",
            barrier=True,
        )
        c = mq.add_flow(
            PARENT,
            [Child({"n": i}, queue="sn-b") for i in range(2)],
            parent_id="JOB-c",
            barrier=True,
        )
        d = mq.add_flow(
            PARENT,
            [Child({"n": i, "fail": i == 1}, queue="sn-b") for i in range(2)],
            parent_id="JOB-d",
            barrier=True,
        )
        # Added without barrier=True: released, its parent is a job for a worker of PARENT
        # (none runs here), so it would wait for good and no run could close it.
        w = mq.add_flow(PARENT, [Child({"n": 1}, queue="sn-a")], parent_id="JOB-worker-run")
        not_yet = FlowRef(PARENT, "JOB-not-added-yet")
        watched = [a, b, c, d, w, not_yet]
        sensor = echomq_flow_sensor(
            name="flows_released",
            target=report,
            flows=lambda context, client: list(watched),
        )
        resources = {"echomq": EchoMQResource(url=url, prefix=prefix)}
        requested: Counter[str] = Counter()
        cursor: str | None = None

        def evaluate() -> list[str]:
            nonlocal cursor
            tick = evaluate_sensor(sensor, instance, cursor, resources)
            cursor = tick.cursor
            keys = [r.run_key for r in tick.run_requests or []]
            for request in tick.run_requests or []:
                assert request.run_key is not None
                assert flow_from_tags(request.tags) == FlowRef(PARENT, request.run_key)
            requested.update(k for k in keys if k is not None)
            return sorted(k for k in keys if k is not None)

        assert evaluate() == []  # nothing processed yet

        workers(url, prefix, "sn-a")
        mq.wait(PARENT, a.parent_id, timeout=30, poll=0.05)
        mq.wait(PARENT, w.parent_id, timeout=30, poll=0.05)
        capfd.readouterr()
        assert evaluate() == ["JOB-a"]  # not the worker-run flow: no run could close it
        warned = capfd.readouterr().err  # the sensor's log (Dagster writes it to stderr)
        assert "flow JOB-worker-run in 'sn-parent' was added without barrier=True" in warned
        assert evaluate() == []

        workers(url, prefix, "sn-b")
        mq.wait(PARENT, b.parent_id, timeout=30, poll=0.05)
        mq.wait(PARENT, c.parent_id, timeout=30, poll=0.05)
        with pytest.raises(ParentFailed):
            mq.wait(PARENT, d.parent_id, timeout=30, poll=0.05)
        assert evaluate() == ["JOB-b", "JOB-c"]  # the failed parent requests nothing
        assert evaluate() == []
        assert evaluate() == []

        assert requested == Counter({"JOB-a": 1, "JOB-b": 1, "JOB-c": 1})
        # the cursor holds the settled flows (failed included), not the unknown one
        settled = {(PARENT, p) for p in ("JOB-a", "JOB-b", "JOB-c", "JOB-d", "JOB-worker-run")}
        assert {tuple(p) for p in parse_cursor(cursor)["settled"]} == settled

        # A flow added later under the watched id is picked up on a later evaluation.
        late = mq.add_flow(
            PARENT, [Child({"n": 1}, queue="sn-a")], parent_id=not_yet.parent_id, barrier=True
        )
        mq.wait(PARENT, late.parent_id, timeout=30, poll=0.05)
        assert evaluate() == ["JOB-not-added-yet"]
        assert evaluate() == []

        # The cursor keeps only flows still watched, so it stays as small as the list.
        watched.remove(a)
        assert evaluate() == []
        assert [PARENT, "JOB-a"] not in parse_cursor(cursor)["settled"]
    finally:
        pump.stop()
        mq.close()
