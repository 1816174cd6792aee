"""What a waiting task says of a flow: its progress line, and once it is released, its
summary (the XCom) and its values in spec order - one home for the sensor and the waiting
operator (:mod:`echomq_provider.waiting`, on a worker) and for the trigger (in the triggerer,
when it ends the task itself)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from echomq_core import FlowSnapshot

from .flow_specs import child_label

#: The XCom key of the summary when the return value holds the values.
FLOW_KEY = "flow"
#: The most failed or ignored children a summary or an event names (the rest are counted):
#: both live in the metadata DB.
MAX_REPORTED = 20
#: The most seconds between two progress lines.
PROGRESS_EVERY = 30.0


def progress_line(snap: FlowSnapshot) -> str:
    """``Flow <id>: settled k of N (processed p, ignored i, failed f)``."""
    return (
        f"Flow {snap.parent_id}: settled {snap.settled} of {snap.total} (processed "
        f"{snap.processed}, ignored {snap.ignored}, failed {snap.failed})"
    )


def summary_of(snap: FlowSnapshot, ignored: dict[str, str]) -> dict[str, Any]:
    """What a waiting task returns for a released flow (its XCom): the reference and counts,
    and at most :data:`MAX_REPORTED` ignored failures by label - small whatever N."""
    summary = {key: value for key, value in snap.to_dict().items() if key != "parent_state"}
    summary["state"] = snap.parent_state
    summary["ignored_failures"] = {
        str(child_label(snap.parent_id, child)): error
        for child, error in sorted(ignored.items())[:MAX_REPORTED]
    }
    return summary


def values_in_order(parent_id: str, total: int, pairs: Iterable[tuple[str, Any]]) -> Any:
    """``return_values``: the values in spec order (``None`` where a failure was ignored), or
    ``{key: value}`` when the specs gave keys."""
    labelled = [(child_label(parent_id, child), value) for child, value in pairs]
    if any(isinstance(label, str) for label, _ in labelled):
        return {str(label): value for label, value in labelled}
    ordered: list[Any] = [None] * total
    for label, value in labelled:
        if isinstance(label, int) and 0 <= label < total:
            ordered[label] = value
    return ordered


def released_line(snap: FlowSnapshot) -> str:
    """``Flow <id> released: k results, i ignored failures``."""
    return (
        f"Flow {snap.parent_id} released: {snap.processed} results, {snap.ignored} ignored failures"
    )
