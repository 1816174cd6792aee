"""Named references to flows: a name that stands for a flow (``save_ref`` / ``load_ref``),
deleted with the flow when it expires (the root notes the names that point at it)."""

from __future__ import annotations

import json

from ..errors import InvalidInput
from ..models import FlowRef
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace


def ref_body(queue: str, parent_id: str) -> str:
    """What a named reference to a flow holds (compared when the flow expires)."""
    return json.dumps({"queue": queue, "parent_id": parent_id})


def save_ref(ks: Keyspace, name: str, ref: FlowRef) -> Op[None]:
    """Store ``ref`` under ``name`` (overwriting), and note the name on the flow's root, so
    the reference is deleted with the flow when it expires."""
    yield [
        Call.cmd("SET", ks.ref(name), ref_body(ref.queue, ref.parent_id)),
        Call.lua("note_ref", [ks.job(ref.queue, ref.parent_id)], [name]),
    ]


def load_ref(ks: Keyspace, name: str) -> Op[FlowRef | None]:
    """The reference stored under ``name``, or None."""
    (raw,) = yield [Call.cmd("GET", ks.ref(name))]
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:  # written by something else: refused by type, like a bad mapping
        raise InvalidInput(f"reference {name!r} does not hold JSON: {raw[:80]!r}") from None
    return FlowRef.from_dict(data)
