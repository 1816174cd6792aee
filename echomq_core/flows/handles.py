"""Handles: named references an orchestrator stores beside its flows, that expire on their own.

``EchoMQ.save_ref`` ties a reference to its flow (it is deleted with the flow). A handle is the
other kind: a small JSON mapping under a reference name (``<prefix>:ref:<name>``), written as
given, that lives for ``expire`` seconds - for what has no flow behind it to expire with (the
Dagster IO manager's handle of an empty plan: its readers get an empty result, and it lives as
long as an unread flow of its queue may). Both kinds are read back with :func:`load_handle`,
which gives the mapping as written, marks included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidInput
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace


def save_handle(ks: Keyspace, name: str, data: Mapping[str, Any], expire: float | None) -> Op[None]:
    """Store ``data`` as JSON under ``name`` (overwriting), for ``expire`` seconds (at least a
    millisecond; None: until overwritten or deleted)."""
    expiry = () if expire is None else ("PX", max(1, int(float(expire) * 1000)))
    yield [Call.cmd("SET", ks.ref(name), json.dumps(dict(data)), *expiry)]


def load_handle(ks: Keyspace, name: str) -> Op[Any]:
    """The JSON stored under ``name`` (a handle, or a flow reference ``save_ref`` stored), as
    written; None when nothing is. :class:`InvalidInput` when it is not JSON."""
    (raw,) = yield [Call.cmd("GET", ks.ref(name))]
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:  # written by something else: refused by type, as load_ref does
        raise InvalidInput(f"reference {name!r} does not hold JSON: {raw[:80]!r}") from None
