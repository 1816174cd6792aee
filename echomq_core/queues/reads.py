"""Reads of a queue: one job's row and place (:func:`inspect`), the counts per state."""

from __future__ import annotations

from typing import Any

from ..checks import text
from ..models import (
    FAIL_PARENT,
    RUN_MAX_ATTEMPTS,
    JobInfo,
    ParentRef,
    Serializer,
    row_fact,
    split_done,
)
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace

_s = text  # replies as text (echomq_core.checks.text)


def _int(value: Any, default: int = 0) -> int:
    return default if value is None else int(value)


def inspect(ks: Keyspace, queue: str, job_id: str, ser: Serializer) -> Op[JobInfo | None]:
    """One job's row and place, or None when the id names no job."""
    keys = [*ks.queue_keys(queue), ks.job(queue, job_id)]
    ((where, score, flat),) = yield [Call.lua("inspect", keys, [job_id])]
    row = {_s(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
    where = _s(where)
    if not row and not where:
        return None
    # where it stands decides; a held or failed parent is in no set, and its row says which;
    # a flow child in no set and without a state completed (the retention sweep dropped its
    # `completed` entry; its row stays until its flow expires)
    state = where or (
        _s(row["state"]) if "state" in row else ("completed" if "parent" in row else "pending")
    )
    parent = None
    if "parent" in row:
        pq = row.get("parent_queue")
        parent = ParentRef(
            _s(pq) if pq else queue, _s(row["parent"]), _s(row.get("parent_policy", FAIL_PARENT))
        )

    def decode(value: bytes | None) -> Any:
        if value is None:
            return None
        try:
            return ser.loads(value)
        except Exception:
            return value

    return JobInfo(
        queue,
        job_id,
        state,
        _int(row.get("attempts")),
        row_fact(row.get("max_attempts"), row.get("run"), RUN_MAX_ATTEMPTS) or 1,
        decode(row.get("payload")),
        decode(split_done(row["done"])[1] if "done" in row else None),
        _s(row["error"]) if "error" in row else None,
        parent,
        _int(row["total"]) if "total" in row else None,
        _int(row.get("stalls")),
        int(float(score)) if score and where in ("completed", "dead") else None,
        _s(row["traceback"]) if "traceback" in row else None,
        _s(row["group"]) if "group" in row else None,
    )


#: What :func:`stat_calls` counts, in its order: five job states, then two lists.
STATS = ("pending", "active", "delayed", "dead", "completed", "outbox", "poison")


def stat_calls(ks: Keyspace, queue: str) -> list[Call]:
    """The reads of one queue's counts, in :data:`STATS` order (ZCARD of each job state's
    index, LLEN of the outbox and the poison list)."""
    return [
        Call.cmd("ZCARD", ks.pending(queue)),
        Call.cmd("ZCARD", ks.active(queue)),
        Call.cmd("ZCARD", ks.delayed(queue)),
        Call.cmd("ZCARD", ks.dead(queue)),
        Call.cmd("ZCARD", ks.completed(queue)),
        Call.cmd("LLEN", ks.outbox(queue)),
        Call.cmd("LLEN", ks.poison(queue)),
    ]


def stats(ks: Keyspace, queue: str) -> Op[dict[str, int]]:
    """Counts per state of one queue (one pipelined read)."""
    replies = yield stat_calls(ks, queue)
    return {name: int(n) for name, n in zip(STATS, replies, strict=True)}
