"""Test DAG: a fail-parent child dies while the sensor waits; the sensor must fail at once.

The failing child waits for the marker ``go`` (the test worker honours ``wait_for``), which
the test makes once the sensor waits (deferred, or poking), so it dies after that. The
sensor's timeout (120 s) is far longer than the test allows: it must fail because the parent
failed, not because it timed out. Its failure callback records the exception so the test can
check the failed child is named.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

from airflow.sdk import dag
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.sensors.echo_flow import EchoFlowSensor


def record_failure(context: Any) -> None:
    with open(os.environ["ECHOMQ_TEST_RECORD"], "a") as out:
        out.write(
            json.dumps(
                {"task_id": context["ti"].task_id, "exception": str(context.get("exception"))}
            )
            + "\n"
        )


@dag(dag_id="echomq_fail_fast", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_fail_fast() -> None:
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        children=[
            {"payload": {"n": 1}, "queue": "example.square"},
            {
                "payload": {"n": 2, "wait_for": "go", "fail": "corrupt input"},
                "queue": "example.cube",
            },
            {"payload": {"n": 3}, "queue": "example.square"},
            # a queue no worker serves yet: still pending when its sibling fails the flow, so
            # the sensor's cancel must take it away
            {"payload": {"n": 4}, "queue": "example.later"},
        ],
    )
    EchoFlowSensor(
        task_id="wait",
        flow=fan_out.output,
        deferrable=True,
        poke_interval=0.2,
        timeout=120,
        on_failure_callback=record_failure,
    )


echomq_fail_fast()
