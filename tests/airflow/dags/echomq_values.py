"""Test DAG: results as the sensor's return value (``return_values=True``), mapped over.

* ``fan_out`` / ``wait``: five squares; the sensor returns their values in spec order, and
  ``double.expand(value=wait.output)`` maps over them (a custom XCom key could not be mapped).
* ``fan_out_keyed`` / ``wait_keyed``: children given keys (one with characters a job id may not
  hold); the sensor returns ``{key: value}``.
* ``wait_capped``: the same flow with ``max_values=3``: fails at once with TooManyValues
  (``cancel_on_failure=False``, so the flow the others read is left alone).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor

KEYS = ["2026-01-01", "s3://bucket/a b.csv", "ümlaut~"]


@dag(dag_id="echomq_values", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_values() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        children=[{"payload": {"n": n}, "queue": "example.square"} for n in range(1, 6)],
    )
    wait = EchoFlowSensor(
        task_id="wait", flow=fan_out.output, return_values=True, poke_interval=0.2, timeout=60
    )

    @task
    def double(value: dict[str, int]) -> int:
        return 2 * value["value"]

    double.expand(value=wait.output)

    fan_out_keyed = EchoFlowOperator(
        task_id="fan_out_keyed",
        parent_queue="example.reports",
        children=[
            {"payload": {"n": n}, "key": key, "queue": "example.square"}
            for n, key in enumerate(KEYS, start=1)
        ],
    )
    EchoFlowSensor(
        task_id="wait_keyed",
        flow=fan_out_keyed.output,
        return_values=True,
        poke_interval=0.2,
        timeout=60,
    )
    EchoFlowSensor(
        task_id="wait_capped",
        flow=fan_out.output,
        return_values=True,
        max_values=3,
        cancel_on_failure=False,
        close_flow=False,
        poke_interval=0.2,
        timeout=60,
    )


echomq_values()
