"""Declarative automation on "the flow is released": a marker asset, its sensor, a condition.

The fan-out asset is materialized when its flow is *added*, so an ``AutomationCondition.eager()``
downstream would start at once and block in its input until the flow settles (holding a run
slot, and failing on a stall timeout if no worker serves the children). What a fan-in waits
for is the release. So:

    measurements_released = echomq_released(measurements)   # an external asset: "released"

    @asset(deps=[measurements_released], automation_condition=after_release(measurements_released))
    def summary(measurements: dict[str, Any]) -> ...:   # read through EchoMQIOManager
        ...

    defs = Definitions(
        assets=[measurements, measurements_released, summary],
        sensors=[echomq_release_sensor("measurements_release", [measurements_released]),
                 AutomationConditionSensorDefinition("automation", target=AssetSelection.all())],
        resources={"echomq": echomq, "echomq_io": EchoMQIOManager.from_resource(echomq)},
    )

* :func:`echomq_released` is an ``AssetSpec`` downstream of the fan-out asset (same
  partitions), never materialized by a run: :func:`echomq_release_sensor` reports a
  materialization of it (of the partition) when the flow a materialization of the fan-out
  asset stored is released, with the flow's queue, parent id and counts as its metadata.
* :func:`after_release` is ``eager()`` with an update of the fan-out asset itself not counted:
  the downstream is requested when the marker updates (the flow released), and not when the
  flow is added. ``eager``'s other parts stay: nothing missing upstream, nothing in progress;
  a release later than the downstream's last materialization or request is never dropped.

The sensor follows the flows the way :func:`~dagster_echomq.echomq_flow_sensor` does (the
fan-out asset's materializations after its cursor; a bounded Pump pass so a cross-queue flow
is released with no Pump deployed) and reports each release once: a flow is dropped from its
cursor when reported, and a flow already closed (read) when first seen is not reported. A
failed or cancelled flow is logged and not reported (the downstream would fail on it; a
re-execution of the fan-out repairs it and is a new materialization). It launches no run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    AutomationCondition,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from echomq_core import InvalidInput

from .metadata import FLOW_PARENT_ID, FLOW_QUEUE
from .resource import EchoMQResource
from .sensor import _new_materializations, _pump, verdicts

#: The marker's metadata key naming the fan-out asset whose releases it stands for.
RELEASED_OF = "echomq/released_of"


def echomq_released(
    fan_out: AssetsDefinition | AssetSpec | AssetKey | str | Sequence[str],
    *,
    key: AssetKey | str | Sequence[str] | None = None,
    description: str | None = None,
) -> AssetSpec:
    """The marker asset of ``fan_out``'s releases: ``<fan_out>_released`` unless ``key`` names
    it, downstream of ``fan_out``, with its partitions (an ``AssetsDefinition`` or
    ``AssetSpec`` given)."""
    upstream, partitions = _upstream(fan_out)
    marker = (
        AssetKey.from_coercible(key)
        if key is not None
        else AssetKey([*upstream.path[:-1], f"{upstream.path[-1]}_released"])
    )
    if marker == upstream:
        raise InvalidInput(
            f"the released marker's key must differ from {upstream.to_user_string()!r}"
        )
    return AssetSpec(
        key=marker,
        deps=[upstream],
        partitions_def=partitions,
        metadata={RELEASED_OF: upstream.to_user_string()},
        description=description
        or f"EchoMQ: the flow of {upstream.to_user_string()} is released (reported by a sensor)",
    )


def after_release(released: AssetSpec) -> AutomationCondition[Any]:
    """``eager()`` on the marker: requested when the marker updates (its fan-out's flow was
    released), not when the fan-out asset itself does (its flow was added).

    ``eager()``'s ``since_last_handled()`` resets on ``newly_requested | newly_updated``; an
    ``OR`` carries no timestamps, so when the downstream's own materialization (the previous
    flow's run) and the marker's next update fall in one evaluation, the reset wins and that
    release is never handled (Dagster 1.13, dagster-io/dagster#24650). Here each reset has a
    ``since`` of its own: an update and a request are both timestamped, so a release later than
    the downstream's materialization or request stays pending."""
    upstream = _released_of(released)
    # the marker is external (never requested, never in a run): its update is the release;
    # any_deps_updated() wraps newly_updated() in an AND and an OR, which drop its timestamps
    release = AutomationCondition.any_deps_match(AutomationCondition.newly_updated()).ignore(
        AssetSelection.assets(upstream)
    )
    return (
        AutomationCondition.in_latest_time_window()
        & release.since(AutomationCondition.newly_requested())
        & release.since(AutomationCondition.newly_updated())
        & release.since(AutomationCondition.initial_evaluation())
        & ~AutomationCondition.any_deps_missing()
        & ~AutomationCondition.any_deps_in_progress()
        & ~AutomationCondition.in_progress()
    ).with_label("eager after the EchoMQ release")


def echomq_release_sensor(
    name: str,
    released: Sequence[AssetSpec],
    *,
    pump: bool = True,
    pump_seconds: float = 5.0,
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
    description: str | None = None,
) -> SensorDefinition:
    """A sensor that reports a materialization of each marker (:func:`echomq_released`) when
    a flow of its fan-out asset is released; it launches no run."""
    if isinstance(released, AssetSpec) or not released:
        raise InvalidInput("released must be a non-empty list of echomq_released(...) specs")
    pairs = [(_released_of(spec), spec.key) for spec in released]

    @sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description=description or "Reports EchoMQ flow releases as asset materializations.",
    )
    def _evaluate(context: SensorEvaluationContext, echomq: EchoMQResource) -> SensorResult:
        state = _parse(context.cursor)
        events: list[AssetMaterialization] = []
        with echomq.open_client() as client:
            watching = {}
            for upstream, marker in pairs:
                mine = {"assets": state["assets"], "waiting": state["waiting"].get(_s(marker), [])}
                watching[marker] = _new_materializations(context, [upstream], mine)
            if pump:
                flows = [w for entries in watching.values() for w in entries]
                _pump(context, echomq, client, flows, [], [], pump_seconds)
            every = [(m, e) for m, entries in watching.items() for e in entries]
            judged = verdicts(context, client, [e for _, e in every])
            for marker in watching:
                state["waiting"][_s(marker)] = []
            for (marker, _), (entry, verdict, snap) in zip(every, judged, strict=True):
                queue, parent_id, partition, _ = entry
                if verdict == "waiting":
                    state["waiting"][_s(marker)].append(entry)
                elif verdict == "request":
                    events.append(
                        AssetMaterialization(
                            asset_key=marker,
                            partition=partition,
                            description="EchoMQ flow released",
                            metadata={
                                FLOW_QUEUE: queue,
                                FLOW_PARENT_ID: parent_id,
                                "echomq/total": snap.total,
                                "echomq/processed": snap.processed,
                                "echomq/ignored": snap.ignored,
                                "echomq/failed": snap.failed,
                            },
                        )
                    )
        cursor = json.dumps(state, sort_keys=True)
        if events:
            return SensorResult(asset_events=events, cursor=cursor)
        waiting = sum(len(v) for v in state["waiting"].values())
        return SensorResult(
            skip_reason=f"no newly released flow ({waiting} waiting)", cursor=cursor
        )

    return _evaluate


def _upstream(fan_out: Any) -> tuple[AssetKey, Any]:
    if isinstance(fan_out, AssetsDefinition):
        if len(fan_out.keys) != 1:
            raise InvalidInput(
                f"echomq_released takes a fan-out asset of one key, not {len(fan_out.keys)}: "
                "pass the AssetKey of the one that adds the flow"
            )
        return fan_out.key, fan_out.partitions_def
    if isinstance(fan_out, AssetSpec):
        return fan_out.key, fan_out.partitions_def
    try:
        return AssetKey.from_coercible(fan_out), None
    except Exception as bad:
        raise InvalidInput(
            f"echomq_released takes the fan-out asset (an asset, an AssetSpec or its key), "
            f"not {fan_out!r:.100}"
        ) from bad


def _released_of(spec: Any) -> AssetKey:
    meta = getattr(spec, "metadata", None) or {}
    if not isinstance(spec, AssetSpec) or RELEASED_OF not in meta:
        raise InvalidInput(f"not a marker made by echomq_released(...): {spec!r:.120}")
    return AssetKey.from_user_string(str(meta[RELEASED_OF]))


def _s(key: AssetKey) -> str:
    return key.to_user_string()


def _parse(cursor: str | None) -> dict[str, Any]:
    state: dict[str, Any] = {"assets": {}, "waiting": {}}
    if cursor:
        try:
            data = json.loads(cursor)
        except ValueError:
            raise InvalidInput(f"not an echomq_release_sensor cursor: {cursor[:80]!r}") from None
        if not isinstance(data, dict) or not isinstance(data.get("waiting", {}), dict):
            raise InvalidInput(f"not an echomq_release_sensor cursor: {cursor[:80]!r}")
        state.update(data)
    return state
