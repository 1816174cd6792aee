"""``@task.echo_flow`` and ``EchoFlowOperator(wait_for_completion=True)``: plan, fan-out and
wait in one task. Real Airflow (``dag.test()``), a real server, real worker processes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from echomq_provider.flow_specs import parent_id_for

from echomq_core import EchoMQ, InvalidInput

from .helpers import DEFERRED, OpenWhen, run_dag

pytestmark = pytest.mark.onlystandalone


def test_one_task_plans_adds_and_waits(
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Any,
    standalone_server: Any,
    prefix: str,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    proc_env: dict[str, str],
) -> None:
    proc_env.update(ECHOMQ_TEST_MARKERS=str(tmp_path))  # "deferred"'s children wait for a go
    start_worker()
    deferred = OpenWhen(tmp_path / "deferred.go", "echomq_taskflow", "deferred", DEFERRED)
    with caplog.at_level(logging.INFO), deferred:
        run = run_dag(airflow_db, "echomq_taskflow")
    assert deferred.opened_in in DEFERRED, deferred
    states = {task_id: run.state_of(task_id) for task_id in run.tasks}
    assert states == {
        "squares": "success",
        "total": "success",
        "values": "success",
        "double": "success",
        "deferred": "success",
        "classic": "success",
        "empty": "skipped",
        "after_empty": "skipped",
        "shards": "success",
        "sizes": "success",
    }
    dag_id, run_id = "echomq_taskflow", run.run_id
    # the sensor's summary, from the task that added the flow: read page by page downstream
    summary = run.xcom("squares")
    parent = parent_id_for(dag_id, run_id, "squares")
    assert {k: summary[k] for k in ("queue", "parent_id", "state", "total", "processed")} == {
        "queue": "example.reports",
        "parent_id": parent,
        "state": "closed",
        "total": 5,
        "processed": 5,
    }
    assert run.xcom("total") == sum(n * n for n in range(1, 6))
    # return_values: the values in spec order, mapped over; the summary beside them
    assert run.xcom("values") == [{"n": n, "value": n * n} for n in range(1, 4)]
    assert run.mapped_xcoms("double") == [2, 8, 18]
    assert run.xcom("values", "flow")["processed"] == 3
    # deferred: the first read found the flow outstanding, the trigger fired, the task resumed
    logged = capfd.readouterr().out + caplog.text  # the trigger's progress line
    assert any("EchoFlowTrigger" in line and "/deferred/" in line for line in logged.splitlines())
    assert run.xcom("deferred")["processed"] == 2
    assert run.xcom("classic")["state"] == "closed"
    # a flow per mapped instance, each with its own retry-safe parent id
    assert run.xcom("sizes") == [1, 2]
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        for task_id in ("squares", "values", "deferred", "classic"):
            snap = mq.snapshot("example.reports", parent_id_for(dag_id, run_id, task_id))
            assert snap.parent_state == "closed", task_id
        mapped = [parent_id_for(dag_id, run_id, "shards", i) for i in (0, 1)]
        assert [mq.snapshot("example.reports", p).total for p in mapped] == [1, 2]
        # the empty plan added nothing
        assert mq.snapshot("example.reports", parent_id_for(dag_id, run_id, "empty")).outcome == (
            "missing"
        )


def test_a_waiting_task_that_gives_up_cancels_its_flow(
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Any,
    standalone_server: Any,
    prefix: str,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    start_worker()
    with caplog.at_level(logging.INFO):
        run = run_dag(airflow_db, "echomq_taskflow_fail")
    dag_id, run_id = "echomq_taskflow_fail", run.run_id
    assert {t: run.state_of(t) for t in run.tasks} == {
        "fail_fast": "failed",
        "too_slow": "failed",
        "too_slow_kept": "failed",
        "killed": "failed",
    }
    logged = capfd.readouterr().out + caplog.text
    parent = parent_id_for(dag_id, run_id, "fail_fast")
    assert f"{parent}.1: Unrecoverable: item 2: corrupt input" in logged
    assert f"First failed child {parent}.1 (queue 'example.cube')" in logged
    assert 'worker_proc.py", line' in logged  # its traceback, from the worker's process
    assert "not released within wait_timeout=1s (2 of 2 outstanding)" in logged
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        snap = mq.snapshot("example.reports", parent)
        assert snap.parent_state == "cancelled" and "corrupt input" in (snap.error or "")
        assert mq.get_job("example.later", f"{parent}.2").state == "cancelled"
        slow_id = parent_id_for(dag_id, run_id, "too_slow")
        slow = mq.snapshot("example.reports", slow_id)
        assert slow.parent_state == "cancelled" and "wait_timeout" in (slow.error or "")
        assert "operator too_slow: AirflowFailException" in (slow.error or "")
        assert [mq.get_job("test.idle", f"{slow_id}.{i}").state for i in (0, 1)] == [
            "cancelled"
        ] * 2
        kept = mq.snapshot("example.reports", parent_id_for(dag_id, run_id, "too_slow_kept"))
        assert kept.parent_state == "held"
        killed = mq.snapshot("example.reports", parent_id_for(dag_id, run_id, "killed"))
        assert killed.parent_state == "cancelled" and "operator killed: the task was killed" in (
            killed.error or ""
        )


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"wait_for_completion": "yes"}, "wait_for_completion must be True or False"),
        ({"poll_interval": 0}, "poll_interval must be"),
        ({"wait_timeout": -1}, "wait_timeout must be"),
        ({"return_values": 1}, "return_values must be True or False"),
        ({"max_values": 0}, "max_values"),
        ({"deferrable": "no"}, "deferrable must be True, False or None"),
        ({"end_from_trigger": 1}, "end_from_trigger must be True, False or None"),
        ({"children": None}, "children is required"),
    ],
)
def test_bad_waiting_options_are_refused_when_the_dag_is_parsed(
    airflow_db: Path, kwargs: dict[str, Any], named: str
) -> None:
    from echomq_provider.operators.echo_flow import EchoFlowOperator
    from echomq_provider.sensors.echo_flow import EchoFlowSensor

    args: dict[str, Any] = {"task_id": "fan_out", "parent_queue": "q", "children": [1]}
    with pytest.raises(InvalidInput, match=named):
        EchoFlowOperator(**{**args, **kwargs})
    # the sensor shares the waiting options and their checks (FlowWaiting._init_waiting)
    if not {"wait_for_completion", "poll_interval", "wait_timeout", "children"} & set(kwargs):
        sensor_args: dict[str, Any] = {"task_id": "wait", "parent_queue": "q", "parent_id": "p"}
        with pytest.raises(InvalidInput, match=named):
            EchoFlowSensor(**{**sensor_args, **kwargs})


def test_the_decorator_is_registered_with_airflow(airflow_db: Path) -> None:
    from airflow.sdk import task
    from echomq_provider.decorators.echo_flow import echo_flow_task

    assert task.echo_flow is echo_flow_task
