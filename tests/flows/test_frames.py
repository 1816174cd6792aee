"""A flow's results as pandas / polars / Arrow frames (``echomq_core.flows.frames``), read from a
real flow on standalone and on the Cluster, built page by page."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from echomq_core import Child, ConfigurationError, InvalidArgument, InvalidInput
from echomq_core.flows.frames import results_frame

from ..conftest import Backend
from ..flowkit import work_off

N = 2_500  # over two pages of 1,000, so a frame joins several chunks


def result(n: int) -> Any:
    """A child's result as a real task returns it: a few fields, one of them missing in some
    rows (a field first seen late in a page must still be a column), one child of 50 a plain
    number (it goes to the ``value`` column)."""
    if n % 50 == 7:
        return n
    row: dict[str, Any] = {
        "rows": n * 10,
        "path": f"s3://warehouse/events/date=2026-12-01/part-{n:06d}.parquet",
        "ok": n % 3 != 0,
    }
    if n % 4 == 1:
        row["score"] = n / 8
    return row


@pytest.fixture
def released(backend: Backend, prefix: str) -> Any:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "fr")
    pid = "JOB-af/etl/fan_out/frames0123"
    mq.add_flow(
        parents, [Child({"n": i}, queue=work) for i in range(N)], parent_id=pid, barrier=True
    )
    work_off(mq, [parents, work], lambda job: result(job.payload["n"]))
    yield mq, parents, pid
    mq.close()


def expected() -> dict[str, Any]:
    return {f"JOB-af/etl/fan_out/frames0123.{i}": result(i) for i in range(N)}


@pytest.mark.parametrize("kind", ["pandas", "polars", "arrow"])
def test_a_released_flow_becomes_one_row_per_child_with_its_fields_as_columns(
    released: Any, kind: str
) -> None:
    mq, queue, pid = released
    frame = results_frame(mq.iter_children_values(queue, pid, page=1000), kind, page=1000)
    rows = {
        "pandas": lambda: frame.to_dict("records"),
        "polars": lambda: frame.to_dicts(),
        "arrow": lambda: frame.to_pylist(),
    }[kind]()
    assert len(rows) == N
    want = expected()
    assert {r["child_id"] for r in rows} == set(want)
    for r in rows:
        value = want[r["child_id"]]
        if isinstance(value, dict):
            got = {k: r[k] for k in value}
            assert got == value
            assert _missing(r.get("score")) == ("score" not in value)
            assert _missing(r["value"])
        else:
            assert r["value"] == value
            assert _missing(r["rows"])
    columns = list(frame.columns) if kind != "arrow" else frame.column_names
    assert columns[0] == "child_id"
    assert set(columns) == {"child_id", "rows", "path", "ok", "score", "value"}
    # the types come from the values, not strings of them
    if kind == "polars":
        assert frame.schema["rows"] == pl.Int64 and frame.schema["ok"] == pl.Boolean
        assert frame.schema["score"] == pl.Float64
    if kind == "arrow":
        assert frame.schema.field("rows").type == pa.int64()
        assert frame.schema.field("score").type == pa.float64()
        assert frame["rows"].num_chunks == 3  # one chunk per page, joined without a copy
    if kind == "pandas":
        assert isinstance(frame, pd.DataFrame) and frame.index.is_unique


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)


@pytest.mark.onlystandalone
@pytest.mark.parametrize("kind", ["pandas", "polars", "arrow"])
def test_no_results_make_an_empty_frame_with_the_key_column(kind: str) -> None:
    frame = results_frame(iter(()), kind, key="child")
    columns = list(frame.columns) if kind != "arrow" else frame.column_names
    assert columns == ["child"] and len(frame) == 0


@pytest.mark.onlystandalone
def test_bad_input_is_refused_naming_what_was_wrong() -> None:
    with pytest.raises(InvalidArgument, match="frame kind must be one of 'pandas', 'polars'"):
        results_frame([], "excel")
    with pytest.raises(InvalidArgument, match="page must be a whole number"):
        results_frame([], "arrow", page=0)
    with pytest.raises(InvalidInput, match=r"child 'c2': its value has a field 'child_id'"):
        results_frame([("c1", {"a": 1}), ("c2", {"child_id": 3})], "polars")
    with pytest.raises(InvalidInput, match=r"child 'c1': its value has a field named 1"):
        results_frame([("c1", {1: "x"})], "pandas")
    # a column that mixes types the library cannot hold: its own words, typed
    with pytest.raises(InvalidInput, match="the results cannot make a arrow frame: Arrow"):
        results_frame([("c1", {"a": 1}), ("c2", {"a": "text"})], "arrow")


@pytest.mark.onlystandalone
def test_a_missing_library_is_named_with_the_extra_that_installs_it() -> None:
    # a fresh process where polars cannot be imported (as where it is not installed)
    code = (
        "import sys; sys.modules['polars'] = None\n"
        "from echomq_core.flows.frames import results_frame\n"
        "from echomq_core import ConfigurationError\n"
        "try:\n    results_frame([], 'polars')\n"
        "except ConfigurationError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'echomq[polars]'" in out.stdout
    assert issubclass(ConfigurationError, Exception)


@pytest.mark.onlystandalone
def test_reading_results_as_dicts_imports_no_frame_library() -> None:
    code = (
        "import sys, echomq_core, echomq_core.flows.frames\n"
        "print(sorted(m for m in ('pandas', 'polars', 'pyarrow') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
