"""``min_success`` through the Airflow provider: ``@task.echo_flow(min_success=)`` and
``EchoFlowOperator(min_success=)`` add a flow with that success threshold (a real DAG run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from echomq_provider.flow_specs import parent_id_for

from echomq_core import EchoMQ

from .helpers import run_dag

pytestmark = pytest.mark.onlystandalone


def test_the_threshold_reaches_the_flow(
    airflow_db: Path, echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    run = run_dag(airflow_db, "echomq_threshold")
    assert {t: run.state_of(t) for t in run.tasks} == {"planned": "success", "classic": "success"}
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        for task_id, allowed, total in (("planned", 2, 8), ("classic", 1, 4)):
            parent = parent_id_for("echomq_threshold", run.run_id, task_id)
            snap = mq.snapshot("example.reports", parent)
            assert (snap.parent_state, snap.total, snap.allowed) == ("held", total, allowed)
