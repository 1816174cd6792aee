"""``echomq_released`` / ``after_release`` / ``echomq_release_sensor`` refuse bad input when
the Definitions load; ``after_release`` evaluated by Dagster's own evaluator (the deployment
behaviour is in ``test_dagster_dev_automation.py``)."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
from importlib.util import find_spec

import pytest
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    DagsterInstance,
    Definitions,
    StaticPartitionsDefinition,
    asset,
    evaluate_automation_conditions,
)
from dagster_echomq import after_release, echomq_release_sensor, echomq_released

from echomq_core import FlowRef, InvalidInput

days = StaticPartitionsDefinition(["2026-11-30", "2026-12-01"])


@asset(partitions_def=days)
def fan() -> FlowRef:  # never run here
    raise AssertionError


@pytest.mark.onlystandalone
def test_the_marker_follows_its_fan_out_asset() -> None:
    marker = echomq_released(fan)
    assert marker.key == AssetKey("fan_released")
    assert [d.asset_key for d in marker.deps] == [AssetKey("fan")]
    assert marker.partitions_def == days
    named = echomq_released(["warehouse", "fan"], key="fan_done")
    assert named.key == AssetKey("fan_done") and named.partitions_def is None
    assert echomq_released(AssetKey(["warehouse", "fan"])).key == AssetKey(
        ["warehouse", "fan_released"]
    )
    label = after_release(marker).get_label()
    assert label == "eager after the EchoMQ release"


@pytest.mark.onlystandalone
def test_bad_input_is_refused_naming_it() -> None:
    with pytest.raises(InvalidInput, match="takes the fan-out asset"):
        echomq_released(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="must differ"):
        echomq_released("fan", key="fan")
    with pytest.raises(InvalidInput, match="not a marker made by echomq_released"):
        after_release(AssetSpec("plain"))
    with pytest.raises(InvalidInput, match="non-empty list"):
        echomq_release_sensor("s", [])
    with pytest.raises(InvalidInput, match="non-empty list"):
        echomq_release_sensor("s", echomq_released(fan))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="not a marker made by echomq_released"):
        echomq_release_sensor("s", [AssetSpec("plain")])


@asset
def crawl() -> FlowRef:  # never run here
    raise AssertionError


crawl_released = echomq_released(crawl)


@asset(deps=[crawl_released], automation_condition=after_release(crawl_released))
def crawl_summary(crawl: FlowRef) -> None:  # never run here
    raise AssertionError


@pytest.mark.onlystandalone
def test_each_release_is_requested_once_whatever_shares_its_evaluation() -> None:
    """Dagster's own evaluator over an instance: the order of events inside one evaluation
    decides. A release after the downstream's materialization (the previous flow's run) in
    the same evaluation is requested; ``eager()``'s ``since_last_handled()`` lost it. Where
    Dagster does not order an evaluation's events (1.11), it is lost as with ``eager()``
    (docs/dagster.md says so)."""
    ordered = find_spec("dagster._core.asset_graph_view.timing_metadata") is not None
    defs = Definitions(assets=[crawl, crawl_released, crawl_summary])
    instance = DagsterInstance.ephemeral()
    cursor = None

    def tick() -> int:
        nonlocal cursor
        result = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        cursor = result.cursor
        return int(result.get_num_requested(crawl_summary.key))

    def report(*keys: str) -> None:
        for key in keys:
            instance.report_runless_asset_event(AssetMaterialization(key))

    assert tick() == 0
    report("crawl")  # a flow added: not a release
    assert tick() == 0
    report("crawl_released")
    assert (tick(), tick()) == (1, 0)
    # the downstream's run ends, the next flow is added and released, one evaluation
    report("crawl_summary", "crawl", "crawl_released")
    assert (tick(), tick()) == ((1, 0) if ordered else (0, 0))
    # released, then the downstream materialized by hand, one evaluation: handled
    report("crawl", "crawl_released", "crawl_summary")
    assert tick() == 0
    # a release after the request (its run not started yet) stays pending
    report("crawl_released")
    assert tick() == 1
    report("crawl_released")
    assert tick() == (1 if ordered else 0)
    report("crawl_summary")
    assert (tick(), tick()) == (0, 0)
