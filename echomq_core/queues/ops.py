"""Queue operations, written once as generators driven by the sync and the async connection.

Each function here builds keys and arguments, yields one step (a list of calls sent as one
pipeline) at a time, reads the replies and returns a result. Batches are cut into chunks of
at most :data:`CHUNK` jobs per script call (Lua's unpack limit and a bounded time inside the
server), and all chunks of a step travel in one pipeline: a bulk call costs one round trip,
not one per job.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..checks import text
from ..errors import EchoMQError, PartlyWritten, ServerFull
from ..models import (
    FAIL_PARENT,
    RUN_MAX_ATTEMPTS,
    Job,
    JobInfo,
    ParentRef,
    Serializer,
    Settlement,
    row_fact,
    split_done,
)
from ..wire import collector
from ..wire.calls import Call, Lenient, Op
from ..wire.keyspace import Keyspace

CHUNK = 500
#: A bulk call of at least this many items pauses the cyclic garbage collector (gc_paused).
GC_PAUSE_AT = 5_000
#: The row fields a claim reads for each job, in this order. ``run`` packs everything else the
#: claim needs of a row: '<max_attempts> <attempts> <stalls> <timeout ms | -> <created ms>
#: [<policy> <gate 0|1> <parent_queue>]' (lua/includes/run.lua; attempts, stalls, timeout and
#: the parent fields keep their own fields too, for every other reader): the server's cost of
#: a read is about the same per field asked, present or not, and a plain job has none of the
#: rare ones (attempts, stalls, timeout, the parent fields). ``state``: a leaf has none; a
#: released worker-run parent's is 'pending' (:attr:`Job.resumed`: the handler runs as a parent).
ROW_FIELDS = ("payload", "parent", "run", "state")
#: What a row written before ``run`` existed (or by an older client) is read for instead: a
#: second read, of those rows only, in the same claim (``up``: the parent fields packed by the
#: layout before ``run``; a row without it has only the separate ones).
OLD_FIELDS = (
    "max_attempts",
    "attempts",
    "stalls",
    "timeout",
    "up",
    "parent_policy",
    "gate",
    "parent_queue",
)


@contextmanager
def gc_paused(items: Any) -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a bulk call of ``items`` builds its
    objects (specs, planned nodes, packed commands), when there are at least
    :data:`GC_PAUSE_AT` of them (an iterable without a length is not paused for).

    Building a flow of hundreds of thousands of children allocates enough objects to set off
    many collections, and each older-generation one walks every tracked object of the process:
    the bigger the heap (an Airflow task's), the more each costs (docs/benchmarks.md gives the
    figures). What the call allocates is freed by reference counting, or by the first
    collection after it. The pause is process-wide: a collector that was already off
    (the caller's choice) stays off; one paused by another thread's bulk call comes back when
    that call ends.
    """
    if not isinstance(items, Sized) or len(items) < GC_PAUSE_AT:
        yield
        return
    with collector.paused():
        yield


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


_s = text  # replies as text (echomq_core.checks.text)


def _int(value: Any, default: int = 0) -> int:
    return default if value is None else int(value)


# -- add --------------------------------------------------------------------------------


def register(ks: Keyspace, queues: Sequence[str]) -> list[Call]:
    """The call that records queue names in the registry (none when there is nothing new)."""
    return [Call.cmd("SADD", ks.queues(), *queues)] if queues else []


def add(
    ks: Keyspace,
    queue: str,
    jobs: Sequence[tuple[str, bytes, int, int, int, int | None]],
    *,
    check: bool,
    new_queues: Sequence[str] = (),
    stem: str | None = None,
) -> Op[int]:
    """Add jobs ``(id, payload, max_attempts, delay_ms, priority, timeout_ms)``; returns how
    many were added (ids that existed are left untouched). ``check=False`` only for
    host-generated ids. Jobs sharing their options share a script call; ``new_queues`` rides
    along in the same pipeline (the registry), so the whole call is one round trip.

    ``stem``: every id is ``stem`` plus its index in hex, the indexes increasing in ``jobs``
    order (queue.py's generated ids). A chunk whose ids are then consecutive (the usual bulk
    add: first and last tell, the order gives the rest) sends the stem and its first index
    instead of an id per job: the script checks the stem once and formats each id itself
    (lua/add.lua says why that is cheaper and as safe)."""
    calls = register(ks, new_queues)
    skip = len(calls)
    groups: dict[tuple[int, int, int, int | None], list[tuple[str, bytes]]] = {}
    for job_id, payload, max_attempts, delay_ms, priority, limit in jobs:
        key = (max_attempts, delay_ms, priority, limit)
        groups.setdefault(key, []).append((job_id, payload))
    fixed = ks.queue_keys(queue)
    rows = ks.job_prefix(queue)
    cut = len(stem) if stem else 0
    for (max_attempts, delay_ms, priority, limit), items in groups.items():
        for part in chunks(items):
            argv: list[Any] = ["1" if check else "0", max_attempts, delay_ms, priority]
            argv.append("" if limit is None else limit)
            start = _start(stem, cut, part[0][0], part[-1][0], len(part)) if stem else None
            if start is None:
                argv += ("", "")
                for job_id, payload in part:
                    argv += (job_id, payload)
            else:
                argv += (stem, start, *(payload for _, payload in part))
            calls.append(Call.lua("add", [*fixed, *(rows + job_id for job_id, _ in part)], argv))
    replies = yield calls
    return sum(int(r) for r in replies[skip:])


def _start(stem: str | None, cut: int, first: str, last: str, n: int) -> int | None:
    """The index of ``first`` when a chunk of ``n`` generated ids runs ``first`` .. ``last``
    without a gap (``stem`` + consecutive hex indexes), else None."""
    if not stem or not first.startswith(stem):
        return None
    try:
        start = int(first[cut:], 16)
    except ValueError:
        return None
    if first != f"{stem}{start:x}" or last != f"{stem}{start + n - 1:x}":
        return None
    return start


# -- claim ------------------------------------------------------------------------------


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


def claim_call(
    ks: Keyspace, queue: str, count: int, lease_ms: int, token: str, promote: int
) -> Call:
    """The ``claim`` script's call (its reply: :func:`claimed_ids`): it leases up to ``count``
    jobs within the queue's rate limit (:mod:`echomq_core.control.rates`); their rows are read by
    :func:`leased` (or :func:`claim_ahead`) in the next round trip."""
    return Call.lua("claim", ks.claim_keys(queue), [count, lease_ms, token, promote])


def claimed_ids(reply: Sequence[Any]) -> tuple[float, list[str]]:
    """What a ``claim`` call replied: the seconds until the rate window opens (0.0: it is
    open), and the ids leased, in claim order."""
    return int(reply[0]) / 1000, [i.decode() if type(i) is bytes else _s(i) for i in reply[1:]]


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
    row read by the ``rows`` script in one round trip; a row without ``run`` (written before
    it existed) has its separate fields read in a second one."""
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
    old = [i for i, row in enumerate(rows) if row[2] is None and row[0] is not None]
    if old:
        keys = [base + names[i] for i in old]
        (extra,) = yield [Call.lua("rows", keys, OLD_FIELDS)]
        for i, fields in zip(old, extra, strict=True):
            rows[i] = [rows[i][0], rows[i][1], _packed(rows[i][1] is not None, fields), rows[i][3]]
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
        _decode(job, payload, ser)
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


def _packed(child: bool, fields: Sequence[Any]) -> str:
    """A ``run`` value made from a row's :data:`OLD_FIELDS` (a row written before it)."""
    max_attempts, attempts, stalls, limit, up, policy, gate, parent_queue = (
        "" if v is None else _s(v) for v in fields
    )
    head = f"{max_attempts or 1} {attempts or 0} {stalls or 0} {limit or '-'} -"
    if not child:
        return head
    if not up:
        up = f"{policy or FAIL_PARENT} {'0' if not gate else '1'} {parent_queue}"
    return f"{head} {up}"


def _decode(job: Job, payload: Any, ser: Serializer) -> None:
    if payload is None:
        job.decode_error = "job row is missing (deleted while pending?)"
    else:
        try:
            job.payload = ser.loads(payload)
        except Exception as exc:  # any decoder error is the payload's fault
            job.decode_error = f"payload cannot be decoded: {type(exc).__name__}: {exc}"


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
    _decode(job, payload, ser)
    return job


def wait_for_work(ks: Keyspace, queues: Sequence[str], timeout: float) -> Op[bool]:
    """Block until one of ``queues`` sets its wake-up hint, or ``timeout`` seconds pass (one
    BZPOPMIN; the keys must share a Cluster slot). True when woken: jobs may be claimable."""
    return (yield from wait_for_hint([ks.wake(q) for q in queues], timeout))


def wait_for_hint(keys: Sequence[str], timeout: float) -> Op[bool]:
    """One BZPOPMIN on wake-up hint keys (``wake`` or ``flow:outbox:wake``; they must share a
    Cluster slot) for at most ``timeout`` seconds. True when a hint was popped."""
    seconds = max(0.001, round(timeout, 3))  # 0 would block for ever
    (reply,) = yield [Call.cmd("BZPOPMIN", *keys, seconds)]
    return reply is not None


# -- complete / fail --------------------------------------------------------------------


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


# -- maintenance (the Pump's other duties) ----------------------------------------------


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


# -- reads ------------------------------------------------------------------------------


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
        decode(split_done(row["done"])[1] if "done" in row else row.get("result")),
        _s(row["error"]) if "error" in row else None,
        parent,
        _int(row["total"]) if "total" in row else None,
        _int(row.get("stalls")),
        int(float(score)) if score and where in ("completed", "dead") else None,
        _s(row["traceback"]) if "traceback" in row else None,
    )


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
