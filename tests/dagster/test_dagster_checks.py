"""``echomq_flow_check``: a fan-out asset's failed and ignored children as an asset check
result on it - pass, WARN or ERROR by the author's thresholds, the children in its metadata -
run by ``materialize`` with the asset; thresholds out of range refused when the Definitions
load. Real Dagster, server and workers."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
from collections.abc import Callable
from typing import Any

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetSelection,
    DagsterInstance,
    DailyPartitionsDefinition,
    asset,
    materialize,
)
from dagster_echomq import EchoMQIOManager, EchoMQResource, echomq_flow_check
from dagster_echomq.handles import store_handle
from dagster_support import client_url

from echomq_core import Child, EchoMQ, FlowRef, InvalidInput

PARENT, CHILD = "ck-parent", "ck-child"


def resources(url: str, prefix: str) -> dict[str, Any]:
    echomq = EchoMQResource(url=url, prefix=prefix)
    io = EchoMQIOManager.from_resource(echomq, poll_interval=0.05)
    return {"echomq": echomq, "echomq_io": io}


def fan(children: list[Child]) -> Any:
    @asset(io_manager_key="echomq_io")
    def ck_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
        return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))

    return ck_fan


def one_ignored_of_four() -> list[Child]:
    return [
        Child({"n": i, "fail": i == 1}, queue=CHILD, ignore_dependency_on_failure=i == 1)
        for i in range(4)
    ]


def evaluate(
    url: str, prefix: str, instance: DagsterInstance, children: list[Child], **thresholds: Any
) -> tuple[AssetCheckEvaluation, dict[str, Any], FlowRef]:
    """Materialize a fan-out over ``children`` with its check; the check's evaluation, its
    metadata (plain values) and the flow."""
    asset_def = fan(children)
    check = echomq_flow_check(asset_def, poll_interval=0.05, **thresholds)
    result = materialize([asset_def, check], resources=resources(url, prefix), instance=instance)
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.asset_key == AssetKey("ck_fan")
    assert evaluation.check_name == "echomq_children"
    flow: FlowRef = result.output_for_node("ck_fan")
    return evaluation, {k: v.value for k, v in evaluation.metadata.items()}, flow


@pytest.mark.onlystandalone
def test_the_check_passes_warns_or_fails_by_the_share_of_failed_children(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)

    clean, meta, _ = evaluate(
        url, prefix, instance, [Child({"n": i}, queue=CHILD) for i in range(3)]
    )
    assert clean.passed and (meta["N"], meta["bad_share"]) == (3, 0.0)

    warned, meta, flow = evaluate(url, prefix, instance, one_ignored_of_four(), fail_above=0.5)
    assert not warned.passed and warned.severity == AssetCheckSeverity.WARN
    assert (meta["N"], meta["ignored"], meta["failed"], meta["bad_share"]) == (4, 1, 0, 0.25)
    assert list(meta["ignored_children"]) == [f"{flow.parent_id}.1"]
    assert "refused on purpose" in meta["ignored_children"][f"{flow.parent_id}.1"]

    errored, meta, _ = evaluate(url, prefix, instance, one_ignored_of_four(), fail_above=0.2)
    assert not errored.passed and errored.severity == AssetCheckSeverity.ERROR

    tolerated, _, _ = evaluate(url, prefix, instance, one_ignored_of_four(), warn_above=0.25)
    assert tolerated.passed


@pytest.mark.onlystandalone
def test_a_failed_flow_fails_the_check_with_error_and_names_the_child(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    url = client_url(backend)
    workers(url, prefix, CHILD)
    children = [Child({"n": i, "fail": i == 2}, queue=CHILD) for i in range(3)]
    failed, meta, flow = evaluate(url, prefix, instance, children, warn_above=1.0)
    assert not failed.passed and failed.severity == AssetCheckSeverity.ERROR
    assert meta["outcome"] == "failed"
    assert list(meta["failed_children"]) == [f"{flow.parent_id}.2"]


@pytest.mark.onlystandalone
def test_a_check_run_alone_judges_the_stored_flow_and_fails_on_an_expired_one(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    """A check executed without its asset (as from the UI) reads the handle the last
    materialization stored; a handle whose flow the server no longer holds fails it with
    ERROR, naming the flow, instead of failing the run."""
    url = client_url(backend)
    workers(url, prefix, CHILD)
    asset_def = fan(one_ignored_of_four())
    check = echomq_flow_check(asset_def, poll_interval=0.05)
    materialize([asset_def], resources=resources(url, prefix), instance=instance)

    def check_alone() -> AssetCheckEvaluation:
        result = materialize(
            [asset_def, check],
            selection=AssetSelection.checks(check),
            resources=resources(url, prefix),
            instance=instance,
        )
        assert result.success
        (evaluation,) = result.get_asset_check_evaluations()
        return evaluation

    stored = check_alone()
    assert (stored.passed, stored.severity) == (False, AssetCheckSeverity.WARN)
    assert stored.metadata["ignored"].value == 1
    with EchoMQ(url, prefix=prefix) as mq:
        store_handle(mq, ["ck_fan"], FlowRef(PARENT, "JOB-expired"))
    gone = check_alone()
    assert (gone.passed, gone.severity) == (False, AssetCheckSeverity.ERROR)
    assert gone.description is not None and "no flow 'JOB-expired' in queue" in gone.description


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ({"warn_above": -0.1}, r"warn_above must be a share of the children in \[0, 1\]"),
        ({"warn_above": 5}, r"warn_above must be a share"),
        ({"fail_above": 1.5}, r"fail_above must be a share"),
        ({"fail_above": float("nan")}, r"fail_above must be a share"),
        ({"warn_above": "1%"}, r"warn_above must be a share"),
        ({"warn_above": 0.2, "fail_above": 0.1}, r"fail_above \(0.1\) must be at least"),
        ({"stall_timeout": 0}, r"stall_timeout must be seconds > 0"),
    ],
)
def test_thresholds_out_of_range_are_refused_at_definitions_load(
    options: dict[str, Any], refused: str
) -> None:
    with pytest.raises(InvalidInput, match=refused):
        echomq_flow_check("ck_fan", **options)


def test_what_the_check_cannot_stand_on_is_refused() -> None:
    @asset(partitions_def=DailyPartitionsDefinition(start_date="2026-01-01"))
    def daily() -> None: ...

    with pytest.raises(InvalidInput, match="'daily' is partitioned"):
        echomq_flow_check(daily)
    with pytest.raises(InvalidInput, match="asset must be the fan-out asset"):
        echomq_flow_check(42)  # type: ignore[arg-type]
