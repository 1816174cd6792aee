"""Whole DAG runs: real Airflow (``dag.test()``, sqlite), a real server, real worker processes.

``dag.test()`` runs each task in this process and a deferred task's trigger inline, through
the same Task SDK supervisor comms a worker and a triggerer use. The example DAG is run as
shipped (deferrable) and with its sensor switched to poke and to reschedule mode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from echomq_provider.flow_specs import parent_id_for

from echomq_core import EchoMQ

from .helpers import DEFERRED, OpenWhen, RunResult, read_records, run_dag

pytestmark = pytest.mark.onlystandalone

#: The state of the sensor once it waits, by mode: the children are held until it is there
#: (``OpenWhen``), so its first look finds them outstanding and it really polls / defers.
WAITING = {"deferrable": DEFERRED, "poke": ("running",), "reschedule": ("up_for_reschedule",)}
EXPECTED = {str(n): n * n if n % 2 else n**3 for n in range(1, 9)}


def sensor_mode(mode: str) -> Callable[[Any], None]:
    def tweak(dag: Any) -> None:
        wait = dag.get_task("wait")
        wait.deferrable = mode == "deferrable"
        wait.mode = "poke" if mode == "deferrable" else mode

    return tweak


def check_example_run(run: RunResult) -> None:
    assert run.state == "success", {k: str(t.state) for k, t in run.tasks.items()}
    summary = run.xcom("summarise")
    assert summary["results"] == 8
    assert summary["by_item"] == EXPECTED
    parent = parent_id_for("echomq_fan_out", run.run_id, "fan_out")
    # the ignored child is the 9th planned item: named by its index
    assert summary["ignored"] == {"8": "Unrecoverable: item 0: best-effort source is offline"}
    assert run.xcom("fan_out") == {"queue": "example.reports", "parent_id": parent}
    flow = run.xcom("wait")  # the reference and the counts, never the values
    assert {k: flow[k] for k in ("parent_id", "state", "total", "processed", "ignored")} == {
        "parent_id": parent,
        "state": "closed",
        "total": 9,
        "processed": 8,
        "ignored": 1,
    }
    assert flow["dependencies"] == 0 and flow["failed"] == 0
    assert run.xcom("wait", "children_values") is None


def ran_trigger(capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> bool:
    """Whether dag.test() ran a trigger: its own log line (stdout or logging, by config)."""
    return "running trigger in line" in capfd.readouterr().out + caplog.text


def reschedules(ti: Any) -> int:
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return int(session.scalar(select(func.count()).where(TaskReschedule.ti_id == ti.id)))


@pytest.mark.parametrize("mode", ["deferrable", "poke", "reschedule"])
def test_example_dag(
    mode: str,
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Callable[..., Any],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    gate = tmp_path / "go"
    start_worker(gate=gate)
    tweak = None if mode == "deferrable" else sensor_mode(mode)
    waiting = OpenWhen(gate, "echomq_fan_out", "wait", WAITING[mode])
    with caplog.at_level(logging.INFO), waiting:
        run = run_dag(airflow_db, "echomq_fan_out", tweak)
    assert waiting.opened_in in WAITING[mode], waiting
    check_example_run(run)
    assert ran_trigger(capfd, caplog) == (mode == "deferrable")
    assert (reschedules(run.tasks["wait"]) > 0) == (mode == "reschedule")


def test_deferrable_sensor_reads_a_flow_released_soon_without_deferring(
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Callable[..., Any],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    """Released 0.5 s after the sensor started (its children finish 0.5 s after the gate that
    opens when it runs): it reads the flow in its own process (``IN_TASK_WAIT``) instead of
    paying a deferral's rounds."""
    gate = tmp_path / "go"
    start_worker(gate=gate)
    running = OpenWhen(gate, "echomq_in_task", "wait", ("running",))
    with caplog.at_level(logging.INFO), running:
        run = run_dag(airflow_db, "echomq_in_task")
    assert running.opened_in == "running", running
    assert run.state == "success", {k: str(t.state) for k, t in run.tasks.items()}
    logged = capfd.readouterr().out + caplog.text
    # the precondition: the sensor's first read found the children outstanding
    assert "settled 0 of 2" in logged
    assert "running trigger in line" not in logged
    assert run.xcom("wait")["processed"] == 2


@pytest.mark.parametrize("mode", ["deferrable", "poke"])
def test_failed_child_fails_sensor_at_once(
    mode: str,
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Callable[..., Any],
    record_file: Path,
    standalone_server: Any,
    prefix: str,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    proc_env: dict[str, str],
) -> None:
    proc_env.update(ECHOMQ_TEST_MARKERS=str(tmp_path))  # the failing child waits for "go"
    start_worker()
    waiting = OpenWhen(tmp_path / "go", "echomq_fail_fast", "wait", WAITING[mode])
    with caplog.at_level(logging.INFO), waiting:
        run = run_dag(
            airflow_db, "echomq_fail_fast", None if mode == "deferrable" else sensor_mode(mode)
        )
    assert waiting.opened_in in WAITING[mode], waiting
    assert run.state == "failed"
    assert run.state_of("fan_out") == "success"
    assert run.state_of("wait") == "failed"
    parent = parent_id_for("echomq_fail_fast", run.run_id, "fan_out")
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        child = mq.get_job("example.cube", f"{parent}.1")
    assert child.state == "dead" and child.finished_ms is not None
    wait = run.tasks["wait"]
    # The sensor was already waiting when the child died (it waited for the gate)
    assert wait.start_date.timestamp() < child.finished_ms / 1000 < wait.end_date.timestamp()
    [record] = read_records(record_file)
    assert record["task_id"] == "wait"
    # it failed because the parent failed (naming the child), not by its 120 s timeout; the
    # failure callback gets the exception from Airflow 3.2 on, the log has it in every 3.x
    logged = capfd.readouterr().out + caplog.text
    failure = next(
        line
        for line in logged.splitlines()
        if line.startswith(("airflow.exceptions.", "airflow.sdk.exceptions."))
    )
    assert f"{parent}.1: Unrecoverable: item 2: corrupt input" in failure
    assert f"{parent}.0" not in failure
    # ... and the first failed child's traceback, raised in the worker's process
    shown = f"First failed child {parent}.1 (queue 'example.cube'): Unrecoverable: item 2"
    assert shown in logged and 'worker_proc.py", line' in logged
    if record["exception"] != "None":  # Airflow 3.2+: the callback's exception, whole
        assert shown in record["exception"] and "raise Unrecoverable(" in record["exception"]
    assert "AirflowSensorTimeout" not in logged
    assert ("running trigger in line" in logged) == (mode == "deferrable")
    # ... and cancelled the flow: the sibling still pending will never be claimed
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        snap = mq.snapshot("example.reports", parent)
        late = mq.get_job("example.later", f"{parent}.3")
        assert mq.queue("example.later").claim(10) == []
    assert snap.parent_state == "cancelled" and "corrupt input" in (snap.error or "")
    assert late.state == "cancelled"


def test_operator_retry_converges_on_one_flow(
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Callable[..., Any],
    record_file: Path,
    standalone_server: Any,
    prefix: str,
) -> None:
    start_worker()
    run = run_dag(airflow_db, "echomq_retry")
    assert run.state == "success"
    fan_out = run.tasks["fan_out"]
    assert fan_out.try_number == 2
    tries = read_records(record_file)
    parent = parent_id_for("echomq_retry", run.run_id, "fan_out")
    assert [t["try"] for t in tries] == [1, 2]
    assert {t["parent_id"] for t in tries} == {parent}
    assert run.xcom("wait")["processed"] == 3
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        snap = mq.snapshot("example.reports", parent)
        assert (snap.total, snap.processed, snap.dependencies) == (3, 3, 0)
        # One parent, three children ever ran: a second flow would show 2 parents, 6 jobs.
        assert snap.parent_state == "closed"  # a barrier: read and closed by the sensor
        flows = mq.list_flows("example.reports")
        square = mq.queue("example.square").stats()
    assert [f.parent_id for f in flows] == [parent]
    assert square["completed"] == 3


def test_timeout_and_soft_fail_in_every_mode(airflow_db: Path, echomq_conn: str) -> None:
    run = run_dag(airflow_db, "echomq_timeouts")  # no worker: the flow never settles
    states = {task_id: run.state_of(task_id) for task_id in run.tasks if task_id != "fan_out"}
    assert states == {
        "wait_poke": "failed",
        "wait_poke_soft": "skipped",
        "wait_reschedule": "failed",
        "wait_reschedule_soft": "skipped",
        "wait_deferrable": "failed",
        "wait_deferrable_soft": "skipped",
    }
