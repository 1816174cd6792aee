"""Settling leased jobs: complete and fail (their records batched per
:data:`~echomq_core.wire.calls.CHUNK` jobs, lua/includes/batch.lua), leases extended
(heartbeat) and given back (release); a worker's hand-off of capped children (:class:`Hand`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import EchoMQError, PartlyWritten, ServerFull
from ..models import Job, ParentRef, Settlement
from ..wire.calls import Call, Lenient, Op, chunks
from ..wire.keyspace import Keyspace


@dataclass(frozen=True, slots=True)
class Hand:
    """A worker's offer to take, as its own leases, the capped children that the gates of its
    completions and deaths admit (lua/includes/hand.lua): the lease token to give them, the
    lease, and how many at most (its free runners). The token cycle of a capped flow then
    skips the pending queue, the wake-up of an idle worker and its claim. Not honoured on a
    queue with a rate limit (its starts are counted by claims)."""

    token: str
    lease_ms: int
    room: int

    def spec(self, gates: str) -> str:
        """The scripts' hand argument for a batch whose gated refs are ``gates``."""
        return f"{self.token} {self.lease_ms} {self.room}" if gates and self.room > 0 else ""


def _batch(
    ks: Keyspace, queue: str, part: Sequence[tuple[Any, ...]]
) -> tuple[list[Any], dict[str, int], list[Job], str, list[str]]:
    """The batch encoding complete and fail share (lua/includes/batch.lua): the header - job,
    group, cross-parent and token counts, the shared ref, the group parent ids, the cross
    parents, the tokens, each numbered once per batch - then per job: id, token number, its
    values, ref (0 no parent, k same-queue group k, -k cross-queue parent k). A batch of one
    token whose jobs share their ref (a claim's jobs of one parent, or of none: the usual
    case) sends that ref once in the header and per job only id and values: two arguments
    fewer per job, each of which the server turns into a string object and back into Lua.
    ``part`` holds (job, *values).
    Returns (argv, same-queue groups in order, the jobs without a parent, the refs whose
    children are gated by a cap (the scripts' gates argument), those gates' keys)."""
    groups: dict[str, int] = {}
    cross: dict[tuple[str, str], int] = {}
    tokens: dict[str, int] = {}
    plain: list[Job] = []
    records: list[Any] = []
    short: list[Any] = []  # the records without token number and ref
    shared: set[int] = set()
    gated: dict[int, ParentRef] = {}
    for job, *values in part:
        parent = job.parent
        if parent is None:
            ref = 0
            plain.append(job)
        else:
            if parent.queue == queue:
                ref = groups.setdefault(parent.id, len(groups) + 1)
            else:
                ref = -cross.setdefault((parent.id, parent.queue), len(cross) + 1)
            if parent.gated and ref not in gated:
                gated[ref] = parent
        records += [job.id, tokens.setdefault(job.token, len(tokens) + 1), *values, ref]
        short += [job.id, *values]
        shared.add(ref)
    one = len(tokens) == 1 and len(shared) == 1
    argv: list[Any] = [len(part), len(groups), len(cross), len(tokens)]
    argv += [next(iter(shared)) if one else "", *groups]
    for parent_id, parent_queue in cross:
        argv += [parent_id, parent_queue]
    argv += [*tokens, *(short if one else records)]
    gate_keys: list[str] = []
    for up in gated.values():
        gate_keys += ks.gate_keys(queue, up.queue, up.id)
    return argv, groups, plain, " ".join(map(str, gated)), gate_keys


def _group_keys(ks: Keyspace, queue: str, groups: dict[str, int]) -> list[str]:
    keys: list[str] = []
    for parent_id in groups:  # insertion order == group index order
        keys += ks.settle_keys(queue, parent_id)
    return keys


def _hand_spec(ks: Keyspace, queue: str, hand: Hand | None, gates: str, keys: list[str]) -> str:
    """The hand argument of one complete / fail call, the config key appended to ``keys``
    when there is one (the script reads the queue's rate limit from it)."""
    spec = hand.spec(gates) if hand is not None else ""
    if spec:
        keys.append(ks.config(queue))
    return spec


def complete(
    ks: Keyspace,
    queue: str,
    done: Sequence[tuple[Job, bytes]],
    *,
    keep: bool,
    hand: Hand | None = None,
) -> Op[Settlement]:
    """Complete ``(job, serialised result)`` pairs; status 1 where the lease was current.
    With ``hand``, the first call with gated children hands what its gates admit to the
    caller (their ids in ``Settlement.handed``, at most ``hand.room``). Each call (up to
    :data:`CHUNK` jobs) also counts its completions in the minute's tally, in the same script:
    a full server refuses the call whole (:class:`~echomq_core.errors.ServerFull`), or it is
    written whole; calls cut between them raise :class:`~echomq_core.errors.PartlyWritten`."""
    calls = Lenient()
    fixed = ks.queue_keys(queue)
    rows = ks.job_prefix(queue)
    minutes = ks.minutes(queue)
    parts = list(chunks(done))
    for part in parts:
        batch, groups, plain, gates, gate_keys = _batch(ks, queue, part)
        keys = [*fixed, *(rows + j.id for j in plain), *_group_keys(ks, queue, groups)]
        keys += gate_keys
        spec = _hand_spec(ks, queue, hand, gates, keys)
        if spec:
            hand = None
        keeps = "1" if keep else "0"
        # released root parents (a worker-run flow's own run) enter flows:completed, so a
        # finished flow is listed (echomq flow ls); found here from the claim's read, so a
        # batch without one costs the script nothing
        roots = [str(j) for j, job in enumerate(plain, 1) if job.resumed]
        if roots:
            keeps += " " + " ".join(roots)
            keys.append(ks.flows(queue, "completed"))
        keys.append(minutes)  # the tally's: always the last key (complete.lua)
        argv = [queue, keeps, gates, spec, *batch]
        calls.append(Call.lua("complete", keys, argv))
    replies = yield calls
    return _outcome(queue, parts, replies)


def fail(
    ks: Keyspace,
    queue: str,
    failed: Sequence[tuple[Job, str, str, int]],
    *,
    hand: Hand | None = None,
) -> Op[Settlement]:
    """Fail ``(job, error, traceback, delay_ms)`` records (traceback '' for none; delay -1: bury
    now). Per job: 0 lease lost, 1 retry scheduled, 2 dead. ``hand`` and the tally as
    :func:`complete` (failed attempts, deaths among them)."""
    calls = Lenient()
    minutes = ks.minutes(queue)
    parts = list(chunks(failed))
    for part in parts:
        batch, groups, _, gates, gate_keys = _batch(ks, queue, part)
        keys = [
            *ks.queue_keys(queue),
            *(ks.job_prefix(queue) + j.id for j, *_ in part),
            *_group_keys(ks, queue, groups),
            *gate_keys,
        ]
        spec = _hand_spec(ks, queue, hand, gates, keys)
        if spec:
            hand = None
        keys.append(minutes)
        calls.append(Call.lua("fail", keys, [queue, gates, spec, *batch]))
    replies = yield calls
    return _outcome(queue, parts, replies)


def _outcome(queue: str, parts: Sequence[Sequence[Any]], replies: list[Any]) -> Settlement:
    """What a complete or fail step did, one reply per part of the batch (a lenient step):
    an error raises the first one - except a full server's refusal of some parts after others
    were written, which raises :class:`~echomq_core.errors.PartlyWritten` saying which."""
    refused = [r for r in replies if isinstance(r, EchoMQError)]
    if not refused:
        return _settled(queue, replies)
    if len(refused) == len(replies) or not all(isinstance(r, ServerFull) for r in refused):
        raise refused[0]
    written: list[Any] = []
    left: list[Any] = []
    settled = Settlement([])
    for part, reply in zip(parts, replies, strict=True):
        if isinstance(reply, EchoMQError):
            left += part
        else:
            written += part
            settled.absorb(queue, reply)
    raise PartlyWritten(
        f"{refused[0]} ({len(written)} of {len(written) + len(left)} written, in "
        f"{len(replies) - len(refused)} of {len(replies)} calls)",
        written,
        settled,
        left,
    )


def _settled(queue: str, replies: list[Any]) -> Settlement:
    out = Settlement([])
    for reply in replies:
        out.absorb(queue, reply)
    return out


def heartbeat(ks: Keyspace, queue: str, jobs: Sequence[Job], lease_ms: int) -> Op[list[bool]]:
    """Extend leases; False where the lease was lost."""
    calls = []
    for part in chunks(jobs):
        argv: list[Any] = [lease_ms]
        for job in part:
            argv += [job.id, job.token]
        calls.append(Call.lua("heartbeat", ks.queue_keys(queue), argv))
    replies = yield calls
    return [bool(flag) for reply in replies for flag in reply]


def release(ks: Keyspace, queue: str, jobs: Sequence[Job]) -> Op[list[bool]]:
    """Give leased jobs back to pending untouched (no attempt counted); False where lost."""
    calls = []
    for part in chunks(jobs):
        argv: list[Any] = []
        for job in part:
            argv += [job.id, job.token]
        calls.append(Call.lua("release", ks.queue_keys(queue), argv))
    replies = yield calls
    return [bool(flag) for reply in replies for flag in reply]
