"""``EchoMQIOManager``: a flow handle goes out of one asset, its children's results come into
the next.

Using::

    @asset(io_manager_key="echomq_io")
    def measurements(echomq: EchoMQResource) -> FlowRef:
        return echomq.add_flow("reports", [Child(...), ...])

    @asset
    def summary(measurements: dict[str, Any]) -> ...:   # child id -> result
        ...

``handle_output`` stores the handle (queue and parent id) in the EchoMQ server, as the named
reference ``dagster:<asset key>[/<partition>]`` (key ``<prefix>:ref:dagster:...``, see
``EchoMQ.save_ref``; it is deleted with its flow when the flow expires), and records the
flow's counts as materialization metadata. ``load_input`` reads the handle, waits (bounded by
``wait_timeout``) until the parent is released, returns ``{child id: result}`` and records the
final counts as an observation of the upstream asset. The handle lives in the server rather
than on a local disk so that any process that reaches the flow reaches its handle: a step
process of the multiprocess executor, a container of a Kubernetes executor, a later run.

Only the parent's queue and id are stored, not the child list a ``FlowRef`` may carry: the
handle stays a few bytes whatever N is, and the results are read from the server in pages.

A flow added outside Dagster feeds an asset the same way, without an upstream step: declare it
as an ``AssetSpec`` whose metadata names the flow (:func:`flow_metadata`) and whose IO manager
is this one; ``load_input`` then takes the flow from the metadata.

If the parent failed (a child that fails its parent died), loading raises
:class:`FlowFailedError`, naming the failed children. If it is not released in time, the
core's ``FlowTimeout`` propagates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    ConfigurableIOManager,
    Failure,
    InputContext,
    MetadataValue,
    OutputContext,
)
from pydantic import Field

from echomq_core import EchoMQ, FlowRef, FlowSnapshot, InvalidInput, ParentFailed

from .resource import EchoMQResource

#: Asset metadata keys naming an external flow (see :func:`flow_metadata`).
FLOW_QUEUE = "echomq/queue"
FLOW_PARENT_ID = "echomq/parent_id"


class FlowFailedError(ParentFailed, Failure):
    """Raised when a flow an asset depends on has a failed parent (a fail-the-parent child
    died). ``failed`` maps each failed child id to its error.

    It is the core's :class:`ParentFailed` (``except ParentFailed`` catches it) and a Dagster
    ``Failure``, so Dagster fails the step at once - no retry policy can revive a failed
    parent - and shows the failed children as metadata of the step failure.
    """

    def __init__(self, queue: str, parent_id: str, failed: Mapping[str, str]) -> None:
        super().__init__(queue, parent_id, dict(failed))
        # Failure.__init__ ran through the MRO with the message as description; its metadata
        # is what the UI shows next to the step failure.
        self.metadata = {
            "queue": MetadataValue.text(queue),
            "parent_id": MetadataValue.text(parent_id),
            "failed_count": MetadataValue.int(len(self.failed)),
            "failed_children": MetadataValue.json(dict(sorted(self.failed.items())[:20])),
        }
        self.allow_retries = False


def flow_metadata(queue: str, parent_id: str) -> dict[str, str]:
    """Metadata for an ``AssetSpec`` that stands for a flow added outside Dagster::

    AssetSpec("nightly_scores", metadata=flow_metadata("scores", "JOB-nightly-42"))
        .with_io_manager_key("echomq_io")
    """
    return {FLOW_QUEUE: queue, FLOW_PARENT_ID: parent_id}


def handle_name(identifier: Sequence[str]) -> str:
    """The name the handle of one asset (or op output) is stored under (``EchoMQ.save_ref``)."""
    return "dagster:" + "/".join(identifier)


def store_handle(client: EchoMQ, identifier: Sequence[str], flow: FlowRef) -> None:
    client.save_ref(handle_name(identifier), flow)


def read_handle(client: EchoMQ, identifier: Sequence[str]) -> FlowRef | None:
    """The flow last stored for ``identifier``, or None if nothing was stored."""
    return client.load_ref(handle_name(identifier))


def counts_metadata(snap: FlowSnapshot) -> dict[str, Any]:
    """A flow's counts as Dagster metadata (shown on the asset's page)."""
    return {
        "queue": snap.queue,
        "parent_id": snap.parent_id,
        "parent_state": str(snap.parent_state),
        "N": MetadataValue.int(snap.total),
        "processed": MetadataValue.int(snap.processed),
        "ignored": MetadataValue.int(snap.ignored),
        "failed": MetadataValue.int(snap.failed),
        "outstanding": MetadataValue.int(snap.dependencies),
    }


def wait_released(client: EchoMQ, flow: FlowRef, *, timeout: float, poll: float) -> FlowSnapshot:
    """Wait until ``flow``'s parent is released; :class:`FlowFailedError` if it failed."""
    try:
        return client.wait(flow.queue, flow.parent_id, timeout=timeout, poll=poll)
    except ParentFailed as exc:
        raise FlowFailedError(exc.queue, exc.parent_id, exc.failed) from None


class EchoMQIOManager(ConfigurableIOManager):
    """Stores an asset's flow handle; loads a downstream input as the flow's
    ``{child id: result}`` once its parent is released."""

    echomq: EchoMQResource = Field(
        description="The EchoMQ resource (server, prefix, Pump). Its Pump runs while a step "
        "waits for a flow, so a cross-queue flow settles even with no Pump deployed elsewhere.",
    )
    wait_timeout: float = Field(
        default=600.0,
        description="Seconds load_input waits for the parent to be released before raising "
        "FlowTimeout.",
    )
    poll_interval: float = Field(
        default=0.5, description="Seconds between two reads of the flow's state while waiting."
    )
    page: int = Field(
        default=1000,
        description="Results read per round trip when building the input (HSCAN page size).",
    )
    close_after_read: bool = Field(
        default=True,
        description="Close a released barrier flow once an input has read it, so its closed "
        "retention starts (reads still work until it ends).",
    )
    wait_on_output: bool = Field(
        default=False,
        description="Also wait in handle_output, so the upstream materialization records final "
        "counts and a failed flow fails the upstream step itself.",
    )

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        flow = _as_flow(obj)
        client = self.echomq.client
        store_handle(client, _output_identifier(context), flow)
        if self.wait_on_output:
            snap = wait_released(client, flow, timeout=self.wait_timeout, poll=self.poll_interval)
        else:
            snap = client.snapshot(flow.queue, flow.parent_id)
        context.add_output_metadata(counts_metadata(snap))

    def load_input(self, context: InputContext) -> dict[str, Any]:
        client = self.echomq.client
        flow = self.flow_for_input(context)
        snap = wait_released(client, flow, timeout=self.wait_timeout, poll=self.poll_interval)
        values = dict(client.iter_children_values(flow.queue, flow.parent_id, page=self.page))
        if self.close_after_read and snap.parent_state == "released":
            client.close_flow(flow.queue, flow.parent_id)
        if context.has_asset_key:
            context.add_input_metadata(counts_metadata(snap), description="EchoMQ flow released")
        return values

    def flow_for_input(self, context: InputContext) -> FlowRef:
        """The flow an input reads: named in the upstream asset's metadata (an external flow),
        else the handle its materialization stored."""
        upstream = context.upstream_output
        meta = upstream.definition_metadata if upstream is not None else {}
        if meta and FLOW_QUEUE in meta and FLOW_PARENT_ID in meta:
            return FlowRef(str(_raw(meta[FLOW_QUEUE])), str(_raw(meta[FLOW_PARENT_ID])))
        identifier = _input_identifier(context)
        flow = read_handle(self.echomq.client, identifier)
        if flow is None:
            raise InvalidInput(
                f"no EchoMQ flow stored for {'/'.join(identifier)!r} under prefix "
                f"{self.echomq.prefix!r}: materialize the upstream asset first, or name the "
                f"flow in its metadata ({FLOW_QUEUE!r}, {FLOW_PARENT_ID!r})"
            )
        return flow


def _raw(value: Any) -> Any:
    """Metadata may arrive wrapped (``TextMetadataValue``) or plain."""
    return getattr(value, "value", value)


def _as_flow(obj: Any) -> FlowRef:
    if isinstance(obj, FlowRef):
        return obj
    if isinstance(obj, Mapping) and "queue" in obj and "parent_id" in obj:
        return FlowRef.from_dict(dict(obj))
    raise InvalidInput(
        "an asset stored with EchoMQIOManager must return a FlowRef (from add_flow) or its "
        f"to_dict(), got {type(obj).__name__}"
    )


def _output_identifier(context: OutputContext) -> Sequence[str]:
    return context.get_asset_identifier() if context.has_asset_key else context.get_identifier()


def _input_identifier(context: InputContext) -> Sequence[str]:
    if context.has_asset_key:
        return context.get_asset_identifier()
    return context.get_identifier()
