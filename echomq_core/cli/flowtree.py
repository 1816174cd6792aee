"""Reading a flow as a tree, for ``echomq flow show``.

The server keeps no list of a parent's children: a parent holds a counter and three hashes of
the children that settled. So the sub-flows of a parent are found by looking, not by reading
a list. The candidates are

* the default child ids ``<parent id>.<i>`` for i < N (what ``Child`` derives when no id is
  given), and
* every child id already recorded in the parent's ``:processed``, ``:unsuccessful`` and
  ``:failed`` hashes (so settled children with explicit ids are found too);

each looked up in the parent's queue and in every registered queue, in one pipelined read,
and kept when its row is a parent (``total``) whose ``parent`` field names this parent in this
queue. What is not found: an UNSETTLED sub-flow whose id was given explicitly - it is counted
in the parent's numbers, just not expanded. Flows above :data:`MAX_PROBES` lookups are shown
with their counts only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..client import EchoMQ
from ..connection import Call, Op
from ..errors import InvalidInput
from ..keyspace import Keyspace, check_job_id
from ..models import FlowSnapshot

MAX_PROBES = 50_000
MAX_DEPTH = 16


@dataclass(slots=True)
class FlowNode:
    snap: FlowSnapshot
    subflows: list[FlowNode] = field(default_factory=list)
    note: str | None = None  # why sub-flows were not looked for

    def to_dict(self) -> dict[str, Any]:
        out = self.snap.to_dict()
        out["released"] = self.snap.released
        out["subflows"] = [child.to_dict() for child in self.subflows]
        if self.note:
            out["note"] = self.note
        return out


def read_tree(mq: EchoMQ, queue: str, parent_id: str, *, depth: int = MAX_DEPTH) -> FlowNode:
    node = FlowNode(mq.snapshot(queue, parent_id))
    total = node.snap.total
    if total == 0:
        return node
    if depth <= 0:
        node.note = f"deeper sub-flows not shown (depth limit {MAX_DEPTH})"
        return node
    queues = [queue, *(q for q in mq.queues() if q != queue)]
    if total * len(queues) > MAX_PROBES:
        node.note = f"sub-flows not listed: {total:,} children x {len(queues)} queues is too many"
        return node
    for child_queue, child_id in mq.run(_find_subflows(mq.keys, queue, parent_id, total, queues)):
        node.subflows.append(read_tree(mq, child_queue, child_id, depth=depth - 1))
    return node


def _find_subflows(
    ks: Keyspace, queue: str, parent_id: str, total: int, queues: list[str]
) -> Op[list[tuple[str, str]]]:
    """(queue, id) of each child of ``parent_id`` that is itself a parent (two round trips)."""
    recorded = yield [Call.cmd("HKEYS", key) for key in ks.parent_keys(queue, parent_id)[2:]]
    candidates = dict.fromkeys(f"{parent_id}.{i}" for i in range(total))
    for keys in recorded:
        candidates.update(dict.fromkeys(_s(k) for k in keys))
    probes: list[tuple[str, str]] = []
    for child_id in candidates:
        try:
            check_job_id(child_id)
        except InvalidInput:
            continue  # a default id grown past the id length limit: it cannot exist
        probes += [(q, child_id) for q in queues]
    if not probes:
        return []
    rows = yield [
        Call.cmd("HMGET", ks.job(q, cid), "total", "parent", "parent_queue") for q, cid in probes
    ]
    found = []
    for (child_queue, child_id), (row_total, up, up_queue) in zip(probes, rows, strict=True):
        if row_total is None or up is None or _s(up) != parent_id:
            continue
        # parent_queue is written only when the parent lives in another queue than the child
        if (_s(up_queue) if up_queue else child_queue) == queue:
            found.append((child_queue, child_id))
    return found


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def render(node: FlowNode) -> list[str]:
    """The flow as text: the root's counts, then its sub-flows as a tree."""
    s = node.snap
    state = s.parent_state or "missing"
    if s.released:
        state += " (released)"
    lines = [
        f"flow {s.parent_id} in {s.queue!r}",
        f"  parent state  {state}",
        f"  children      {s.total:,}",
        f"  outstanding   {s.dependencies:,}",
        f"  processed     {s.processed:,}",
        f"  ignored       {s.ignored:,}",
        f"  failed        {s.failed:,}",
    ]
    if s.error:
        lines.append(f"  error         {s.error}")
    if node.subflows:
        lines.append("  sub-flows")
        lines += _tree(node.subflows, "    ")
    if node.note:
        lines.append(f"  ({node.note})")
    return lines


def _summary(s: FlowSnapshot) -> str:
    return (
        f"{s.parent_id} [{s.queue}] {s.parent_state or 'missing'}: {s.total:,} "
        f"{'child' if s.total == 1 else 'children'}, "
        f"{s.dependencies:,} outstanding, {s.processed:,} processed, {s.ignored:,} ignored, "
        f"{s.failed:,} failed"
    )


def _tree(nodes: list[FlowNode], indent: str) -> list[str]:
    lines = []
    for i, node in enumerate(nodes):
        last = i == len(nodes) - 1
        lines.append(f"{indent}{'`-- ' if last else '|-- '}{_summary(node.snap)}")
        if node.note:
            lines.append(f"{indent}{'    ' if last else '|   '}({node.note})")
        lines += _tree(node.subflows, indent + ("    " if last else "|   "))
    return lines
