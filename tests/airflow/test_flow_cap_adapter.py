"""``max_running`` through the Airflow provider: ``@task.echo_flow(max_running=)`` and
``EchoFlowOperator(max_running=)`` add a capped flow (a real DAG run, a real worker)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from echomq_provider.flow_specs import parent_id_for
from echomq_provider.operators.echo_flow import EchoFlowOperator

from echomq_core import EchoMQ, InvalidArgument

from .helpers import run_dag


def test_the_cap_reaches_the_flow(
    airflow_db: Path,
    echomq_conn: str,
    start_worker: Callable[..., Any],
    standalone_server: Any,
    prefix: str,
) -> None:
    start_worker()
    run = run_dag(airflow_db, "echomq_capped")
    assert {t: run.state_of(t) for t in run.tasks} == {"capped": "success", "classic": "success"}
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        for task_id, cap, total in (("capped", 2, 6), ("classic", 3, 4)):
            parent = parent_id_for("echomq_capped", run.run_id, task_id)
            read = mq.flow_cap("example.reports", parent)
            assert read is not None and (read.cap, read.admitted) == (cap, 0), task_id
            assert mq.snapshot("example.reports", parent).processed == total


@pytest.mark.parametrize("bad", [0, True, 2.5])
def test_a_bad_cap_is_refused_when_the_dag_is_parsed(bad: Any) -> None:
    with pytest.raises(InvalidArgument, match=f"max_running.*{bad!r}"):
        EchoFlowOperator(task_id="t", parent_queue="q", children=[1], max_running=bad)
