"""EchoMQResource and EchoMQIOManager with real Dagster, a real server and real workers.

Workers here run no Pump, and the flows are cross-queue (children in another queue than the
parent), so a parent is released only if some Pump delivers the children's signals.
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations
# (context, resource and input types) at definition time and needs them as objects.
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from dagster import (
    AssetExecutionContext,
    AssetSpec,
    DagsterEventType,
    DagsterInstance,
    OpExecutionContext,
    Out,
    StaticPartitionsDefinition,
    asset,
    job,
    materialize,
    op,
)
from dagster_echomq import (
    EchoMQIOManager,
    EchoMQResource,
    FlowFailedError,
    NotABarrierFlow,
    flow_metadata,
)
from dagster_echomq.failures import TRACEBACK_SHOWN
from dagster_echomq.handles import read_handle
from dagster_echomq.pumps import PumpShare
from dagster_support import client_url, pump_threads

from echomq_core import Child, EchoMQ, FlowRef, FlowTimeout, JobNotFound, ParentFailed
from echomq_core.wire.keyspace import check_job_id
from tests.waiting import eventually

PARENT, CHILD = "dg-parent", "dg-child"
N = 12


def fan_out_assets(n: int = N, fail: set[int] | None = None, deep: int = 0) -> list[Any]:
    """``fan_out`` adds a cross-queue flow of n children (those in ``fail`` die, raising
    ``deep`` calls down); ``collect`` receives the results."""

    @asset(io_manager_key="echomq_io")
    def fan_out(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
        children = [
            Child({"n": i, "fail": i in (fail or set()), "deep": deep}, queue=CHILD)
            for i in range(n)
        ]
        return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))

    @asset
    def collect(fan_out: dict[str, Any]) -> dict[str, Any]:
        return fan_out

    return [fan_out, collect]


def resources(url: str, prefix: str, **io_options: Any) -> dict[str, Any]:
    shared = {k: io_options.pop(k) for k in ("run_pump", "pump_queues") if k in io_options}
    echomq = EchoMQResource(url=url, prefix=prefix, **shared)
    return {
        "echomq": echomq,
        "echomq_io": EchoMQIOManager.from_resource(echomq, poll_interval=0.05, **io_options),
    }


def step_error(result: Any, step: str) -> Any:
    (event,) = [
        e
        for e in result.all_events
        if e.event_type == DagsterEventType.STEP_FAILURE and e.step_key == step
    ]
    return event.step_failure_data.error


def test_cross_queue_flow_completes_only_through_the_resource_pump(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)
    assets = fan_out_assets()

    # Without the resource's Pump, nothing delivers the children's signals: the workers
    # finish every child, yet the parent stays held and the downstream load times out.
    stuck = materialize(
        assets,
        resources=resources(url, prefix, run_pump=False, wait_timeout=3.0, cancel_on_failure=False),
        instance=instance,
        raise_on_error=False,
    )
    assert not stuck.success
    error = step_error(stuck, "collect")
    assert error.cls_name == "DagsterExecutionLoadInputError"
    assert error.cause.cls_name == "FlowTimeout"
    assert f"{N} outstanding" in error.cause.message
    flow: FlowRef = stuck.output_for_node("fan_out")
    with EchoMQ(url, prefix=prefix) as mq:
        children = [f"{flow.parent_id}.{i}" for i in range(N)]
        eventually(  # the workers may still be busy on a loaded machine
            lambda: {mq.get_job(CHILD, c).state for c in children} == {"completed"},
            30,
            "the workers to finish the children",
        )
        # every child's signal waits in its queue's outbox: none was delivered
        assert mq.queue(CHILD).stats()["outbox"] == N
        snap = mq.snapshot(flow.queue, flow.parent_id)
        assert (snap.parent_state, snap.dependencies) == ("held", N)

        # The same flow, loaded again with the resource's Pump running: released, complete.
        done = materialize(
            assets, selection=["collect"], resources=resources(url, prefix), instance=instance
        )
        assert done.success
        values = done.output_for_node("collect")
        assert set(values) == set(children)
        assert sorted(v["value"] for v in values.values()) == [i * i for i in range(N)]
        assert mq.snapshot(flow.queue, flow.parent_id).released


@pytest.mark.onlystandalone
def test_failed_parent_fails_the_load_with_a_typed_error(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)
    result = materialize(
        fan_out_assets(fail={3}),
        resources=resources(url, prefix),
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    flow: FlowRef = result.output_for_node("fan_out")
    error = step_error(result, "collect")
    # Dagster reports the FlowFailedError itself (a Failure is not wrapped), naming the child.
    assert error.cls_name == "FlowFailedError"
    assert f"{flow.parent_id}.3" in error.message
    assert "refused on purpose" in error.message
    # ... and where it raised: the first failed child's id, error and traceback
    shown = error.message.split("first failed child: ", 1)[1]
    assert shown.startswith(f"{flow.parent_id}.3 in {CHILD!r}: ")
    assert "Traceback (most recent call last)" in shown and 'worker_proc.py", line' in shown
    assert "Unrecoverable: child 3 refused on purpose" in shown
    failure = next(e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE)
    meta = failure.step_failure_data.user_failure_data.metadata
    assert meta["failed_count"].value == 1
    assert list(meta["failed_children"].value) == [f"{flow.parent_id}.3"]
    assert meta["first_failed_child"].value == f"{flow.parent_id}.3"
    assert meta["first_traceback"].value.endswith("Unrecoverable: child 3 refused on purpose")

    # raise_on_error: the caller catches the typed error (also a core ParentFailed).
    with pytest.raises(FlowFailedError) as caught:
        materialize(
            fan_out_assets(fail={3}),
            selection=["collect"],
            resources=resources(url, prefix),
            instance=instance,
        )
    assert isinstance(caught.value, ParentFailed)
    assert list(caught.value.failed) == [f"{flow.parent_id}.3"]
    assert caught.value.parent_id == flow.parent_id
    first = caught.value.first_failure
    assert first is not None and (first.queue, first.job_id) == (CHILD, f"{flow.parent_id}.3")
    assert pump_threads() == []


@pytest.mark.onlystandalone
def test_a_long_traceback_is_cut_to_its_last_lines(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    """A child that dies from a chain of 60 causes: the error shows the end of its traceback
    (where it raised), at most TRACEBACK_SHOWN characters of whole lines, and says it was cut."""
    url = client_url(backend)
    workers(url, prefix, CHILD)
    with pytest.raises(FlowFailedError) as caught:
        materialize(
            fan_out_assets(n=2, fail={1}, deep=60),
            resources=resources(url, prefix),
            instance=instance,
        )
    first = caught.value.first_failure
    assert first is not None and first.traceback is not None
    assert len(first.traceback) > TRACEBACK_SHOWN  # the row kept more than is shown
    shown = str(caught.value).split(f"{first.job_id} in {CHILD!r}: ", 1)[1]
    lines = shown.split("\n")
    assert lines[0] == "Unrecoverable: child 1 refused on purpose"
    assert re.fullmatch(r"\[\.\.\. \d+ characters cut\]", lines[1])
    kept = "\n".join(lines[2:])
    assert len(kept) <= TRACEBACK_SHOWN
    assert first.traceback.rstrip("\n").endswith(kept)
    # whole lines of the traceback, not half of one (where the cut lands moves with the length
    # of the paths in it), and no blank line first
    assert ("\n" + kept) in first.traceback and lines[2].strip()
    assert kept.endswith("Unrecoverable: child 1 refused on purpose")


@pytest.mark.onlystandalone
def test_external_flow_feeds_an_asset(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    """A flow added outside Dagster, declared as an AssetSpec naming it in its metadata."""
    url = client_url(backend)
    with EchoMQ(url, prefix=prefix) as mq:
        ref = mq.add_flow(
            "ext-parent",
            [Child({"n": i}, queue="ext-child") for i in range(5)],
            parent_id="JOB-nightly-42",
            barrier=True,
        )
    workers(url, prefix, "ext-child")
    external = AssetSpec("nightly_scores", metadata=flow_metadata(ref.queue, ref.parent_id))
    external = external.with_io_manager_key("echomq_io")

    @asset
    def scores_report(nightly_scores: dict[str, Any]) -> int:
        return sum(v["value"] for v in nightly_scores.values())

    result = materialize(
        [external, scores_report], resources=resources(url, prefix), instance=instance
    )
    assert result.success
    assert result.output_for_node("scores_report") == sum(i * i for i in range(5))
    (observed,) = result.asset_observations_for_node("scores_report")
    assert observed.metadata["processed"].value == 5


@pytest.mark.onlystandalone
def test_fan_out_takes_generators_down_the_tree(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    """Issue 48, item 7: the resource's add takes a generator of children whose own children
    are generators (read once each), and the flow runs to its release."""
    url = client_url(backend)
    workers(url, prefix, CHILD)

    @asset(io_manager_key="echomq_io")
    def tree(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
        groups = (
            Child({"n": 100 + g}, queue=CHILD,
                  children=(Child({"n": 3 * g + i}, queue=CHILD) for i in range(3)))
            for g in range(2)
        )  # fmt: skip
        return echomq.add_flow(PARENT, groups, parent_id=echomq.run_scoped_id(context))

    @asset
    def tree_values(tree: dict[str, Any]) -> int:
        return len(tree)

    result = materialize([tree, tree_values], resources=resources(url, prefix), instance=instance)
    assert result.success
    assert result.output_for_node("tree_values") == 2
    flow: FlowRef = result.output_for_node("tree")
    with EchoMQ(url, prefix=prefix) as mq:
        for _, sub in flow.children:
            assert mq.snapshot(CHILD, sub).total == 3
            assert len(mq.children_values(CHILD, sub)) == 3


@pytest.mark.onlystandalone
@pytest.mark.parametrize(
    ("queue", "parent_id", "says"),
    [
        ("ext-parent", "JOB-nightly-24", "no flow 'JOB-nightly-24' in queue 'ext-parent': never"),
        ("ext-prent", "JOB-nightly-42", "in queue 'ext-prent': .*did you mean 'ext-parent'\\?"),
    ],
)
def test_a_flow_that_is_not_there_fails_the_load_at_once(
    backend: Any, prefix: str, instance: DagsterInstance, queue: str, parent_id: str, says: str
) -> None:
    """A typo'd reference (id or queue) fails the input's load with the core's JobNotFound,
    naming the queue and id (and the closest queue), not after wait_timeout (issue 48)."""
    url = client_url(backend)
    with EchoMQ(url, prefix=prefix) as mq:
        mq.add_flow("ext-parent", [Child(1, queue="ext-child")], parent_id="JOB-nightly-42",
                    barrier=True)  # fmt: skip
    external = AssetSpec("nightly_typo", metadata=flow_metadata(queue, parent_id))
    external = external.with_io_manager_key("echomq_io")

    @asset
    def typo_report(nightly_typo: dict[str, Any]) -> int:
        return len(nightly_typo)

    started = time.monotonic()
    with pytest.raises(JobNotFound, match=says):
        materialize(
            [external, typo_report],
            resources=resources(url, prefix, wait_timeout=120.0),
            instance=instance,
        )
    assert time.monotonic() - started < 60


@pytest.mark.onlystandalone
def test_a_flow_added_without_barrier_is_refused_naming_it(
    backend: Any, prefix: str, instance: DagsterInstance
) -> None:
    """A worker-run flow (no barrier=True) is its parent job's to end: Dagster neither reads
    one an AssetSpec names (refused before any wait) nor stores one an asset returns."""
    url = client_url(backend)
    with EchoMQ(url, prefix=prefix) as mq:
        ref = mq.add_flow(
            "ext-parent", [Child({"n": 1}, queue="ext-child")], parent_id="JOB-worker-run-7"
        )
    external = AssetSpec("worker_scores", metadata=flow_metadata(ref.queue, ref.parent_id))

    @asset
    def report(worker_scores: dict[str, Any]) -> int:
        return len(worker_scores)

    with pytest.raises(NotABarrierFlow, match="flow JOB-worker-run-7 in 'ext-parent' was added"):
        materialize(
            [external.with_io_manager_key("echomq_io"), report],
            resources=resources(url, prefix, stall_timeout=2.0),
            instance=instance,
        )

    @asset(io_manager_key="echomq_io")
    def worker_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
        children = [Child({"n": 1}, queue=CHILD)]
        parent_id = echomq.run_scoped_id(context)
        return echomq.add_flow(PARENT, children, parent_id=parent_id, barrier=False)

    with pytest.raises(NotABarrierFlow) as caught:
        materialize([worker_fan], resources=resources(url, prefix), instance=instance)
    assert "EchoMQIOManager stores no handle for it" in str(caught.value)
    with EchoMQ(url, prefix=prefix) as mq:
        assert read_handle(mq, ["worker_fan"]) is None
        # the worker-run flow is left to its worker, not cancelled
        assert mq.snapshot(PARENT, caught.value.parent_id).parent_state == "held"


@pytest.mark.onlystandalone
def test_pump_queues_run_one_pump_for_the_run_and_stop_after_it_even_when_a_step_fails(
    backend: Any, prefix: str, instance: DagsterInstance
) -> None:
    """With pump_queues, the resource runs one Pump on those queues for the whole run, and
    teardown stops and joins it although the step raised."""
    seen: dict[str, Any] = {}

    @asset(io_manager_key="echomq_io")
    def probe(echomq: EchoMQResource) -> FlowRef:
        assert echomq.pump is not None and echomq.pump_running
        seen["pump"] = echomq.pump.id
        seen["threads"] = pump_threads()
        seen["live"] = PumpShare.live_pumps()
        seen["queues"] = echomq.pump.fixed
        raise RuntimeError("step fails after the pump started")

    url = client_url(backend)
    result = materialize(
        [probe],
        resources=resources(url, prefix, pump_queues=[CHILD]),
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    assert seen["threads"] == seen["live"] == [seen["pump"]]
    assert seen["queues"] == [CHILD]
    assert seen["pump"] not in [t.name for t in threading.enumerate()]
    assert pump_threads() == []


@pytest.mark.onlystandalone
def test_timeout_is_bounded(backend: Any, prefix: str, instance: DagsterInstance) -> None:
    """No worker at all: the load gives up after wait_timeout, with the core's FlowTimeout."""
    url = client_url(backend)
    started = time.monotonic()
    with pytest.raises(FlowTimeout):
        materialize(
            fan_out_assets(n=2),
            resources=resources(url, prefix, wait_timeout=1.0),
            instance=instance,
        )
    assert time.monotonic() - started < 30


def test_run_scoped_ids_are_valid_stable_per_step_and_distinct_per_run(
    instance: DagsterInstance,
) -> None:
    seen: list[str] = []
    parts = StaticPartitionsDefinition(["2026-01-01", "p q{r}"])

    @asset(partitions_def=parts)
    def daily(context: AssetExecutionContext) -> None:
        first = EchoMQResource.run_scoped_id(context)
        assert EchoMQResource.run_scoped_id(context) == first  # a retry derives the same id
        seen.append(first)
        seen.append(EchoMQResource.run_scoped_id(context, "extra"))

    @op
    def plain(context: OpExecutionContext) -> None:
        seen.append(EchoMQResource.run_scoped_id(context))

    @job
    def plain_job() -> None:
        plain()

    for key in parts.get_partition_keys():
        assert materialize([daily], partition_key=key, instance=instance).success
    assert plain_job.execute_in_process(instance=instance).success
    for job_id in seen:
        check_job_id(job_id)
    assert seen[0].endswith(".daily.2026-01-01")
    assert seen[1] == seen[0] + ".extra"
    assert ".daily.p_q_r_~" in seen[2]
    assert seen[4].startswith("JOB-dagster.") and seen[4].endswith(".plain")
    assert len(set(seen)) == len(seen)


@pytest.mark.onlystandalone
def test_op_outputs_pass_a_flow_between_ops(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    """Outside assets, the handle is kept per run, step and output."""
    url = client_url(backend)
    workers(url, prefix, CHILD)

    @op(out=Out(io_manager_key="echomq_io"))
    def fan(context: OpExecutionContext, echomq: EchoMQResource) -> FlowRef:
        children = [Child({"n": i}, queue=CHILD) for i in range(4)]
        return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))

    @op
    def gather(values: dict[str, Any]) -> int:
        return sum(v["value"] for v in values.values())

    @job(resource_defs=resources(url, prefix))
    def fan_job() -> None:
        gather(fan())

    result = fan_job.execute_in_process(instance=instance)
    assert result.success
    assert result.output_for_node("gather") == sum(i * i for i in range(4))


@pytest.mark.onlystandalone
def test_wait_on_output_records_final_counts_on_the_upstream(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)
    result = materialize(
        fan_out_assets(n=4, fail={2}),
        resources=resources(url, prefix, wait_on_output=True),
        instance=instance,
        raise_on_error=False,
    )
    # the failed parent fails the upstream step itself; the downstream never starts
    assert step_error(result, "fan_out").cls_name == "FlowFailedError"
    assert "collect" not in {e.step_key for e in result.all_events if e.is_step_start}

    done = materialize(
        fan_out_assets(n=4),
        resources=resources(url, prefix, wait_on_output=True),
        instance=instance,
    )
    meta = done.asset_materializations_for_node("fan_out")[0].metadata
    assert (meta["N"].value, meta["processed"].value, meta["outcome"].value) == (4, 4, "released")


@pytest.mark.onlystandalone
def test_metadata_links_each_flow_to_its_dashboard_page(
    backend: Any,
    prefix: str,
    workers: Callable[..., Any],
    instance: DagsterInstance,
    proc_env: dict[str, str],
) -> None:
    """With ``dashboard_url`` set, the upstream's materialization and the downstream's input
    metadata carry ``flow_page``: the flow's page on a real ``echomq dashboard`` process."""
    from tests.dashkit import Dashboard

    url = client_url(backend)
    workers(url, prefix, CHILD)
    dash = Dashboard(url, prefix, proc_env)
    try:
        echomq = EchoMQResource(url=url, prefix=prefix, dashboard_url=dash.base)
        io = EchoMQIOManager.from_resource(echomq, poll_interval=0.05)
        done = materialize(
            fan_out_assets(n=3), resources={"echomq": echomq, "echomq_io": io}, instance=instance
        )
        meta = done.asset_materializations_for_node("fan_out")[0].metadata
        page = meta["flow_page"].value
        parent_id = meta["echomq/parent_id"].value
        assert page == echomq.flow_page(PARENT, parent_id)
        assert page.startswith(dash.base + "/flow/")
        shown = dash.get(page.removeprefix(dash.base))
        assert shown.status == 200 and parent_id in shown.body
        # the downstream's load records the settled flow, its page included
        observed = [e.asset_observation_data.asset_observation.metadata for e in done.all_events
                    if e.event_type == DagsterEventType.ASSET_OBSERVATION]  # fmt: skip
        assert [m["flow_page"].value for m in observed if "flow_page" in m] == [page]
    finally:
        dash.stop()
