"""Reads for browsing: one job with everything known about it, a queue's jobs by state, a
flow's children in spec order, its failed children by error text, and the age of each
queue's oldest pending job. The dashboard's job, queue and children pages are drawn from
these; each read's cost is stated in its docstring and bounded by a page, never by the size
of a queue or a flow.

Spec order: child ``i`` of a node has the derived id ``<stem><i>`` (``<id>.`` or, in
generation n of a replaced root, ``<id>.g<n>.``), so a page of children in spec order is a
range of positions turned into ids on the host - no index of children is read. Children given
explicit ids have no position; they are listed from the node's ``:explicit`` record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..checks import text as _s
from ..flows.children import SHOWS
from ..flows.reads import snapshot
from ..models import (
    RUN_CREATED,
    RUN_MAX_ATTEMPTS,
    FlowSnapshot,
    JobInfo,
    Serializer,
    fields_dict,
    row_fact,
    split_done,
)
from ..queues import reads
from ..queues.registry import WorkerEntry, find_holders, read_token
from ..queues.rows import PAGE, as_int, death_text, jsonable
from ..wire.calls import Call, Op, scored
from ..wire.keyspace import Keyspace, check_job_id, check_queue

#: The job states a queue is browsed by: each is a sorted set of the queue.
STATES = ("pending", "active", "delayed", "dead", "completed")
#: The row fields a list shows of each job.
#: ``run`` holds max_attempts and created for rows written since it (models.row_fact).
ROW = (
    "attempts",
    "max_attempts",
    "parent",
    "parent_queue",
    "error",
    "state",
    "total",
    "created",
    "run",
    "group",
)
#: 2^40: pending scores are priority * 2^40 + arrival number.
PRIORITY_UNIT = 1 << 40


def _scored(flat: Any) -> list[tuple[str, float]]:
    return [(_s(m), float(sc)) for m, sc in scored(flat)]


# -- one job -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """One failed attempt as fail.lua recorded it in the row's ``history`` (the last 10):
    ``outcome`` 'retry' or 'dead'; ``started_ms`` and ``worker`` (the worker id's tail) None
    where its lease token did not say."""

    started_ms: int | None
    ended_ms: int
    worker: str | None
    outcome: str
    error: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # its fields, flat


def attempts_of(raw: Any) -> list[Attempt]:
    """The records of a ``history`` field, oldest first (a malformed line is skipped)."""
    out: list[Attempt] = []
    for line in _s(raw).split("\n") if raw else []:
        parts = line.split(" ", 4)
        if len(parts) < 4 or not parts[1].isdigit():
            continue
        started, ended, worker, outcome = parts[:4]
        out.append(
            Attempt(
                int(started) if started.isdigit() else None,
                int(ended),
                None if worker == "-" else worker,
                {"r": "retry", "d": "dead"}.get(outcome, outcome),
                parts[4] if len(parts) > 4 else "",
            )
        )
    return out


@dataclass(slots=True)
class JobDetail:
    """A job as the job page shows it: :class:`JobInfo` and what no single read of the row
    holds - its lease (token and deadline: the token is per claim, made by the worker's
    claim), its due time when delayed, its pending priority, when it was added, and for a
    parent its flow's counts. ``started_ms`` is when the current attempt (a leased job: from
    its token) or the last one (from the row) started; ``holder`` the id tail of the worker
    that runs or ran it and ``worker`` that worker's registry entry while it lives;
    ``attempts`` the failed attempts fail.lua recorded."""

    info: JobInfo
    created_ms: int | None = None
    lease: str | None = None
    deadline_ms: int | None = None
    due_ms: int | None = None
    priority: int | None = None
    timeout_ms: int | None = None
    flow: FlowSnapshot | None = None
    started_ms: int | None = None
    holder: str | None = None
    worker: WorkerEntry | None = None
    attempts: list[Attempt] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        i = self.info
        return {
            "queue": i.queue,
            "id": i.id,
            "state": i.state,
            "attempts": i.attempts,
            "max_attempts": i.max_attempts,
            "stalls": i.stalls,
            "payload": jsonable(i.payload),
            "result": jsonable(i.result),
            "error": i.error,
            "traceback": i.traceback,
            "parent": None if i.parent is None else {"queue": i.parent.queue, "id": i.parent.id},
            "created_ms": self.created_ms,
            "finished_ms": i.finished_ms,
            "lease": self.lease,
            "deadline_ms": self.deadline_ms,
            "due_ms": self.due_ms,
            "priority": self.priority,
            "timeout_ms": self.timeout_ms,
            "flow": None if self.flow is None else self.flow.to_dict(),
            "started_ms": self.started_ms,
            "holder": self.holder,
            "worker": None if self.worker is None else self.worker.to_dict(),
            "attempt_log": [a.to_dict() for a in self.attempts],
        }


def job_detail(ks: Keyspace, queue: str, job_id: str, ser: Serializer) -> Op[JobDetail | None]:
    """One job, or None when the id names none. Cost: two round trips (the inspect script;
    then the lease token, three ZSCOREs and one HMGET of the row), two more when a worker is
    named (:func:`~echomq_core.queues.registry.find_holders`), one more for a parent (its
    flow's snapshot script)."""
    check_queue(queue)
    check_job_id(job_id)
    info = yield from reads.inspect(ks, queue, job_id, ser)
    if info is None:
        return None
    lease, deadline, due, score, fields = yield [
        Call.cmd("HGET", ks.leases(queue), job_id),
        Call.cmd("ZSCORE", ks.active(queue), job_id),
        Call.cmd("ZSCORE", ks.delayed(queue), job_id),
        Call.cmd("ZSCORE", ks.pending(queue), job_id),
        Call.cmd(
            "HMGET",
            ks.job(queue, job_id),
            "created",
            "timeout",
            "history",
            "run",
            "done",
        ),
    ]
    created, timeout, history, run, done = fields
    # completed: the last lease's token is kept in 'done' beside the result (complete.lua)
    token = split_done(done)[0] if done is not None else None
    out = JobDetail(
        info,
        row_fact(created, run, RUN_CREATED),
        _s(lease) if lease is not None else None,
        as_int(deadline),
        as_int(due),
        int(float(score)) // PRIORITY_UNIT if score is not None else None,
        as_int(timeout),
    )
    out.attempts = attempts_of(history)
    if out.lease is not None:  # running now: the token says since when and where
        out.holder, out.started_ms = read_token(out.lease)
    elif token is not None and read_token(_s(token))[1] is not None:
        # completed: complete.lua kept the last lease's token on the row
        out.holder, out.started_ms = read_token(_s(token))
    elif out.attempts:  # its last attempt failed
        out.started_ms, out.holder = out.attempts[-1].started_ms, out.attempts[-1].worker
    if out.holder:
        out.worker = (yield from find_holders(ks, [out.holder])).get(out.holder)
    if info.total is not None:
        out.flow = yield from snapshot(ks, queue, job_id)
    return out


# -- a queue by state ----------------------------------------------------------------------


@dataclass(slots=True)
class JobRow:
    """One row of a list: the job's id, its score in the list's set (a deadline, a due time,
    a time of death or finish in ms; for pending the priority * 2^40 + arrival number) and
    the :data:`ROW` fields it shows."""

    id: str
    score: float
    attempts: int = 0
    max_attempts: int = 1
    parent: tuple[str, str] | None = None  # (queue, id)
    error: str | None = None
    state: str | None = None
    total: int | None = None
    created_ms: int | None = None
    lease: str | None = None  # active rows: the lease token, its holder tail and start
    holder: str | None = None
    started_ms: int | None = None
    group: str | None = None  # its fairness group

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self, parent=lambda parent: None if parent is None else list(parent))


@dataclass(slots=True)
class QueuePage:
    """One page of a queue's jobs in one state; ``workers``: the live registry entry of each
    holder tail named by an active row."""

    queue: str
    state: str
    total: int
    offset: int
    rows: list[JobRow] = field(default_factory=list)
    workers: dict[str, WorkerEntry] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self, rename={"rows": "jobs"}, skip=("workers",), rows=self._jobs)

    def _jobs(self, rows: list[JobRow]) -> list[dict[str, Any]]:
        """Each row's dict with the registry entry of its holder (None: no live one)."""
        return [{**r.to_dict(), "worker": _worker(self.workers.get(r.holder or ""))} for r in rows]


def _worker(entry: WorkerEntry | None) -> dict[str, Any] | None:
    return None if entry is None else entry.to_dict()


def _row(queue: str, job_id: str, score: float, values: Any) -> JobRow:
    attempts, max_attempts, parent, parent_queue, error, state, total, created, run, group = values
    up = None
    if parent is not None:
        up = (_s(parent_queue) if parent_queue else queue, _s(parent))
    return JobRow(
        job_id,
        score,
        as_int(attempts) or 0,
        row_fact(max_attempts, run, RUN_MAX_ATTEMPTS) or 1,
        up,
        death_text(error),
        _s(state) if state is not None else None,
        as_int(total),
        row_fact(created, run, RUN_CREATED),
        group=_s(group) if group is not None else None,
    )


def queue_page(
    ks: Keyspace, queue: str, state: str, offset: int = 0, limit: int = PAGE
) -> Op[QueuePage]:
    """A page of ``queue``'s jobs in ``state``, in the server's order: pending in claim order
    (priority, then arrival), active by lease deadline, delayed by due time, dead and completed
    newest first. Cost: two round trips - ZCARD and one ZRANGE with offset; then one HMGET per
    job on the page (pipelined), so a page costs the same in a queue of 40 or 40 million. An
    active page reads each row's lease token too (an HGET each, in the same round trip) and
    the workers they name (:func:`~echomq_core.queues.registry.find_holders`: two more)."""
    check_queue(queue)
    if state not in STATES:
        raise_state(state)
    key = ks.queue_key(queue, state)
    args: list[Any] = ["ZRANGE", key, offset, offset + limit - 1]
    if state in ("dead", "completed"):
        args.append("REV")
    total, flat = yield [Call.cmd("ZCARD", key), Call.cmd(*args, "WITHSCORES")]
    scored = _scored(flat)
    out = QueuePage(queue, state, int(total), offset)
    if not scored:
        return out
    base = ks.job_prefix(queue)
    calls = [Call.cmd("HMGET", base + job_id, *ROW) for job_id, _ in scored]
    active = state == "active"
    if active:
        calls += [Call.cmd("HGET", ks.leases(queue), job_id) for job_id, _ in scored]
    replies = yield calls
    rows, leases = replies[: len(scored)], replies[len(scored) :]
    out.rows = [_row(queue, j, sc, r) for (j, sc), r in zip(scored, rows, strict=True)]
    if active:
        yield from with_leases(ks, out, leases)
    return out


def with_leases(ks: Keyspace, out: QueuePage, leases: list[Any]) -> Op[None]:
    """An active page's lease tokens (read with its rows, one per row): each row's token, the
    worker holding it and its start, and those workers' registry entries (one round trip)."""
    for row, token in zip(out.rows, leases, strict=True):
        if token is not None:
            row.lease = _s(token)
            row.holder, row.started_ms = read_token(row.lease)
    out.workers = yield from find_holders(ks, [r.holder for r in out.rows if r.holder])


def raise_state(state: str) -> None:
    from ..errors import InvalidArgument

    raise InvalidArgument(f"state must be one of {', '.join(STATES)}, got {state!r:.40}")


def oldest_pending(ks: Keyspace, queues: list[str]) -> Op[dict[str, float | None]]:
    """Seconds the first pending job of each queue has existed (since its add: the row's
    ``created``, stamped by the server), None for a queue with nothing pending or whose head
    has no such stamp. Pending is ordered by priority and arrival, not time, so this is the
    age of the job the next claim takes. Cost: two round trips whatever the queues' sizes -
    one ``ZRANGE pending 0 0`` per queue, then one HMGET per queue with a head and a TIME."""
    if not queues:
        return {}
    heads = yield [Call.cmd("ZRANGE", ks.pending(q), 0, 0) for q in queues]
    ask = [(q, _s(h[0])) for q, h in zip(queues, heads, strict=True) if h]
    out: dict[str, float | None] = dict.fromkeys(queues)
    if not ask:
        return out
    replies = yield [
        Call.cmd("TIME"),
        *(Call.cmd("HMGET", ks.job_prefix(q) + job_id, "created", "run") for q, job_id in ask),
    ]
    sec, usec = replies[0]
    now_ms = int(sec) * 1000 + int(usec) // 1000
    for (q, _), (own, run) in zip(ask, replies[1:], strict=True):
        created = row_fact(own, run, RUN_CREATED)
        if created is not None:
            out[q] = max(0.0, (now_ms - created) / 1000)
    return out


__all__ = [
    "PAGE",
    "SHOWS",
    "STATES",
    "Attempt",
    "JobDetail",
    "JobRow",
    "QueuePage",
    "attempts_of",
    "job_detail",
    "oldest_pending",
    "queue_page",
]
