"""Where an asset's flow is found: its handle, stored in the EchoMQ server.

An asset's flow is stored as the named reference ``dagster:<asset key>[/<partition>]`` (key
``<prefix>:ref:dagster:...``, see ``EchoMQ.save_ref``; it is deleted with its flow when the
flow expires), one per partition. The handle lives in the server rather than on a local disk
so that any process that reaches the flow reaches its handle: a step process of the
multiprocess executor, a container of a Kubernetes executor, a later run, the sensor. An
:class:`EmptyFlow` (a fan-out over an empty plan whose readers get an empty result) is stored
under the same name, marked ``"empty"``, with no flow behind it (``EchoMQ.save_handle``): it
expires after its queue's ``unclosed_age`` retention instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from echomq_core import EchoMQ, FlowRef


@dataclass(frozen=True, slots=True)
class EmptyFlow(FlowRef):
    """The handle of a fan-out over an empty plan whose readers get an empty result
    (``EchoMQResource.fan_out(..., on_empty="empty")``): a ``FlowRef`` that names no flow on
    the server - a flow of no children is refused - so the asset's output has the type a
    flow's output has. The IO manager stores it as a marked handle and loads it as the empty
    result of a flow's read (``{}``, or a :class:`FlowStream` that yields nothing), without a
    wait or a Pump; the sensor requests no run for it (there is nothing to release).
    ``parent_id`` is the id the flow would have had (the metadata shows it)."""


def empty_body(flow: EmptyFlow) -> dict[str, Any]:
    """What the handle of an empty plan holds: a flow's handle, marked empty."""
    return {"queue": flow.queue, "parent_id": flow.parent_id, "empty": True}


def handle_name(identifier: Sequence[str]) -> str:
    """The name the handle of one asset partition (or op output) is stored under."""
    return "dagster:" + "/".join(identifier)


def store_handle(client: EchoMQ, identifier: Sequence[str], flow: FlowRef) -> None:
    """Store ``flow`` as the handle of ``identifier``, replacing what was stored (an earlier
    run's flow, or empty plan). An :class:`EmptyFlow` has no flow to expire with, so its
    handle lives as long as an unread flow of its queue may (``unclosed_age``)."""
    if not isinstance(flow, EmptyFlow):
        client.save_ref(handle_name(identifier), flow)
        return
    age = client.retention(flow.queue)["unclosed_age"]
    client.save_handle(handle_name(identifier), empty_body(flow), expire=age)


def read_handle(client: EchoMQ, identifier: Sequence[str]) -> FlowRef | None:
    """The flow last stored for ``identifier`` (an :class:`EmptyFlow` for an empty plan),
    or None if nothing was stored."""
    data = client.load_handle(handle_name(identifier))
    if data is None:
        return None
    flow = FlowRef.from_dict(data)
    if isinstance(data, dict) and data.get("empty") is True:
        return EmptyFlow(flow.queue, flow.parent_id)
    return flow
