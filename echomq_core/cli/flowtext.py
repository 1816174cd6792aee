"""A flow as text, for ``echomq flow show``: the root's counts, its sub-flows as a tree
(read by :func:`echomq_core.seeing.inspection.read_tree`), and its dead children with their errors
and last tracebacks.
"""

from __future__ import annotations

from ..models import ChildFailure
from ..seeing.inspection import FlowNode

#: Parent states that say by themselves that the flow was released (a barrier flow's).
RELEASED_STATES = ("released", "closed")


def render(node: FlowNode) -> list[str]:
    """The flow as text: the root's counts, then its sub-flows as a tree."""
    s = node.snap
    state = s.parent_state or "missing"
    if s.released and state not in RELEASED_STATES:
        # a worker-run parent: its job state (pending, active, completed ...) does not say
        # that its children settled; a barrier flow's 'released' or 'closed' already does
        state += " (released)"
    if s.released and s.allowed is not None and s.failed:
        state += f", {s.failed:,} failed of {s.total:,}, {s.allowed:,} allowed"
    lines = [
        f"flow {s.parent_id} in {node.queue!r}" + _shard(node),
        f"  parent state  {state}",
        f"  children      {s.total:,}",
        f"  outstanding   {s.dependencies:,}",
        f"  processed     {s.processed:,}",
        f"  ignored       {s.ignored:,}",
        f"  failed        {s.failed:,}",
    ]
    if s.allowed is not None:  # a success threshold (min_success)
        lines.append(f"  threshold     {s.failed:,} failed so far / {s.allowed:,} allowed")
    if s.error:
        label = "reason " if s.parent_state == "cancelled" else "error  "
        lines.append(f"  {label}       {s.error}")
    if s.repairs:
        lines.append(f"  repairs       {s.repairs:,}")
    if node.subflows:
        lines.append("  sub-flows")
        lines += _tree(node.subflows, "    ")
    if node.note:
        lines.append(f"  ({node.note})")
    return lines


def render_failures(
    failures: list[ChildFailure], limit: int, died: int, *, tracebacks: bool
) -> list[str]:
    """A flow's dead children as ``child_failures(limit=limit)`` read them, one line each -
    id, queue, error - then the last traceback of the first that has one (of every one with
    ``tracebacks``), indented. ``died``: the flow's failed and ignored children in all."""
    lines = []
    for f in failures:
        label = "ignored      " if f.ignored else "failed child "
        lines.append(f"  {label} {f.job_id} [{f.queue}]: {f.error}")
    if len(failures) >= limit:
        lines.append(f"  (the first {limit}; {died:,} children died: --failures N lists more)")
    traced = [f for f in failures if f.traceback]
    for f in traced if tracebacks else traced[:1]:
        lines.append(f"  traceback of {f.job_id}:")
        lines += ["    " + line for line in (f.traceback or "").rstrip().splitlines()]
    if not tracebacks and len(traced) > 1:
        lines.append(f"  ({len(traced) - 1} more traceback(s): --tracebacks shows each)")
    return lines


def _shard(node: FlowNode) -> str:
    return f" (shard {node.shard!r})" if node.shard else ""


def _summary(node: FlowNode) -> str:
    s = node.snap
    where = f"{node.queue}, shard {node.shard}" if node.shard else node.queue
    return (
        f"{s.parent_id} [{where}] {s.parent_state or 'missing'}: {s.total:,} "
        f"{'child' if s.total == 1 else 'children'}, "
        f"{s.dependencies:,} outstanding, {s.processed:,} processed, {s.ignored:,} ignored, "
        f"{s.failed:,} failed"
    )


def _tree(nodes: list[FlowNode], indent: str) -> list[str]:
    lines = []
    for i, node in enumerate(nodes):
        last = i == len(nodes) - 1
        lines.append(f"{indent}{'`-- ' if last else '|-- '}{_summary(node)}")
        if node.note:
            lines.append(f"{indent}{'    ' if last else '|   '}({node.note})")
        lines += _tree(node.subflows, indent + ("    " if last else "|   "))
    return lines
