"""Test DAG: a task downstream of the operator follows the flow while the children run.

``fan_out`` (``@task.echo_flow(stream=True)``, not waiting: it returns the flow's reference)
plans and adds ``n`` squares (``dag_run.conf["n"]``, default 6); every child but the last waits
for the marker ``go-<run>`` (``conf["run"]``; the test opens it once ``load`` runs), the last
for ``first-<run>`` - which ``load`` touches only after it received its first value. So the
run ends only if ``load`` had a value before the last child could settle.

``load`` records each value it gets (``{"run", "try", "index", "at"}``, JSON lines in
``ECHOMQ_TEST_RECORD``). With ``conf["fail_after"] = k`` its first try raises after ``k``
values, before it opens the last child's gate (the flow is still held then), and Airflow
retries it: the retry's return value must hold each child once, in settle order.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.results import flow_results


@dag(dag_id="echomq_stream_gated", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_stream_gated() -> None:
    @task.echo_flow(parent_queue="test.stream", stream=True)  # returns the flow at once
    def fan_out(**context: Any) -> list[dict[str, Any]]:
        conf = context["dag_run"].conf or {}
        n = int(conf.get("n", 6))
        run = conf.get("run", "x")
        gates = [f"go-{run}"] * (n - 1) + [f"first-{run}"]
        return [
            {"payload": {"n": i, "wait_for": gate}, "queue": "example.square"}
            for i, gate in enumerate(gates, start=1)
        ]

    @task(retries=1, retry_delay=timedelta(seconds=0))
    def load(flow: dict[str, Any], **context: Any) -> list[list[Any]]:
        ti, conf = context["ti"], context["dag_run"].conf or {}
        fail_after, run = int(conf.get("fail_after", 0)), conf.get("run", "x")
        markers = Path(os.environ["ECHOMQ_TEST_MARKERS"])
        got: list[list[Any]] = []
        for index, value in flow_results(flow, follow=True):
            with open(os.environ["ECHOMQ_TEST_RECORD"], "a") as out:
                record = {"run": run, "try": ti.try_number, "index": index, "at": time.time()}
                out.write(json.dumps(record) + "\n")
            got.append([index, value["value"]])
            if fail_after and ti.try_number == 1:
                if len(got) == fail_after:  # the last child is still gated: the flow is held
                    raise RuntimeError(f"lost the worker after {fail_after} results")
                continue
            (markers / f"first-{run}").touch()
        return got

    load(fan_out())


echomq_stream_gated()
