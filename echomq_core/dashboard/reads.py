"""What each dashboard page reads, through the public client and the core's inspection reads.

Every read here is bounded by the page, never by the size of a queue or a flow: counts are
ZCARD/LLEN, lists are one page of an index (``list_flows``, a ZRANGE of ``dead``, an LRANGE of
``poison``), a flow's children are read in HSCAN pages with a cursor, and a flow's tree is
``echomq flow show``'s (:func:`echomq_core.seeing.inspection.read_tree`, which gives up on trees
above its probe limit instead of reading them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..client.clients import EchoMQ
from ..errors import JobNotFound
from ..flows.failures import stall_reading
from ..flows.reads import scan_page
from ..models import ChildFailure, FlowSnapshot, FlowSummary, JobInfo
from ..pump.drain import parse_signal, poison_list
from ..seeing.browse import JobDetail
from ..seeing.inspection import FlowNode, flow_counts, read_tree
from ..wire.calls import Call, Op
from ..wire.keyspace import FLOW_INDEXES, FLOW_LISTS, check_job_id, check_queue, derived_index

#: Rows per page of a list (flows per state, dead jobs, poisoned signals, children's values).
PAGE = 50
#: The most failed / ignored children shown on a flow's page, each with its last traceback
#: (the counts show the rest).
SHOWN_ERRORS = 100
#: How far up a dead job's parents are followed to find the root flow to repair.
MAX_UP = 16


@dataclass(slots=True)
class FlowList:
    queues: list[str]
    counts: dict[str, dict[str, int]]  # queue -> state -> root flows
    flows: list[FlowSummary]

    def to_dict(self) -> dict[str, Any]:
        return {
            "queues": self.queues,
            "counts": self.counts,
            "flows": [f.to_dict() for f in self.flows],
        }


def list_flows(
    mq: EchoMQ, queue: str | None, state: str | None, offset: int, limit: int = PAGE
) -> FlowList:
    names = [check_queue(queue)] if queue else mq.queues()
    flows: list[FlowSummary] = []
    counts = {}
    for name in names:
        counts[name] = mq.perform(flow_counts(mq.keys, name, FLOW_LISTS))
        flows += mq.list_flows(name, state, limit=limit, offset=offset)
    return FlowList(names, counts, flows)


@dataclass(slots=True)
class FlowPage:
    tree: FlowNode
    failed: list[ChildFailure]  # fail-parent deaths (a failed sub-flow by its leaf)
    ignored: list[ChildFailure]
    values: dict[str, Any]
    cursor: int  # the next page of values (0: none)
    up: JobInfo | None  # this flow's own row: its parent when it is a sub-flow
    root: tuple[str, str] | None = None  # (queue, id) of the root flow, when it is a sub-flow
    controls: dict[str, str] = field(default_factory=dict)  # see controls()


def attempts_made(state: str | None, failed: int) -> int:
    """How many attempts a job has made: the row counts failed ones only (fail.lua's
    ``attempts``), so the one running now (active) or the one that succeeded (completed) is
    added - a job completed at its first try made 1 attempt, not 0."""
    return failed + (1 if state in ("active", "completed") else 0)


def outstanding(snap: FlowSnapshot) -> int:
    """A flow's children neither settled nor dead. The snapshot's ``dependencies`` still
    counts fail-the-parent deaths (they are never settled: the flow failed) except those a
    ``min_success`` threshold tolerated, which settle; so a failed flow whose only unsettled
    children are dead has 0 outstanding, not the number of its dead."""
    dead = snap.failed - min(snap.failed, snap.allowed or 0)
    return max(0, snap.dependencies - dead)


def flow_status(mq: EchoMQ, queue: str, parent_id: str) -> dict[str, Any] | None:
    """What a flow's page polls for live progress: its snapshot - ONE script call, whatever
    the flow's size (the tree and the values are read when the page loads, not per poll),
    and for a flow with a ``max_running`` cap its use (``flow_cap``: one round trip more);
    None when there is no such flow."""
    snap = mq.snapshot(check_queue(queue), check_job_id(parent_id))
    if snap.parent_state is None and snap.total == 0:
        return None
    flow = {**snap.to_dict(), "released": snap.released, "outstanding": outstanding(snap)}
    return {
        "flow": flow,
        "settled": snap.settled,
        "outcome": snap.outcome,
        "controls": controls(mq, snap),
    }


def controls(mq: EchoMQ, snap: FlowSnapshot) -> dict[str, str]:
    """A flow's flow-control lines, as the page shows them: ``running`` (admitted / cap, and
    how many wait for a token) for a capped flow, ``threshold`` (failed so far / allowed) for
    a flow with ``min_success``; empty for a flow with neither."""
    out = {}
    if snap.cap is not None:
        use = mq.flow_cap(snap.queue, snap.parent_id)
        if use is not None:
            out["running"] = (
                f"{use.admitted:,} / {use.cap:,} running, {use.waiting:,} waiting for a token"
            )
            if use.admitted and snap.outcome == "waiting":
                # admitted is not running: a token is held from admission, pending included;
                # wait()'s own reading (failures.stall_reading) says whether any child queue
                # runs a job, and names a queue whose jobs nothing claims
                stall = mq.perform(stall_reading(mq.keys, snap.queue, snap.parent_id))
                if not stall.busy and stall.hint:
                    out["running"] = (
                        f"{use.admitted:,} / {use.cap:,} admitted, none running: {stall.hint}; "
                        f"{use.waiting:,} waiting for a token"
                    )
    if snap.allowed is not None:
        out["threshold"] = f"{snap.failed:,} failed / {snap.allowed:,} allowed"
    return out


def values_page(
    mq: EchoMQ, queue: str, parent_id: str, cursor: int = 0
) -> tuple[int, dict[str, Any]]:
    """One HSCAN page of a flow's children's values from ``cursor``: (next cursor, 0 at the
    end; {child id: value}). About :data:`PAGE` values, or the whole hash while the server
    keeps it compact (listpack: up to 128 or 512 entries by default): HSCAN returns those in
    one go. The page is in spec order (the children page lists them all in that order)."""
    check_queue(queue)
    check_job_id(parent_id)
    next_cursor, raw = mq.perform(scan_page(mq.keys.processed(queue, parent_id), cursor, PAGE))
    values = {}
    for child_id, value in sorted(raw.items(), key=lambda kv: _spec_order(parent_id, kv[0])):
        try:
            values[child_id] = mq.serializer.loads(value)
        except Exception:  # shown as it is stored
            values[child_id] = value.decode(errors="replace")
    return next_cursor, values


def flow_page(mq: EchoMQ, queue: str, parent_id: str, cursor: int = 0) -> FlowPage | None:
    """A flow's tree and counts, its failed and ignored children with their errors and last
    tracebacks (:meth:`~echomq_core.EchoMQ.child_failures`, first :data:`SHOWN_ERRORS` of
    each), and one page of its children's values from ``cursor``; None when there is no such
    flow (values: see :func:`values_page`)."""
    check_queue(queue)
    check_job_id(parent_id)
    snap = mq.snapshot(queue, parent_id)
    if snap.parent_state is None and snap.total == 0:
        return None
    tree = read_tree(mq, queue, parent_id)
    died = (
        mq.child_failures(queue, parent_id, limit=2 * SHOWN_ERRORS)
        if snap.ignored or snap.failed
        else []
    )
    next_cursor, values = values_page(mq, queue, parent_id, cursor)
    try:
        up = mq.get_job(queue, parent_id)
    except JobNotFound:
        up = None
    root = root_of(mq, up) if up is not None and up.parent is not None else None
    return FlowPage(
        tree,
        [f for f in died if not f.ignored][:SHOWN_ERRORS],
        [f for f in died if f.ignored][:SHOWN_ERRORS],
        values,
        next_cursor,
        up,
        root,
        controls(mq, snap),
    )


def root_of(mq: EchoMQ, job: JobInfo) -> tuple[str, str] | None:
    """(queue, id) of the root flow above ``job`` (None when it is no flow's child). A repair
    is asked of the root: it repairs every sub-flow below it, bottom-up."""
    at = job
    for _ in range(MAX_UP):
        up = at.parent
        if up is None:
            return (at.queue, at.id) if at is not job else None
        try:
            at = mq.get_job(up.queue, up.id)
        except JobNotFound:
            return (up.queue, up.id)
    return (at.queue, at.id)


@dataclass(slots=True)
class JobView:
    """A job's page: the job (:func:`echomq_core.seeing.browse.job_detail`) and, for a flow's child,
    the root flow a repair or cancel acts on (up to :data:`MAX_UP` row reads more)."""

    detail: JobDetail
    root: tuple[str, str] | None = None
    #: a completed flow child's value: its completion writes no row (complete.lua), the value
    #: goes into its parent's ``:processed`` - read from there (one HGET); ``value_found``
    #: False while it is not there (its signal still on the way, or the flow expired)
    value: Any = None
    value_found: bool = False

    @property
    def attempts_made(self) -> int:
        return attempts_made(self.detail.info.state, self.detail.info.attempts)

    @property
    def unrecorded(self) -> bool:
        """A completed flow child whose worker and start no record kept: complete.lua writes
        a flow child's value into its flow and nothing on its row (one command per child)."""
        info = self.detail.info
        return info.state == "completed" and info.parent is not None and not self.detail.started_ms


def job_view(mq: EchoMQ, detail: JobDetail) -> JobView:
    info = detail.info
    view = JobView(detail, root_of(mq, info) if info.parent is not None else None)
    if info.state == "completed" and info.parent is not None and info.result is None:
        key = mq.keys.processed(info.parent.queue, info.parent.id)
        raw = mq.perform(_one(Call.cmd("HGET", key, info.id)))
        if raw is not None:
            view.value_found = True
            try:
                view.value = mq.serializer.loads(raw)
            except Exception:  # shown as it is stored
                view.value = _text(raw)
    return view


def server_ms() -> Op[int]:
    """The server's clock in ms (TIME): lease deadlines are on it, so whether one has passed
    is asked of it, not of this host's clock."""
    (reply,) = yield [Call.cmd("TIME")]
    sec, usec = reply
    return int(sec) * 1000 + int(usec) // 1000


def _one(call: Call) -> Op[Any]:
    (reply,) = yield [call]
    return reply


@dataclass(slots=True)
class DeadJob:
    job: JobInfo
    died_ms: int
    root: tuple[str, str] | None = None  # the flow to repair to re-run it


@dataclass(slots=True)
class DeadList:
    queue: str
    total: int
    jobs: list[DeadJob] = field(default_factory=list)


def _dead_ids(key: str, offset: int, limit: int) -> Op[tuple[int, list[tuple[str, int]]]]:
    total, flat = yield [
        Call.cmd("ZCARD", key),
        Call.cmd("ZRANGE", key, offset, offset + limit - 1, "REV", "WITHSCORES"),
    ]
    if flat and isinstance(flat[0], list | tuple):  # redis-py pairs WITHSCORES up itself
        scored = [(m, sc) for m, sc in flat]
    else:
        scored = list(zip(flat[::2], flat[1::2], strict=True))
    pairs = [(_text(m), int(float(sc))) for m, sc in scored]
    return int(total), pairs


def dead_jobs(mq: EchoMQ, queue: str, offset: int, limit: int = PAGE) -> DeadList:
    """A page of ``queue``'s dead jobs, newest first, each with the root flow whose repair
    re-runs it (None for a plain job)."""
    check_queue(queue)
    total, ids = mq.perform(_dead_ids(mq.keys.dead(queue), offset, limit))
    out = DeadList(queue, total)
    for job_id, died in ids:
        try:
            info = mq.get_job(queue, job_id)
        except JobNotFound:  # swept since it was listed
            continue
        out.jobs.append(DeadJob(info, died, root_of(mq, info) if info.parent else None))
    return out


def poisoned(mq: EchoMQ, queue: str, count: int = PAGE) -> list[dict[str, Any]]:
    check_queue(queue)
    rows = []
    for reason, entry in mq.perform(poison_list(mq.keys, queue, count)):
        try:
            sig = parse_signal(entry)
        except ValueError:
            rows.append({"reason": reason, "raw": entry.decode(errors="replace")})
            continue
        rows.append(
            {
                "reason": reason,
                "kind": {"c": "completed", "i": "ignored", "f": "failed"}[sig.kind],
                "child": sig.child,
                "parent_queue": sig.parent_queue,
                "parent": sig.parent,
            }
        )
    return rows


def _spec_order(parent_id: str, child_id: str) -> tuple[int, str]:
    """Children by position where their ids are derived (``.2`` before ``.10``), else by id."""
    index = derived_index(parent_id, child_id)
    return (1 << 62, child_id) if index is None else (index, "")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def jsonable(value: Any) -> Any:
    """``value`` if JSON can carry it, else its repr (a custom serializer's objects)."""
    import json

    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


__all__ = ["FLOW_INDEXES", "PAGE", "dead_jobs", "flow_page", "list_flows", "poisoned"]
