"""A job's row read back for showing: the page sizes of every list, and the values a row
holds as an int, a death's text, or something JSON can carry. Shared by the reads of a
queue's jobs (:mod:`echomq_core.seeing.browse`) and of a flow's children
(:mod:`echomq_core.flows.children`)."""

from __future__ import annotations

import json
from typing import Any

from ..checks import text as _s

#: Rows per page of every list here.
PAGE = 50
#: The most positions one filtered page of children walks (child_scan.lua: at most three
#: HEXISTS each), and the most records one search by error text reads.
BUDGET = 20_000


def as_int(value: Any) -> int | None:
    return None if value is None else int(float(value))


def death_text(raw: Any) -> str | None:
    """A death record without its repair-epoch prefix (``\\1<epoch>\\1<error>``)."""
    if raw is None:
        return None
    text = _s(raw)
    if text.startswith("\1"):
        text = text.split("\1", 2)[-1]
    return text


def jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
