"""Test DAG: mapped tasks over a flow's results, none of its values through XCom.

``plan`` plans 2,000 squares; ``fan_out`` adds them; ``wait`` waits; ``slices`` cuts the flow
into slices of 500 positions (four small mappings); ``load`` is mapped over them and reads its
slice's values from the server; ``total`` sums the four sums. ``frame_total`` reads the whole
flow as a polars frame, ``slice_frames`` each slice as a pandas frame (``flow_frame``).
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_frame, flow_results, flow_slices
from echomq_provider.sensors.echo_flow import EchoFlowSensor

#: 2,000 squares in slices of 500 (``dag.test()``); the real deployment, whose worker waits a
#: second per job, sets a smaller plan in the environment.
N = int(os.environ.get("ECHOMQ_SLICES_N", "2000"))
SIZE = int(os.environ.get("ECHOMQ_SLICES_SIZE", "500"))


@dag(dag_id="echomq_slices", schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def echomq_slices() -> None:
    @task
    def plan() -> list[dict[str, Any]]:
        return [{"payload": {"n": n}} for n in range(1, N + 1)]

    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="example.reports",
        child_queue="example.square",
        children=plan(),
    )
    wait = EchoFlowSensor(task_id="wait", flow=fan_out.output, poke_interval=0.5)

    @task
    def slices(flow: dict[str, Any]) -> list[dict[str, Any]]:
        return flow_slices(flow, size=SIZE)

    @task
    def load(part: dict[str, Any]) -> int:
        return sum(value["value"] for _index, value in flow_results(part))

    @task
    def total(sums: list[int]) -> int:
        return sum(sums)

    @task
    def frame_total(flow: dict[str, Any]) -> dict[str, Any]:
        frame = flow_frame(flow, kind="polars", page=700)
        return {
            "rows": frame.height,
            "sum": int(frame["value"].sum()),
            "columns": frame.columns,
            "positions": sorted(frame["child"].to_list()) == list(range(N)),
        }

    @task
    def slice_frame(part: dict[str, Any]) -> list[int]:
        frame = flow_frame(part, kind="pandas")
        return [len(frame), int(frame["child"].min()), int(frame["child"].max())]

    parts = slices(wait.output)
    total(load.expand(part=parts))  # type: ignore[arg-type]
    frame_total(wait.output)  # type: ignore[arg-type]
    slice_frame.expand(part=parts)  # type: ignore[arg-type]


echomq_slices()
