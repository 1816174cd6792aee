"""EchoMQIOManager inputs annotated ``polars.DataFrame``, ``pandas.DataFrame`` and
``pyarrow.Table``: the flow's results as a frame, built page by page, with real Dagster, a real
server and a real worker process (cross-queue flow, the resource's Pump delivering)."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations
# (context, resource and input types) at definition time and needs them as objects.
from collections.abc import Callable
from typing import Any

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from dagster import (
    AssetExecutionContext,
    DagsterInstance,
    StaticPartitionsDefinition,
    asset,
    materialize,
)
from dagster_echomq import EchoMQIOManager, EchoMQResource
from dagster_support import client_url

from echomq_core import Child, FlowRef

PARENT, CHILD = "dgf-parent", "dgf-child"
N = 1_200  # over two of the reads' pages (page=500 below)


def resources(url: str, prefix: str) -> dict[str, Any]:
    echomq = EchoMQResource(url=url, prefix=prefix)
    return {
        "echomq": echomq,
        "echomq_io": EchoMQIOManager.from_resource(echomq, poll_interval=0.05, page=500),
    }


@asset(io_manager_key="echomq_io")
def squares(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
    children = [Child({"n": i}, queue=CHILD) for i in range(N)]
    return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))


@asset
def as_polars(squares: pl.DataFrame) -> dict[str, Any]:
    return {
        "type": type(squares).__name__,
        "rows": squares.height,
        "sum": squares["value"].sum(),
        "schema": {k: str(v) for k, v in squares.schema.items()},
        "ids": squares["child_id"].n_unique(),
    }


@asset
def as_pandas(squares: pd.DataFrame) -> dict[str, Any]:
    return {
        "type": type(squares).__name__,
        "rows": len(squares),
        "sum": int(squares["value"].sum()),
        "columns": list(squares.columns),
    }


@asset
def as_arrow(squares: pa.Table) -> dict[str, Any]:
    return {
        "type": type(squares).__name__,
        "rows": squares.num_rows,
        "sum": sum(squares.column("value").to_pylist()),
        "chunks": squares["n"].num_chunks,
    }


def test_frame_inputs_get_one_row_per_child_whatever_the_library(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)
    done = materialize(
        [squares, as_polars, as_pandas, as_arrow],
        resources=resources(url, prefix),
        instance=instance,
    )
    assert done.success
    total = sum(i * i for i in range(N))
    got_pl = done.output_for_node("as_polars")
    assert (got_pl["type"], got_pl["rows"], got_pl["sum"], got_pl["ids"]) == (
        "DataFrame",
        N,
        total,
        N,
    )
    assert got_pl["schema"] == {
        "child_id": "String",
        "queue": "String",
        "n": "Int64",
        "value": "Int64",
    }
    got_pd = done.output_for_node("as_pandas")
    assert (got_pd["type"], got_pd["rows"], got_pd["sum"]) == ("DataFrame", N, total)
    assert got_pd["columns"] == ["child_id", "queue", "n", "value"]
    got_pa = done.output_for_node("as_arrow")
    assert (got_pa["type"], got_pa["rows"], got_pa["sum"]) == ("Table", N, total)
    assert got_pa["chunks"] == 3  # a chunk per page of 500


days = StaticPartitionsDefinition(["2026-11-30", "2026-12-01"])


@asset(io_manager_key="echomq_io", partitions_def=days)
def day_squares(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
    base = 1000 if context.partition_key.endswith("01") else 0
    children = [Child({"n": base + i}, queue=CHILD) for i in range(5)]
    return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))


@asset(partitions_def=days)
def day_frames(day_squares: pl.DataFrame) -> int:
    return int(day_squares["n"].sum())


@pytest.mark.onlystandalone
def test_a_partitioned_frame_input_reads_its_partitions_flow(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)
    for day, want in (("2026-11-30", sum(range(5))), ("2026-12-01", sum(range(1000, 1005)))):
        done = materialize(
            [day_squares, day_frames],
            partition_key=day,
            resources=resources(url, prefix),
            instance=instance,
        )
        assert done.success
        assert done.output_for_node("day_frames") == want
