"""Results that stream inside Airflow: a task downstream of the fan-out (``@task.echo_flow(
stream=True)`` here, ``EchoFlowOperator(stream=True)`` in the deployment test) consumes
``flow_results(flow, follow=True)`` while the children run.

Real Airflow (``dag.test()``), a real server, a real worker process; every precondition that
depends on timing goes through a gate the test controls (``tests/airflow/dags/
echomq_stream_gated.py`` says which).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from echomq_provider.flow_specs import parent_id_for
from echomq_provider.hooks.echomq import EchoMQHook
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results

from echomq_core import (
    Child,
    EchoMQ,
    FlowCancelled,
    FlowTimeout,
    InvalidArgument,
    InvalidInput,
    JobNotFound,
    ParentFailed,
)

from .helpers import OpenWhen, read_records, run_dag

pytestmark = pytest.mark.onlystandalone

DAG = "echomq_stream_gated"


@pytest.fixture
def markers(tmp_path: Path, proc_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The gates' folder, seen by the worker process and by the DAG's tasks (in process)."""
    path = tmp_path / "markers"
    path.mkdir()
    proc_env["ECHOMQ_TEST_MARKERS"] = str(path)
    monkeypatch.setenv("ECHOMQ_TEST_MARKERS", str(path))
    return path


def _finished_ms(mq: EchoMQ, parent: str, n: int) -> list[int]:
    return [mq.get_job("example.square", f"{parent}.{i}").finished_ms or 0 for i in range(n)]


def test_a_downstream_task_consumes_the_results_while_the_children_run(
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Any,
    markers: Path,
    record_file: Path,
    standalone_server: Any,
    prefix: str,
) -> None:
    start_worker()
    with OpenWhen(markers / "go-a", DAG, "load", ("running",)) as gate:
        run = run_dag(airflow_db, DAG, conf={"n": 6, "run": "a"})
    assert gate.opened_in == "running", gate  # the children settled while load ran
    assert run.state == "success", {t: run.state_of(t) for t in run.tasks}
    got = run.xcom("load")
    records = read_records(record_file)
    # every child once, in settle order (the last child was gated on load's first value)
    assert sorted(index for index, _ in got) == list(range(6))
    assert [r["index"] for r in records] == [index for index, _ in got]
    assert {index: value for index, value in got} == {i: (i + 1) ** 2 for i in range(6)}
    assert got[-1][0] == 5  # the gated last child settled last
    parent = parent_id_for(DAG, run.run_id, "fan_out")
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        finished = _finished_ms(mq, parent, 6)
        # load had its first value before the last child completed: it streamed
        assert int(records[0]["at"] * 1000) <= finished[5]  # whole ms: the same ms counts
        # read to the release, the follower closed the barrier flow (no sensor here)
        assert mq.snapshot("test.stream", parent).parent_state == "closed"


def test_a_retried_follower_reads_from_the_start_and_returns_each_child_once(
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Any,
    markers: Path,
    record_file: Path,
) -> None:
    start_worker()
    with OpenWhen(markers / "go-b", DAG, "load", ("running",)) as gate:
        run = run_dag(airflow_db, DAG, conf={"n": 6, "run": "b", "fail_after": 2})
    assert gate.opened_in == "running", gate
    assert run.state == "success", {t: run.state_of(t) for t in run.tasks}
    assert run.tasks["load"].try_number == 2
    records = read_records(record_file)
    first = [r["index"] for r in records if r["try"] == 1]
    second = [r["index"] for r in records if r["try"] == 2]
    got = run.xcom("load")
    # try 1 stopped mid-stream (its last child still gated, so the flow was held); try 2 read
    # the log from its start: the same order, each child once, nothing skipped
    assert len(first) == 2 and second[:2] == first
    assert [index for index, _ in got] == second and sorted(second) == list(range(6))


def test_a_failed_flow_fails_the_follower_and_is_cancelled(
    echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        ref = mq.add_flow(
            "sf", [Child(i) for i in range(3)], barrier=True, stream=True, parent_id="JOB-af/d/t/1"
        )
        work = mq.queue("sf")
        done, dying = work.claim(2)  # the third child stays pending
        assert work.complete_many([(done, "ok")]) == [True]
        stream = flow_results(ref.to_dict(), follow=True)
        index = int(done.id.rsplit(".", 1)[1])
        assert next(stream) == (index, "ok")  # the index, as flow_results gives it
        work.fail(dying, "boom", retry=False)
        with pytest.raises(ParentFailed, match="boom"):
            next(stream)
        # cancelled as the sensor would: the child that had not started never starts
        assert mq.snapshot("sf", ref.parent_id).parent_state == "cancelled"
        assert work.claim(1) == []
        cancelled = mq.add_flow("sf", [Child(1)], barrier=True, stream=True)
        mq.cancel_flow("sf", cancelled.parent_id, reason="not needed")
        with pytest.raises(FlowCancelled, match="not needed"):
            list(flow_results(cancelled.to_dict(), follow=True))


def test_a_follower_past_its_timeout_gives_up_and_cancels_the_flow(
    echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    """``flow_results(..., follow=True, timeout=...)``: past it, FlowTimeout after the results
    settled so far, and the flow cancelled as a sensor that times out cancels it (unless
    ``cancel_on_failure=False``); a timeout without ``follow`` is refused."""
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        flows = [
            mq.add_flow("st", [Child(i) for i in range(2)], barrier=True, stream=True,
                        parent_id=f"JOB-af/d/follow/{n}")
            for n in range(2)
        ]  # fmt: skip
        work = mq.queue("st")
        for job in work.claim(4):
            if job.id.endswith(".0"):
                assert work.complete_many([(job, "ok")]) == [True]
        for ref, cancel in zip(flows, (True, False), strict=True):
            stream = flow_results(
                ref.to_dict(), follow=True, timeout=0.3, cancel_on_failure=cancel
            )
            assert next(stream) == (0, "ok")
            with pytest.raises(FlowTimeout, match=r"not released within timeout=0\.3s"):
                next(stream)
        assert mq.snapshot("st", flows[0].parent_id).parent_state == "cancelled"
        assert "the follower gave up" in (mq.snapshot("st", flows[0].parent_id).error or "")
        assert mq.snapshot("st", flows[1].parent_id).parent_state == "held"
        with pytest.raises(InvalidInput, match="timeout applies to follow=True"):
            list(flow_results(flows[1].to_dict(), timeout=1))


def test_what_cannot_be_followed_is_refused_before_any_result(
    echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        plain = mq.add_flow("sb", [Child(1)], barrier=True)  # no stream=True
        [job] = mq.queue("sb").claim(1)
        mq.queue("sb").complete_many([(job, 1)])
        with pytest.raises(InvalidArgument, match="keeps no settle log: add it with stream=True"):
            list(flow_results(plain.to_dict(), follow=True))
        assert mq.snapshot("sb", plain.parent_id).parent_state == "released"  # left as it was
        assert dict(flow_results(plain.to_dict())) == {0: 1}  # read whole, once released
        whole = {"queue": "sb", "parent_id": plain.parent_id}
        with pytest.raises(InvalidInput, match="a slice of a flow cannot be followed"):
            list(flow_results({**whole, "start": 0, "stop": 1}, follow=True))
        with pytest.raises(InvalidInput, match="follow must be True or False"):
            list(flow_results(whole, follow="yes"))  # type: ignore[arg-type]
        with pytest.raises(JobNotFound, match="no flow 'JOB-none' in queue 'sb': never added"):
            list(EchoMQHook().follow_results({"queue": "sb", "parent_id": "JOB-none"}))
    with pytest.raises(InvalidInput, match="stream must be True or False"):
        EchoFlowOperator(task_id="t", parent_queue="q", children=[1], stream="yes")  # type: ignore[arg-type]
