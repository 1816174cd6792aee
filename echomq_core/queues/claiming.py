"""Claiming jobs: the ``claim`` script leases them, the ``rows`` script reads their rows back
as :class:`~echomq_core.models.Job` (the next claim riding along in the same round trip).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..checks import text
from ..errors import EchoMQError, ServerFull
from ..models import FAIL_PARENT, Job, ParentRef, Serializer
from ..wire.calls import Call, Lenient, Op
from ..wire.keyspace import Keyspace

#: The row fields a claim reads for each job, in this order. ``run`` packs everything else the
#: claim needs of a row: '<max_attempts> <attempts> <stalls> <timeout ms | -> <created ms>
#: [<policy> <gate 0|1> <parent_queue>]' (lua/includes/run.lua; attempts, stalls, timeout and
#: the parent fields keep their own fields too, for every other reader): the server's cost of
#: a read is about the same per field asked, present or not, and a plain job has none of the
#: rare ones (attempts, stalls, timeout, the parent fields). ``state``: a leaf has none; a
#: released worker-run parent's is 'pending' (:attr:`Job.resumed`: the handler runs as a parent).
ROW_FIELDS = ("payload", "parent", "run", "state")

_s = text  # replies as text (echomq_core.checks.text)


def claim_call(
    ks: Keyspace, queue: str, count: int, lease_ms: int, token: str, promote: int
) -> Call:
    """The ``claim`` script's call (its reply: :func:`claimed_ids`): it leases up to ``count``
    jobs within the queue's rate limit (:mod:`echomq_core.control.rates`); their rows are read by
    :func:`leased` (or :func:`claim_ahead`) in the next round trip."""
    return Call.lua("claim", ks.claim_keys(queue), [count, lease_ms, token, promote])


def claimed_ids(reply: Sequence[Any]) -> tuple[float, list[str]]:
    """What a ``claim`` call replied: the seconds until the queue's rate limit lets the next
    start through (0.0: one may start now; the script says it in µs), and the ids leased, in
    claim order."""
    return int(reply[0]) / 1e6, [i.decode() if type(i) is bytes else _s(i) for i in reply[1:]]


def claim_ahead(
    ks: Keyspace,
    queue: str,
    held: Sequence[str],
    held_token: str,
    count: int,
    lease_ms: int,
    token: str,
    promote: int,
    ser: Serializer,
) -> Op[tuple[list[Job], float, list[str]]]:
    """The jobs of ``held`` (ids leased under ``held_token`` by the claim before) and the next
    claim, in one round trip: the rows of the first and the ``claim`` script of the second
    travel in one step (same queue, same slot), so a worker claiming batch after batch pays
    one round trip per batch instead of two. Returns the jobs, and the next claim's
    ``opens_in`` and ids (leased under ``token``, their rows not read yet).

    The claim is the step's only write: a full server that refuses it
    (:class:`~echomq_core.errors.ServerFull`) still hands over the held jobs, with nothing
    claimed next (before, the refusal dropped them: their leases expired unrun)."""
    jobs, (reply,) = yield from _leased(
        ks, queue, held, held_token, ser, [claim_call(ks, queue, count, lease_ms, token, promote)]
    )
    if isinstance(reply, ServerFull):  # refused before it ran: it leased nothing
        return jobs, 0.0, []
    if isinstance(reply, EchoMQError):
        raise reply
    opens_in, names = claimed_ids(reply)
    return jobs, opens_in, names


def leased(
    ks: Keyspace, queue: str, names: Sequence[str], token: str, ser: Serializer
) -> Op[list[Job]]:
    """The :class:`Job` of each id leased under ``token`` (by a claim or a hand-off): every
    row read by the ``rows`` script in one round trip."""
    jobs, _ = yield from _leased(ks, queue, names, token, ser, [])
    return jobs


def _leased(
    ks: Keyspace,
    queue: str,
    names: Sequence[str],
    token: str,
    ser: Serializer,
    also: list[Call],
) -> Op[tuple[list[Job], list[Any]]]:
    """:func:`leased`, with the calls ``also`` (of the same slot) in the rows' step: the jobs
    and their replies."""
    base = ks.job_prefix(queue)
    # lenient: the rows (a read) are the held jobs' whatever ``also`` met (claim_ahead)
    rows, *more = yield Lenient([Call.lua("rows", [base + n for n in names], ROW_FIELDS), *also])
    if isinstance(rows, EchoMQError):
        raise rows
    facts: dict[Any, _Facts] = {}  # a claim's rows mostly share (parent, run): one parse each
    jobs = []
    for job_id, (payload, parent, packed, state) in zip(names, rows, strict=True):
        key = (parent, packed)
        known = facts.get(key)
        if known is None:
            known = facts[key] = _facts(queue, parent, packed)
        max_attempts, attempts, stalls, limit, ref = known
        job = Job(queue, job_id, token, None, attempts, max_attempts, ref, stalls)
        if limit:
            job.timeout_ms = limit
        if state is not None:  # a leaf has none: a released parent's is 'pending'
            job.resumed = state == b"pending" or state == "pending"
        decode(job, payload, ser)
        jobs.append(job)
    return jobs, more


#: What a claim takes of a row's ``run`` and ``parent``: max_attempts, attempts, stalls, the
#: timeout (ms, None for the queue's) and the parent (siblings share one, frozen).
_Facts = tuple[int, int, int, int | None, ParentRef | None]


def _facts(queue: str, parent: Any, packed: Any) -> _Facts:
    """The :data:`_Facts` of a row from its ``parent`` and ``run`` (None: no row)."""
    if packed is None:
        return (1, 0, 0, None, None)
    parts = _s(packed).split(" ", 7)
    ref = None
    if parent is not None:
        policy, gate, parent_queue = parts[5:] if len(parts) == 8 else (FAIL_PARENT, "0", "")
        ref = ParentRef(parent_queue or queue, _s(parent), policy, gate == "1")
    limit = parts[3]
    return (
        int(parts[0]),
        int(parts[1]),
        int(parts[2]),
        None if limit == "-" else int(limit),
        ref,
    )


def decode(job: Job, payload: Any, ser: Serializer) -> None:
    """Set ``job``'s payload from its row's, or say why it has none (``decode_error``)."""
    if payload is None:
        job.decode_error = "job row is missing (deleted while pending?)"
    else:
        try:
            job.payload = ser.loads(payload)
        except Exception as exc:  # any decoder error is the payload's fault
            job.decode_error = f"payload cannot be decoded: {type(exc).__name__}: {exc}"
