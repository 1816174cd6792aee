"""Test DAG: the operator's first try adds the flow and then dies; Airflow retries it.

The retry must re-add the *same* flow (ids derive from the task instance, not the try), so
the run ends with one flow of three children, not two flows.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import dag
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor


class FlakyEchoFlowOperator(EchoFlowOperator):
    """Loses its worker right after the flow is written, on the first try only."""

    def execute(self, context: Any) -> dict[str, str]:
        ref = super().execute(context)
        try_number = context["ti"].try_number
        with open(os.environ["ECHOMQ_TEST_RECORD"], "a") as out:
            out.write(json.dumps({"try": try_number, **ref}) + "\n")
        if try_number == 1:
            raise RuntimeError("worker lost after adding the flow")
        return ref


@dag(dag_id="echomq_retry", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_retry() -> None:
    fan_out = FlakyEchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        children=[{"payload": {"n": n}, "queue": "example.square"} for n in (1, 2, 3)],
        retries=1,
        retry_delay=timedelta(seconds=0),
    )
    EchoFlowSensor(task_id="wait", flow=fan_out.output, poke_interval=0.2, timeout=60)


echomq_retry()
