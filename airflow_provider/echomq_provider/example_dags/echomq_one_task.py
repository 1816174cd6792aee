"""Example DAG: plan, fan out and wait in one task (``@task.echo_flow``), then summarise.

::

    fan_out (@task.echo_flow, wait_for_completion)  ->  summarise

* ``fan_out`` is a TaskFlow function that plans the children: one spec per number, odd
  numbers to ``example.square``, even ones to ``example.cube``. The decorator adds them as
  one flow under a parent in ``example.reports`` (ids derived from the task instance, so a
  retry converges on the same flow) and, with ``wait_for_completion=True``, waits in the same
  task until every child settled, closes the flow and returns its reference and counts - what
  ``EchoFlowSensor`` returns - without a plan task or a sensor for Airflow to schedule.
* ``summarise`` reads the values from the server, page by page (``flow_results``).

Set up as for ``echomq_fan_out``: an ``echomq`` connection named ``echomq_default`` and the
workers (``examples/airflow/echomq_worker.py``) on the same server and prefix. No triggerer
is needed: the task waits in its worker slot (``deferrable=True`` would wait in the
triggerer instead).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.example_dags._shared import EXAMPLE_DAG
from echomq_provider.results import flow_results

ITEMS = 8


@dag(dag_id="echomq_one_task", doc_md=__doc__, **EXAMPLE_DAG)
def echomq_one_task() -> None:
    @task.echo_flow(  # registered by the provider at run time
        parent_queue="example.reports",
        wait_for_completion=True,
        wait_timeout=600,
        retries=2,
        retry_delay=timedelta(seconds=5),
    )
    def fan_out(items: int) -> list[dict[str, Any]]:
        return [
            {"payload": {"n": n}, "queue": "example.square" if n % 2 else "example.cube"}
            for n in range(1, items + 1)
        ]

    @task
    def summarise(flow: dict[str, Any]) -> dict[str, Any]:
        by_index = dict(flow_results(flow))  # {index of the planned item: its result}
        summary = {
            "results": len(by_index),
            "by_item": {str(v["n"]): v["value"] for _, v in sorted(by_index.items())},
        }
        print(f"EchoMQ flow summary: {summary}")
        return summary

    summarise(fan_out(ITEMS))  # type: ignore[arg-type]  # an XComArg, resolved at run time


echomq_one_task()
