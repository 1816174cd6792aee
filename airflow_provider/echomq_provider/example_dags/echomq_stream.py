"""Example DAG: consume a fan-out's results as its children settle, while it runs.

::

    fan_out (EchoFlowOperator, stream=True)  ->  load (flow_results(..., follow=True))

* ``fan_out`` adds one flow of squares under a parent in ``example.reports``, keeping its
  settle log (``stream=True``), and returns the flow's reference at once: it does not wait.
* ``load`` runs downstream of the operator - no sensor between - while the workers
  (``examples/airflow/echomq_worker.py``) process the children: ``flow_results(flow,
  follow=True)`` yields each result as its child settles, in that order, blocks until the
  next, and ends when the flow is released (then closes it). So the pipeline ends about when
  its fan-out does, instead of a sensor's poll and a second task after it.
* A retry of ``load`` reads every result again from the start, and its return value is
  written only when it succeeds: it holds each child once. Make per-result side effects
  idempotent (keyed by the index), as they happen again in a retry.

Set up as for ``echomq_fan_out``: an ``echomq`` connection named ``echomq_default`` and the
workers on the same server and prefix. No triggerer is needed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.example_dags._shared import EXAMPLE_DAG
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results

ITEMS = 8


@dag(dag_id="echomq_stream", doc_md=__doc__, **EXAMPLE_DAG)
def echomq_stream() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        children=[{"payload": {"n": n}, "queue": "example.square"} for n in range(1, ITEMS + 1)],
        stream=True,
        retries=2,
        retry_delay=timedelta(seconds=5),
    )

    @task(retries=2, retry_delay=timedelta(seconds=5))
    def load(flow: dict[str, Any]) -> dict[str, Any]:
        order: list[int] = []
        total = 0
        for index, value in flow_results(flow, follow=True):  # as each child settles
            order.append(int(index))
            total += value["value"]
            print(f"EchoMQ result {len(order)}: item {index} -> {value['value']}")
        return {"results": len(order), "order": order, "sum": total}

    load(fan_out.output)  # type: ignore[arg-type]  # an XComArg, resolved at run time


echomq_stream()
