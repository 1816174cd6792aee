"""An input that streams: a downstream asset annotated ``FlowFollow`` consumes the results as
the children settle, with real Dagster (``materialize``), a real server (standalone and a
3-master Cluster) and a real worker process running no Pump (the input's pass runs one).

Dagster starts the downstream step only after the fan-out step ended: the fan-out returns once
the flow is added, and the children wait on gates the downstream opens (``go`` when its body
starts, ``first`` once it has its first value), so the order is the test's, not the machine's.
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetExecutionContext,
    DagsterInstance,
    ReexecutionOptions,
    asset,
    execute_job,
    materialize,
    reconstructable,
)
from dagster_echomq import EchoMQIOManager, EchoMQResource, FlowFollow
from dagster_support import client_url

from echomq_core import Child, EchoMQ, FlowRef

PARENT, CHILD = "fw-parent", "fw-child"


def assets(gates: Path, n: int, *, stream: bool = True, fail: int = -1) -> list[Any]:
    """``fan_out`` adds n cross-queue children: all but the last wait for ``go``, the last for
    ``first``; child ``fail`` dies (failing the parent). ``follow`` reads them as they settle."""

    @asset(io_manager_key="echomq_io")
    def fan_out(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
        gate = [str(gates / ("first" if i == n - 1 else "go")) for i in range(n)]
        children = [
            Child({"n": i, "wait_for": gate[i], "fail": i == fail}, queue=CHILD) for i in range(n)
        ]
        return echomq.add_flow(
            PARENT, children, parent_id=echomq.run_scoped_id(context), stream=stream
        )

    @asset
    def follow(fan_out: FlowFollow) -> dict[str, Any]:
        seen: list[list[Any]] = []
        (gates / "go").touch()  # the children settle while this body runs
        for child_id, value in fan_out:
            seen.append([child_id, value["value"], time.time()])
            (gates / "first").touch()  # only now may the last child settle
        return {"type": type(fan_out).__name__, "total": fan_out.total, "seen": seen}

    return [fan_out, follow]


def resources(url: str, prefix: str) -> dict[str, Any]:
    echomq = EchoMQResource(url=url, prefix=prefix)
    return {"echomq": echomq, "echomq_io": EchoMQIOManager.from_resource(echomq)}


def test_a_followed_input_yields_the_results_as_the_children_settle(
    backend: Any,
    prefix: str,
    workers: Callable[..., Any],
    instance: DagsterInstance,
    tmp_path: Path,
) -> None:
    url, n = client_url(backend), 5
    workers(url, prefix, CHILD)
    result = materialize(assets(tmp_path, n), resources=resources(url, prefix), instance=instance)
    assert result.success
    flow: FlowRef = result.output_for_node("fan_out")
    got = result.output_for_node("follow")
    assert (got["type"], got["total"]) == ("FlowFollow", n)
    ids = [f"{flow.parent_id}.{i}" for i in range(n)]
    assert sorted(child for child, _, _ in got["seen"]) == ids  # each child once
    assert {child: value for child, value, _ in got["seen"]} == {
        f"{flow.parent_id}.{i}": i * i for i in range(n)
    }
    assert got["seen"][-1][0] == ids[-1]  # the gated child settled last
    with EchoMQ(url, prefix=prefix) as mq:
        last = mq.get_job(CHILD, ids[-1]).finished_ms or 0
        # the first value reached the asset before the last child completed: it streamed (the
        # gate makes it so; the server's finish time is in whole ms, so the same ms counts)
        assert int(got["seen"][0][2] * 1000) <= last
        # read to the release, the input closed the barrier flow
        assert mq.snapshot(flow.queue, flow.parent_id).parent_state == "closed"


@pytest.mark.onlystandalone
def test_following_a_flow_without_a_settle_log_is_refused_before_the_body_runs(
    backend: Any, prefix: str, instance: DagsterInstance, tmp_path: Path
) -> None:
    url = client_url(backend)
    result = materialize(
        assets(tmp_path, 2, stream=False),
        resources=resources(url, prefix),
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error
    assert failure.step_key == "follow" and error.cls_name == "DagsterExecutionLoadInputError"
    assert error.cause.cls_name == "InvalidArgument"
    assert "keeps no settle log: add it with stream=True" in error.cause.message
    assert not (tmp_path / "go").exists()  # the body never ran


@pytest.mark.onlystandalone
def test_a_flow_that_fails_while_followed_fails_the_step_with_its_child(
    backend: Any,
    prefix: str,
    workers: Callable[..., Any],
    instance: DagsterInstance,
    tmp_path: Path,
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)
    result = materialize(
        assets(tmp_path, 3, fail=0),
        resources=resources(url, prefix),
        instance=instance,
        raise_on_error=False,
    )
    (tmp_path / "first").touch()  # whatever came first, no child is left at its gate
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    error = failure.step_failure_data.error
    assert failure.step_key == "follow" and error.cls_name == "FlowFailedError"
    assert "child 0 refused on purpose" in error.message


@pytest.mark.onlystandalone
def test_a_reexecution_follows_the_same_flow_from_the_start(
    backend: Any,
    prefix: str,
    workers: Callable[..., Any],
    instance: DagsterInstance,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The follower's step fails after 2 results while the flow is held; re-executed from
    failure (a new run id; its parent and root run the first), it reads the same flow from
    the start: every child once, the first two as before, and no child ran twice."""
    import json

    from stream_job import CHILD as SX_CHILD
    from stream_job import PARENT as SX_PARENT
    from stream_job import make_job

    url = client_url(backend)
    monkeypatch.setenv("ECHOMQ_SJOB_URL", url)
    monkeypatch.setenv("ECHOMQ_SJOB_PREFIX", prefix)
    monkeypatch.setenv("ECHOMQ_SJOB_DIR", str(tmp_path))
    monkeypatch.setenv("ECHOMQ_SJOB_FAIL_AFTER", "2")
    workers(url, prefix, SX_CHILD)
    first = execute_job(reconstructable(make_job), instance, raise_on_error=False)
    assert not first.success
    with EchoMQ(url, prefix=prefix) as mq:
        (flow,) = mq.list_flows(SX_PARENT)
        assert mq.snapshot(SX_PARENT, flow.parent_id).parent_state == "held"  # mid-stream
    options = ReexecutionOptions.from_failure(first.run_id, instance)
    again = execute_job(reconstructable(make_job), instance, reexecution_options=options)
    assert again.success and again.run_id != first.run_id
    assert instance.get_run_by_id(again.run_id).root_run_id == first.run_id
    records = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    before = [r["child"] for r in records if r["run"] == first.run_id]
    after = [r["child"] for r in records if r["run"] == again.run_id]
    assert len(before) == 2 and after[:2] == before
    assert sorted(after) == [f"{flow.parent_id}.{i}" for i in range(5)]
    with EchoMQ(url, prefix=prefix) as mq:
        snap = mq.snapshot(SX_PARENT, flow.parent_id)
        assert (snap.parent_state, snap.processed, snap.repairs) == ("closed", 5, 0)
        assert mq.queue(SX_CHILD).stats()["completed"] == 5  # the fan-out was not re-run


@pytest.mark.onlystandalone
def test_an_empty_plan_gives_a_follower_nothing_at_once(
    backend: Any, prefix: str, instance: DagsterInstance
) -> None:
    @asset(io_manager_key="echomq_io")
    def empty_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> Iterator[Any]:
        parent_id = echomq.run_scoped_id(context)
        yield from echomq.fan_out(PARENT, [], parent_id=parent_id, on_empty="empty", stream=True)

    @asset
    def empty_follow(empty_fan: FlowFollow) -> dict[str, Any]:
        return {
            "type": type(empty_fan).__name__,
            "total": empty_fan.total,
            "pairs": list(empty_fan),
        }

    url = client_url(backend)
    result = materialize(
        [empty_fan, empty_follow], resources=resources(url, prefix), instance=instance
    )
    assert result.success
    assert result.output_for_node("empty_follow") == {"type": "FlowFollow", "total": 0, "pairs": []}
