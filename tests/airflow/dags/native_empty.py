"""Test DAG: an empty plan fanned out with ``.expand()`` (``echomq_empty.py``: with EchoMQ)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import dag, task


@task
def plan() -> list[dict[str, Any]]:
    return []


@dag(dag_id="native_empty", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def native_empty() -> None:
    @task
    def work(item: dict[str, Any]) -> int:
        return 1

    @task
    def total(values: list[int]) -> int:
        return sum(values)

    total(work.expand(item=plan()))  # type: ignore[arg-type]


native_empty()
