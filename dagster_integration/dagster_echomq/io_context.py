"""What the IO manager reads from Dagster's contexts and from an asset's value: the flows an
output stores or an input reads (by partition), the run and step it runs in, and where a
partition's handle lives. Kept apart from :mod:`dagster_echomq.io_manager` so that module holds
only what the IO manager does."""

from __future__ import annotations

import collections.abc
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import InputContext, OutputContext
from dagster._core.execution.context.system import StepExecutionContext

from echomq_core import FlowRef, InvalidInput

from .following import FlowFollow
from .metadata import FLOW_PARENT_ID, FLOW_QUEUE
from .reading import FlowStream


def output_flows(context: OutputContext, obj: Any) -> dict[str | None, FlowRef]:
    """The flows an output stores, by partition (None: not partitioned)."""
    partitioned = context.has_asset_key and context.has_asset_partitions
    keys = list(context.asset_partition_keys) if partitioned else []
    if isinstance(obj, Mapping) and not _looks_like_ref(obj):
        if not partitioned:
            raise InvalidInput(
                "a mapping of partition keys to flows needs a partitioned asset; return the "
                "FlowRef of the one flow instead"
            )
        got: dict[str | None, FlowRef] = {str(k): _as_flow(v) for k, v in obj.items()}
        named = sorted(str(k) for k in got)
        if named != sorted(keys):
            raise InvalidInput(
                f"the flows returned are for partitions {named[:5]}, but this step "
                f"covers {sorted(keys)[:5]} ({len(keys)} in all): return one flow per partition "
                "of context.partition_keys"
            )
        return got
    flow = _as_flow(obj)
    if not partitioned:
        return {None: flow}
    if len(keys) != 1:
        raise InvalidInput(
            f"this step covers {len(keys)} partitions: return {{partition key: FlowRef}}, one "
            "flow per partition (run_scoped_id(context, partition_key=key) gives each its id)"
        )
    return {keys[0]: flow}


def named_flow(context: InputContext, meta: Mapping[str, Any]) -> FlowRef:
    """The flow an external ``AssetSpec`` names; with only a queue, the run's flow."""
    queue = str(_raw(meta[FLOW_QUEUE]))
    if FLOW_PARENT_ID in meta:
        return FlowRef(queue, str(_raw(meta[FLOW_PARENT_ID])))
    tags = run_tags(context)
    if tags.get(FLOW_QUEUE) != queue or FLOW_PARENT_ID not in tags:
        raise InvalidInput(
            f"the asset names EchoMQ queue {queue!r} but no flow: it is read by runs that an "
            f"echomq_flow_sensor watching queues=[{queue!r}] launched (their tags name the "
            f"flow); this run's tags name {tags.get(FLOW_QUEUE)!r}/{tags.get(FLOW_PARENT_ID)!r}"
        )
    return FlowRef(queue, tags[FLOW_PARENT_ID])


def wants_stream(context: InputContext, *, partitioned: bool) -> bool:
    """Whether the input is annotated :class:`FlowStream` (or, read over several partitions,
    ``dict[str, FlowStream]``)."""
    typ = _value_type(context, partitioned)
    return isinstance(typ, type) and issubclass(typ, FlowStream)


def wants_follow(context: InputContext, *, partitioned: bool) -> bool:
    """Whether the input is annotated :class:`FlowFollow` (or, read
    over several partitions, ``dict[str, FlowFollow]``)."""
    typ = _value_type(context, partitioned)
    return isinstance(typ, type) and issubclass(typ, FlowFollow)


#: The frame classes an input may be annotated with, by where they are defined (so that
#: telling them apart imports none of the libraries), and the frame kind each is.
FRAME_TYPES = {
    ("pandas", "DataFrame"): "pandas",
    ("polars", "DataFrame"): "polars",
    ("pyarrow", "Table"): "arrow",
}


def wanted_frame(context: InputContext, *, partitioned: bool) -> str | None:
    """The frame kind (:mod:`echomq_core.flows.frames`) of an input annotated ``pandas.DataFrame``,
    ``polars.DataFrame`` or ``pyarrow.Table`` (or a ``dict[str, ...]`` of one, read over
    several partitions); None for any other annotation."""
    typ = _value_type(context, partitioned)
    if not isinstance(typ, type):
        return None
    return FRAME_TYPES.get((typ.__module__.split(".")[0], typ.__name__))


def _value_type(context: InputContext, partitioned: bool) -> Any:
    typ = context.dagster_type.typing_type
    if partitioned and typing.get_origin(typ) in (dict, collections.abc.Mapping):
        args = typing.get_args(typ)
        typ = args[1] if len(args) == 2 else Any
    return typ


def run_tags(context: InputContext) -> Mapping[str, str]:
    step_context = step_context_of(context)
    return step_context.dagster_run.tags if step_context is not None else {}


def step_context_of(context: InputContext | OutputContext) -> StepExecutionContext | None:
    try:
        return context.step_context
    except Exception:  # a context built outside a run (build_input_context) has no step
        return None


def step_of(context: InputContext | OutputContext) -> tuple[str, str] | None:
    """(run id, step key) of the step handling an output, or None outside a run."""
    step_context = step_context_of(context)
    return (step_context.run_id, step_context.step.key) if step_context is not None else None


def parent_run_id(context: InputContext | OutputContext) -> str | None:
    try:
        return context.step_context.dagster_run.parent_run_id
    except Exception:
        return None


def run_id_of(context: InputContext | OutputContext) -> str:
    try:
        return context.step_context.run_id
    except Exception:
        return "(outside a run)"


def identifier_of(context: InputContext | OutputContext, partition: str | None) -> Sequence[str]:
    """Where the handle of one output partition lives: the asset key path plus the
    partition (what ``get_asset_identifier`` gives a one-partition step); an op output's
    run-scoped identifier."""
    if context.has_asset_key:
        path = list(context.asset_key.path)
        return path if partition is None else [*path, partition]
    return context.get_identifier()


def _raw(value: Any) -> Any:
    """Metadata may arrive wrapped (``TextMetadataValue``) or plain."""
    return getattr(value, "value", value)


def _looks_like_ref(obj: Mapping[Any, Any]) -> bool:
    return "queue" in obj and "parent_id" in obj


def _as_flow(obj: Any) -> FlowRef:
    if isinstance(obj, FlowRef):
        return obj
    if isinstance(obj, Mapping) and _looks_like_ref(obj):
        return FlowRef.from_dict(dict(obj))
    raise InvalidInput(
        "an asset stored with EchoMQIOManager must return a FlowRef (from add_flow) or its "
        f"to_dict(), or for several partitions {{partition key: FlowRef}}; got "
        f"{type(obj).__name__}"
    )
