"""``echomq_released`` / ``after_release`` / ``echomq_release_sensor`` refuse bad input when
the Definitions load (the deployment behaviour is in ``test_dagster_dev_automation.py``)."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
import pytest
from dagster import AssetKey, AssetSpec, StaticPartitionsDefinition, asset
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
