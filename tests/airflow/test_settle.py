"""What a waiting task's failure callbacks do to its flow (``echomq_provider.settle``): the
rule on every state a real flow can be in, and the callbacks a DAG carries to Airflow.

The callbacks run in real deployments in ``test_deployment.py`` (a reschedule-mode sensor
marked failed between pokes; a waiting task that lost its heartbeat)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from echomq_provider.settle import on_dag_run_failure, on_task_failure, settle_action

from echomq_core import Child, EchoMQ, Pump

pytestmark = pytest.mark.onlystandalone

RULE = {"cancel_on_failure": True, "close_flow": True, "return_values": False, "max_values": 5}


def flows_in_every_state(mq: EchoMQ) -> dict[str, Any]:
    """Real flows, one per state: their snapshots by name."""
    q, work = "settle", "settle.work"
    made = {
        name: mq.add_flow(q, [Child(1, queue=q)], barrier=True)
        for name in ("held", "failed", "released", "closed", "cancelled")
    }
    made["worker_run"] = mq.add_flow(q, [Child(1, queue=q)])  # its parent a worker runs
    made["big"] = mq.add_flow(q, [Child(i, queue=work) for i in range(6)], barrier=True)
    queue = mq.queue(q)
    for job in queue.claim(100):
        if job.id.startswith(made["failed"].parent_id):
            queue.fail(job, "boom", retry=False)
        elif not job.id.startswith(made["held"].parent_id):
            queue.complete(job, 1)
    mq.close_flow(q, made["closed"].parent_id)
    mq.cancel_flow(q, made["cancelled"].parent_id, reason="test")
    snaps = {name: mq.snapshot(q, ref.parent_id) for name, ref in made.items()}
    snaps["missing"] = mq.snapshot(q, "JOB-never-added")
    return snaps


def test_the_rule_cancels_what_is_outstanding_and_closes_what_is_unread(
    standalone_server: Any, prefix: str
) -> None:
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        snaps = flows_in_every_state(mq)
    assert snaps["held"].parent_state == "held" and snaps["released"].parent_state == "released"
    assert snaps["worker_run"].parent_state == "pending"
    assert {name: settle_action(snap, **RULE) for name, snap in snaps.items()} == {
        "held": "cancel",
        "failed": "cancel",
        "released": "close",
        "closed": None,
        "cancelled": None,
        "worker_run": None,  # released to its worker: its job lifecycle, not a reader's
        "big": "cancel",
        "missing": None,
    }
    # the task's options: no cancel, no close, and a reader that cannot take the values
    kept = {**RULE, "cancel_on_failure": False, "close_flow": False}
    assert [settle_action(snaps[n], **kept) for n in ("held", "failed", "released")] == [None] * 3
    capped = {**RULE, "return_values": True}  # max_values 5, "big" has 6 children
    assert settle_action(snaps["big"], **capped) is None
    assert settle_action(snaps["held"], **capped) == "cancel"


def test_waiting_tasks_carry_the_callbacks_to_airflow(airflow_db: Path) -> None:
    """Beside the user's own; the DAG says it has a failure callback (what makes the scheduler
    send the run's failure to the dag processor); a plain operator adds none."""
    from airflow.sdk import DAG
    from echomq_provider.operators.echo_flow import EchoFlowOperator
    from echomq_provider.sensors.echo_flow import EchoFlowSensor

    try:
        from airflow.serialization.serialized_objects import DagSerialization as Serialized
    except ImportError:  # Airflow 3.1, 3.2
        from airflow.serialization.serialized_objects import (  # type: ignore[no-redef]
            SerializedDAG as Serialized,
        )

    def mine(context: Any) -> None: ...

    with DAG("settle_callbacks", schedule=None, start_date=datetime(2026, 1, 1)) as plain_dag:
        EchoFlowOperator(task_id="add", parent_queue="q", children=[1])
    assert plain_dag.on_failure_callback is None
    with DAG(
        "settle_callbacks", schedule=None, start_date=datetime(2026, 1, 1), on_failure_callback=mine
    ) as dag:
        add = EchoFlowOperator(task_id="add", parent_queue="q", children=[1])
        wait = EchoFlowSensor(task_id="wait", flow=add.output, on_failure_callback=mine)
        both = EchoFlowOperator(
            task_id="both", parent_queue="q", children=[1], wait_for_completion=True
        )
        streams = EchoFlowOperator(task_id="streams", parent_queue="q", children=[1], stream=True)
    assert add.on_failure_callback == []
    assert streams.on_failure_callback == [on_task_failure]  # its follower reads the flow
    assert wait.on_failure_callback == [mine, on_task_failure]
    assert both.on_failure_callback == [on_task_failure]
    assert dag.on_failure_callback == [mine, on_dag_run_failure]  # once, for both tasks
    # what the scheduler reads: the serialized DAG
    scheduler_dag = Serialized.from_dict(Serialized.to_dict(dag))
    assert scheduler_dag.has_on_failure_callback
    assert scheduler_dag.get_task("wait").has_on_failure_callback
    assert scheduler_dag.get_task("both").has_on_failure_callback
    assert not scheduler_dag.get_task("add").has_on_failure_callback


def callback_request(dag_file: Path, dag_id: str, run_id: str, task_id: str, cleared: int) -> Any:
    """A ``TaskCallbackRequest`` as the scheduler sends one for a task it failed (a lost
    heartbeat, an executor event that does not match): the task instance of the failed try and
    its run as it was then, ``cleared`` times cleared."""
    import uuid
    from datetime import UTC

    from airflow.api_fastapi.execution_api.datamodels.taskinstance import (
        DagRun,
        TaskInstance,
        TIRunContext,
    )
    from airflow.callbacks.callback_requests import TaskCallbackRequest
    from airflow.utils.state import TaskInstanceState

    now, fields = datetime.now(UTC), DagRun.model_fields  # their fields vary by version
    run = {
        "dag_id": dag_id, "run_id": run_id, "logical_date": now, "data_interval_start": now,
        "data_interval_end": now, "run_after": now, "start_date": now, "end_date": None,
        "clear_number": cleared, "run_type": "manual", "state": "running", "conf": {},
        "consumed_asset_events": [], "partition_key": None,
    }  # fmt: skip
    return TaskCallbackRequest(
        filepath=dag_file.name,
        bundle_name="dags-folder",
        bundle_version=None,
        msg="Task instance heartbeat timed out",
        ti=TaskInstance(
            id=uuid.uuid4(),
            task_id=task_id,
            dag_id=dag_id,
            run_id=run_id,
            try_number=cleared + 1,
            dag_version_id=uuid.uuid4(),
            map_index=-1,
        ),
        task_callback_type=TaskInstanceState.FAILED,
        context_from_server=TIRunContext(
            dag_run=DagRun.model_validate({k: v for k, v in run.items() if k in fields}),
            max_tries=0,
        ),
    )


def test_a_late_callback_leaves_the_flow_a_newer_attempt_took_up(
    airflow_db: Path, echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    """The dag processor runs the failure callback of a try the scheduler failed, through
    Airflow's own code (``_execute_task_callbacks``), after the run was cleared and the next
    try recorded its clear number on the flow (its epoch): the flow is left to that try. The
    callback of the newest attempt still cancels (Airflow 3.1 settles there; 3.2+ reads the
    task's state first, which a test outside a deployment cannot, so it goes on as 3.1)."""
    import structlog
    from airflow.dag_processing import processor
    from echomq_provider.flow_specs import parent_id_for

    _execute_task_callbacks = processor._execute_task_callbacks

    dag_id, task_id = "echomq_deploy_zombie", "fan_out"
    dag_file = airflow_db / "echomq_deploy_zombie.py"
    bag = processor.DagBag(dag_folder=str(dag_file))  # what the dag processor parses with
    assert dag_id in bag.dags, bag.import_errors
    log = structlog.get_logger()

    def failed(n: int, cleared: int) -> None:  # the scheduler failed a try of run n
        run_id = f"manual__2026-12-03T00:00:0{n}+00:00"
        request = callback_request(dag_file, dag_id, run_id, task_id, cleared)
        _execute_task_callbacks(bag, request, log)

    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        parents = {}
        for n in range(3):
            run_id = f"manual__2026-12-03T00:00:0{n}+00:00"
            parents[n] = parent_id_for(dag_id, run_id, task_id, -1)  # holds '/'
            mq.add_flow("example.reports", [Child({"n": n}, queue="example.nowhere")],
                        parent_id=parents[n], barrier=True)  # fmt: skip
        # run 0: cleared once since its first try failed; the second try took the flow up
        assert mq.note_epoch("example.reports", parents[0], 1) == 1
        failed(0, cleared=0)
        assert mq.snapshot("example.reports", parents[0]).parent_state == "held"
        # the second try's own failure, reported with the run cleared once: it cancels
        failed(0, cleared=1)
        snap = mq.snapshot("example.reports", parents[0])
        assert snap.parent_state == "cancelled"
        assert "operator fan_out: the task failed" in (snap.error or "")
        # run 1: never cleared (no epoch recorded): the first try's callback cancels, as before
        failed(1, cleared=0)
        assert mq.snapshot("example.reports", parents[1]).parent_state == "cancelled"
        # run 2: cleared twice; a callback of the attempt after the first clear arrives last
        assert mq.note_epoch("example.reports", parents[2], 2) == 2
        failed(2, cleared=1)
        assert mq.snapshot("example.reports", parents[2]).parent_state == "held"



def test_a_failed_run_settles_the_flow_a_stream_operator_added(
    airflow_db: Path, echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    """``EchoFlowOperator(stream=True)`` does not wait: its follower downstream reads the flow
    (``flow_results(..., follow=True)``). A follower killed or marked failed runs none of its
    code, so the run's failure callback settles the flow: held (children still running,
    nobody will read them) cancelled, released closed (its ``closed`` retention starts)."""
    from airflow.sdk import DAG
    from echomq_provider._compat import AIRFLOW_3_2
    from echomq_provider.flow_specs import parent_id_for
    from echomq_provider.operators.echo_flow import EchoFlowOperator

    with DAG("settle_stream", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        EchoFlowOperator(task_id="fan_out", parent_queue="sq", children=[1, 2], stream=True)
    assert dag.on_failure_callback == [on_dag_run_failure]
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        parents = {}
        for run_id in ("held_run", "released_run"):
            parents[run_id] = parent_id_for("settle_stream", run_id, "fan_out")
            mq.add_flow("sq", [Child(1, queue="sq.w"), Child(2, queue="sq.w")], barrier=True,
                        stream=True, parent_id=parents[run_id])  # fmt: skip
        work = mq.queue("sq.w")
        for job in work.claim(4):
            if job.id.startswith(parents["released_run"]):
                assert work.complete_many([(job, 1)]) == [True]
        Pump(mq, queues=["sq.w"]).tick()
        assert mq.snapshot("sq", parents["released_run"]).parent_state == "released"
        for run_id in parents:
            on_dag_run_failure({"dag": dag, "run_id": run_id})
        held = mq.snapshot("sq", parents["held_run"])
        if AIRFLOW_3_2:
            assert held.parent_state == "cancelled" and "the DAG run failed" in (held.error or "")
        else:  # 3.1's dag processor cannot tell a clear since: a held flow is left to run
            assert held.parent_state == "held"
        assert mq.snapshot("sq", parents["released_run"]).parent_state == "closed"
