"""A queue kept moving and mended: the Pump's passes (due delayed jobs promoted, expired leases
recovered or buried) and an operator's hand (dead jobs revived, pending ones cancelled).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..checks import text
from ..errors import EchoMQError, ServerFull
from ..models import FAIL_PARENT, Job, ParentRef, Serializer
from ..wire.calls import Call, Lenient, Op
from ..wire.keyspace import Keyspace
from .claiming import decode

_s = text  # replies as text (echomq_core.checks.text)


def promote(ks: Keyspace, queues: Sequence[str], limit: int) -> Op[int]:
    """Move due delayed jobs to pending in every queue; the number moved. A queue whose call a
    full server refused (nothing of it written) is left for the next pass, as
    :func:`_maintained` says."""
    replies = yield Lenient([Call.lua("promote", ks.queue_keys(q), [limit]) for q in queues])
    return sum(int(r) for r in _maintained(replies))


def _maintained(replies: list[Any]) -> list[Any]:
    """The replies of a maintenance pass over several queues (one call each, a lenient step)
    that were written. A pass bounds its work anyway (``limit``): a queue whose call a full
    server refused before it ran is left as it was for the next pass, and the pass reports
    what the others did - raising would lose it (the jobs it buried, their hooks). Every call
    refused raises that :class:`~echomq_core.errors.ServerFull`; any other error raises the
    first (a call cut by a lost connection may or may not have run)."""
    refused = [r for r in replies if isinstance(r, EchoMQError)]
    if not refused:
        return replies
    if len(refused) == len(replies) or not all(isinstance(r, ServerFull) for r in refused):
        raise refused[0]
    return [r for r in replies if not isinstance(r, EchoMQError)]


def recover(
    ks: Keyspace, queues: Sequence[str], limit: int, max_stalls: int, ser: Serializer
) -> Op[tuple[int, list[tuple[Job, str]]]]:
    """Return expired leases to pending, bury those past ``max_stalls``: (how many were
    recovered, [(job, error)] of the buried - their token is '', the lease is gone). A queue
    whose call a full server refused is left for the next pass (:func:`_maintained`)."""
    due = yield [Call.lua("due", ks.queue_keys(q), [limit]) for q in queues]
    found = [(q, [_s(i) for i in ids]) for q, ids in zip(queues, due, strict=True) if ids]
    if not found:
        return (0, [])
    # a candidate that dies returns its cap token in the same step: its gate's keys must travel
    # with the call, so the rows' parent fields are read first (only when leases expired)
    marks = yield [
        Call.lua("rows", [ks.job_prefix(q) + n for n in names], ["parent", "parent_queue", "gate"])
        for q, names in found
    ]
    calls, recovered_queues = [], []
    for (queue, names), rows in zip(found, marks, strict=True):
        recovered_queues.append(queue)
        keys = [*ks.queue_keys(queue), *(ks.job_prefix(queue) + n for n in names)]
        gates: dict[tuple[str, str], int] = {}
        refs = []
        for parent, parent_queue, gate in rows:
            if gate is None or parent is None:
                refs.append(0)
                continue
            up = (_s(parent_queue) if parent_queue else queue, _s(parent))
            if up not in gates:
                gates[up] = len(gates) + 1
                keys += ks.gate_keys(queue, *up)
            refs.append(gates[up])
        spec = " ".join(map(str, refs)) if gates else ""
        calls.append(Call.lua("recover", keys, [queue, max_stalls, spec, *names]))
    replies = yield Lenient(calls)
    _maintained(replies)  # a queue a full server refused: its leases wait for the next pass
    done = [(q, r) for q, r in zip(recovered_queues, replies, strict=True)
            if not isinstance(r, EchoMQError)]  # fmt: skip
    dead = [
        (_job(_s(queue), _s(job_id), "", row, ser), _s(error))
        for queue, reply in done
        for job_id, error, *row in reply[2]
    ]
    return (sum(int(r[0]) for _, r in done), dead)


def _job(
    queue: str,
    job_id: str,
    token: str,
    row: Sequence[Any],
    ser: Serializer,
    parents: dict[tuple[Any, Any, Any, Any], ParentRef] | None = None,
) -> Job:
    """A :class:`Job` from the row fields recover.lua returns (payload, attempts, max_attempts,
    parent, parent_queue, parent_policy, stalls, timeout, gate); ``parents`` caches the
    :class:`ParentRef` of each (parent, queue, policy, gate) across one call's rows."""
    payload, attempts, max_attempts, parent, parent_queue, policy, stalls, limit, gate = row
    job = Job(
        queue,
        job_id,
        token,
        None,
        0 if attempts is None else int(attempts),
        1 if max_attempts is None else int(max_attempts),
    )
    if stalls is not None:
        job.stalls = int(stalls)
    if limit:
        job.timeout_ms = int(limit)
    if parent is not None:
        key = (parent, parent_queue, policy, gate)
        ref = parents.get(key) if parents is not None else None
        if ref is None:
            ref = ParentRef(
                _s(parent_queue) if parent_queue else queue,
                _s(parent),
                _s(policy) if policy else FAIL_PARENT,
                gate is not None,
            )
            if parents is not None:
                parents[key] = ref
        job.parent = ref
    decode(job, payload, ser)
    return job


def revive(ks: Keyspace, queue: str, job_ids: Sequence[str]) -> Op[tuple[int, list[str]]]:
    """Dead plain jobs back to pending with fresh attempts (revive.lua, in slices of 1,000);
    the number revived and the ids left as they were."""
    revived, skipped = 0, []
    for start in range(0, len(job_ids), 1000):
        part = list(job_ids[start : start + 1000])
        keys = [*ks.queue_keys(queue), *(ks.job(queue, i) for i in part)]
        ((n, left),) = yield [Call.lua("revive", keys, part)]
        revived += int(n)
        skipped += [_s(i) for i in left]
    return revived, skipped


def cancel_jobs(
    ks: Keyspace, queue: str, job_ids: Sequence[str], reason: str
) -> Op[tuple[int, list[str]]]:
    """Pending or delayed plain jobs to the morgue, their error ``cancelled: <reason>``
    (cancel_job.lua, in slices of 1,000); the number cancelled and the ids left as they were.
    The morgue, not a delete: the job stays readable, and :func:`revive` undoes it."""
    cancelled, skipped = 0, []
    for start in range(0, len(job_ids), 1000):
        part = list(job_ids[start : start + 1000])
        keys = [*ks.queue_keys(queue), *(ks.job(queue, i) for i in part)]
        ((n, left),) = yield [Call.lua("cancel_job", keys, [reason, *part])]
        cancelled += int(n)
        skipped += [_s(i) for i in left]
    return cancelled, skipped
