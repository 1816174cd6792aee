"""Example DAG: fan work out to EchoMQ workers, wait for it, summarise the results.

::

    plan_work  ->  fan_out (EchoFlowOperator)  ->  wait (EchoFlowSensor, deferrable)  ->  summarise

* ``plan_work`` computes the work items: one child spec per number, odd numbers to the
  ``example.square`` queue, even ones to ``example.cube``, plus one best-effort item marked
  ``ignore_failure`` that the workers reject (its death is recorded, not fatal).
* ``fan_out`` adds them as one flow under a parent in ``example.reports``. Its ids derive from
  the task instance, so an Airflow retry of it converges on the same flow.
* The workers (``examples/airflow/echomq_worker.py``, outside Airflow) process the children.
* ``wait`` defers to the triggerer until every child settled, freeing its worker slot, closes
  the flow and returns its reference and counts (a few hundred bytes of XCom, whatever N).
  Had a fail-parent child died, it would fail at once, naming it, and cancel the rest.
* ``summarise`` reads the values from the server, page by page (``flow_results``), matched to
  the planned items by index; the ignored failure comes with the sensor's summary.

Set up: an ``echomq`` connection named ``echomq_default``, e.g.
``AIRFLOW_CONN_ECHOMQ_DEFAULT='echomq://127.0.0.1:6379/0?prefix=emq'``, a running triggerer
(``airflow triggerer``) for the deferrable sensor, and the workers with the same server and
prefix. Try it without a scheduler: ``airflow dags test echomq_fan_out``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.example_dags._shared import EXAMPLE_DAG
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results
from echomq_provider.sensors.echo_flow import EchoFlowSensor

REPORT_QUEUE = "example.reports"
SQUARE_QUEUE = "example.square"
CUBE_QUEUE = "example.cube"
ITEMS = 8


@dag(dag_id="echomq_fan_out", doc_md=__doc__, **EXAMPLE_DAG)
def echomq_fan_out() -> None:
    @task
    def plan_work() -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = [
            {"payload": {"n": n}, "queue": SQUARE_QUEUE if n % 2 else CUBE_QUEUE}
            for n in range(1, ITEMS + 1)
        ]
        items.append(
            {
                "payload": {"n": 0, "fail": "best-effort source is offline"},
                "queue": CUBE_QUEUE,
                "ignore_failure": True,
            }
        )
        return items

    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue=REPORT_QUEUE,
        payload={"run": "{{ run_id }}"},
        children=plan_work(),
        retries=2,
        retry_delay=timedelta(seconds=5),
    )

    wait = EchoFlowSensor(
        task_id="wait",
        flow=fan_out.output,
        deferrable=True,
        poke_interval=1,
        timeout=600,
    )

    @task
    def summarise(flow: dict[str, Any]) -> dict[str, Any]:
        by_index = dict(flow_results(flow))  # {index of the planned item: its result}
        summary = {
            "results": len(by_index),
            "total": sum(v["value"] for v in by_index.values()),
            "by_item": {str(v["n"]): v["value"] for _, v in sorted(by_index.items())},
            "ignored": flow["ignored_failures"],  # {index: error}, at most 20
        }
        print(f"EchoMQ flow summary: {summary}")
        return summary

    summarise(wait.output)  # type: ignore[arg-type]  # an XComArg, resolved at run time


echomq_fan_out()
