"""Flows that grow: a running child spawns siblings under its own parent (``job.spawn``).

The plan is not always known when a flow is added (a crawl, a paginated API, a directory walk):
a child discovers more work. ``job.spawn([Child(...), ...])`` inside a handler adds leaf
children to the job's parent, in two steps, the first on the parent's slot:

1. ``spawn`` (lua/spawn.lua) records the new ids in the parent's explicit record and grows its
   counter and ``total`` by the number recorded now - refused, nothing written, when the flow is
   no longer held (released, failed, cancelled), past :data:`MAX_FLOW` children, or into a
   queue a capped flow has no share of;
2. ``land`` (the add's own script) lands them on their queues' slots, claimable, with the
   parent fields and policy token in the row, through the flow's gate when it has a cap.

The counter grows before any spawned child exists, and the spawner itself is still unsettled
(its handler is running), so the counter cannot reach 0 in between: a release is never
premature. A spawned child in another queue than its parent's is a cross-queue child like any
other: ``land`` writes the parent's queue into its row, so its completion goes through its own
queue's outbox and the Pump (every script stays single-slot; the counter, on the parent's slot,
was raised in step 1, so the signal always finds it).

Ids derive from the spawner's: ``<spawner id>.s<i>``, i counting across the spawn calls of one
run of the handler. A handler that runs again (lease lost, worker SIGKILLed mid-spawn) and
spawns the same children gets the same ids: step 1 counts none of them twice, step 2 lands
only those missing. Explicit ids are refused: a re-run must reproduce the ids, and a derived id
cannot collide with a sibling's. Spawned children are recorded like children with ids of their
own, so cancel, repair, parking and the expiry reach them; their deaths count against the
flow's success threshold (its allowance stays the count computed when the flow was added).
A child spawned into a sharded queue goes to its id's shard, as an add places it. Only leaves
are spawned (no sub-flows).

A job may also grow children of its OWN (``job.spawn(children, own=True)``, ids
``<spawner id>.k<i>``): it becomes an inner node of its flow while its handler runs (its row
gets the counter, ``total`` and the explicit record, and state 'active', on its own slot, under
its lease), and when the handler returns it does not complete: lua/await.lua ends the run and
the job waits for them as their parent - held, or released at once if they all settled while it
ran. Released, it is claimed again and its handler runs a second time with ``job.resumed``
True, reading them with ``job.children_values()``: its result is computed by the handler from
its children's values, as every worker-run parent's is - not by a callback, which a process
restart would lose, and not by a fixed merge, which cannot know what the job's result is
(a count, a page, a merged file). A child that dies under fail-parent fails it (at its return if
it is still running, else at once), with its own policy toward its parent; ignored deaths are
counted. Its first run's return value is not recorded. Own children have no cap and no
threshold; cancel, repair and the expiry reach them as they reach an inner node's. A job not in
a flow cannot (its row would be deleted with its completion, and its children with nothing).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..checks import text as _s
from ..errors import InvalidArgument
from ..models import Child, Job, ParentRef
from ..wire.calls import Call, Op, chunks
from ..wire.keyspace import MAX_ID_LENGTH, Keyspace, check_job_id
from . import reads as flows
from . import sharding
from .add import land_records
from .plan import plan

#: How many children one flow may have in all, those it was added with and every spawn's.
MAX_FLOW = 1_000_000
#: How many children one spawn call may add.
MAX_SPAWN = 10_000


def stem_of(job: Job, own: bool) -> str:
    """The stem of the ids a run of ``job`` spawns: ``<id>.k`` its own children, ``<id>.s``
    siblings, ``<id>.r`` siblings spawned by its run as a parent (``job.resumed``: a first run
    may have spawned ``.s`` ids of its own, which a second run's must not meet)."""
    if own:
        return f"{job.id}.k"
    return f"{job.id}.r" if job.resumed else f"{job.id}.s"


def plan_spawn(
    job: Job,
    children: Iterable[Child],
    *,
    dumps: Any,
    max_payload: int,
    start: int,
    own: bool = False,
) -> list[Any]:
    """Validate the spawned children (as an add validates its leaves) and give each its id
    ``<spawner>.s<start + i>`` (``own``: ``<spawner>.k<start + i>``), its queue (default: the
    spawner's), payload and options. ``children``: any iterable of :class:`Child` (a
    generator is read once, at most :data:`MAX_SPAWN` + 1 of it); none is a no-op (``[]``:
    nothing to count or land). :class:`InvalidArgument` for a job not in a flow, something
    that is not an iterable of ``Child``, explicit ids, sub-flows, too many, own children
    asked for by a resumed run."""
    if job.parent is None:
        what = "children of its own" if own else "siblings under"
        raise InvalidArgument(
            f"job {job.id} is not in a flow: it has no parent to spawn {what} (add a flow instead)"
        )
    if isinstance(children, Child | str | bytes | Mapping) or not isinstance(children, Iterable):
        raise InvalidArgument(
            f"job {job.id}: spawn takes an iterable of Child (a list, a generator), got "
            f"{type(children).__name__}"
        )
    if not isinstance(children, list | tuple):  # read once; a bound on what is read
        children = list(itertools.islice(children, MAX_SPAWN + 1))
    if not children:
        # nothing found (a page without links, an empty directory): nothing to count, and the
        # job goes on as if it had not called - with own=True it completes as a plain job
        return []
    if own and job.resumed:
        raise InvalidArgument(
            f"job {job.id} runs as the parent of its own children (they have settled): "
            "own children are spawned by its first run"
        )
    if len(children) > MAX_SPAWN:
        raise InvalidArgument(
            f"job {job.id}: more than {MAX_SPAWN} children in one spawn "
            f"({len(children)} given or read); at most {MAX_SPAWN} a call"
        )
    for i, spec in enumerate(children):
        if isinstance(spec, Child) and (spec.id is not None or spec.children):
            what = "an id of its own" if spec.id is not None else "children"
            raise InvalidArgument(
                f"job {job.id}: spawned child {i} has {what}; spawned children are leaves with "
                "ids derived from the spawner's (a re-run of the handler derives the same)"
            )
    # plan() checks each child as an add does (types, policy, attempts, timeout, payload size,
    # priority); its root is a stand-in for the spawner, whose queue is the default queue
    root = plan(
        job.queue,
        job.id,
        b"",
        children,
        default_attempts=job.max_attempts,
        dumps=dumps,
        max_payload=max_payload,
    )
    stem = stem_of(job, own)
    for i, node in enumerate(root.children):
        node.id = f"{stem}{start + i}"
        if len(node.id) > MAX_ID_LENGTH:
            check_job_id(node.id)  # raises InvalidJobId, naming the id
    return list(root.children)


def spawn(
    ks: Keyspace,
    job: Job,
    nodes: list[Any],
    bound: int = MAX_FLOW,
    shard_cache: dict[str, sharding.Shards] | None = None,
    own: bool = False,
) -> Op[list[str]]:
    """Count the children on the parent's slot, land them, read the parent's state (see the
    module doc). Returns their ids. Three round trips (four when the flow has a cap: its gates'
    shares are read; one more when the flow was cancelled meanwhile; one more the first time a
    process spawns into a queue: its shard count is read, and a child of a sharded queue goes
    to its id's shard, as an add places it). ``bound``: how many children the flow may have.
    ``own``: the children are the spawner's own - it is their parent, counted on its own slot
    under its lease (lua/spawn.lua's own mode)."""
    up = ParentRef(job.shard, job.id) if own else job.parent
    assert up is not None
    shards = yield from sharding.resolve(
        ks, {} if shard_cache is None else shard_cache, {n.queue for n in nodes}
    )
    for n in nodes:
        n.queue = sharding.shard_of(shards[n.queue], n.id)
    keys = [ks.job(up.queue, up.id), ks.dependencies(up.queue, up.id)]
    keys.append(ks.explicit(up.queue, up.id))
    if own:
        keys.append(ks.leases(job.shard))
    pairs = [x for n in nodes for x in (n.id, n.queue)]
    stem = stem_of(job, own)
    upto = int(nodes[-1].id[len(stem) :]) + 1
    first: list[Any] = [job.id, bound, job.token if own else "", f"{stem} {upto}"]
    ((flags, cap),) = yield [Call.lua("spawn", keys, [*first, *pairs])]
    queues = list(dict.fromkeys(n.queue for n in nodes))
    shares: dict[str, Any] = {}
    if cap:  # each queue's share of the cap, as the add's split gave it (its gate's cap)
        got = yield [Call.cmd("HGET", ks.gate_keys(q, up.queue, up.id)[1], "cap") for q in queues]
        shares = dict(zip(queues, got, strict=True))
    calls = []
    runs: dict[tuple[Any, ...], list[Any]] = {}
    for n, flag in zip(nodes, flags, strict=True):  # one land per queue and options, in order
        # counted now: no earlier landing of it can have happened, so land's one EXISTS over
        # the batch stands for the per-child reads (a re-run's children are read one by one)
        check = "0" if int(flag) == 1 else "1"
        key = (n.queue, check, n.policy, n.max_attempts, n.timeout_ms, n.priority)
        runs.setdefault(key, []).append(n)
    for (queue, check, policy, attempts, limit, priority), group in runs.items():
        share = shares.get(queue)
        gate = [] if share is None else ks.gate_keys(queue, up.queue, up.id)
        fixed = ks.queue_keys(queue)
        rows = ks.job_prefix(queue)
        up_queue = up.queue if up.queue != queue else ""
        for part in chunks(group):
            argv: list[Any] = [check, up.id, up_queue, policy, attempts]
            argv += ["" if limit is None else limit, priority, "" if share is None else share]
            argv += ("", "")  # no stem: spawned ids derive from the spawner's, not the parent's
            land_records(argv, part, True)
            keys = [*fixed, *(rows + n.id for n in part), ks.fair(queue), *gate]
            calls.append(Call.lua("land", keys, argv))
    yield calls
    # a cancel between the count and the landing walked the recorded ids before their rows
    # existed: read the state after landing, and cancel what just landed if it was (a cancel
    # that comes later finds the rows on its own walk)
    (state,) = yield [Call.cmd("HGET", ks.job(up.queue, up.id), "state")]
    if state is not None and _s(state) == "cancelled":
        late = []
        for queue in queues:
            ids = [n.id for n in nodes if n.queue == queue]
            head = [*ks.queue_keys(queue), *ks.gate_keys(queue, up.queue, up.id)]
            base = ks.job_prefix(queue)
            for part in chunks(ids):
                keys = [*head, *(base + i for i in part)]
                late.append(Call.lua("cancel_children", keys, [up.id, *part]))
        yield late
    return [n.id for n in nodes]


#: What :func:`reconcile` did: how many ids it settled as never landed, and the nodes those
#: settlements released or failed (``(event 'r' | 'f', node queue, node id)``).
Reconciled = tuple[int, list[tuple[str, str, str]]]


def reconcile(ks: Keyspace, jobs: Sequence[Job]) -> Op[Reconciled]:
    """After runs of jobs that ran before (a retry, a lost lease) were recorded - completed, or
    (own children) ended waiting for them: settle as never landed what an earlier run counted
    and never landed beyond what the recorded run spawned (lua/unspawn.lua), so a handler that
    spawns fewer children on its re-run does not leave its flow held for ever. Only jobs in a
    flow that ran before are looked at: one round trip for them all when no earlier run
    counted more (the counting nodes' ``n:<stem>`` marks read), three more when one did (the
    ids' queues, whether their rows exist, the unspawn). Returns how many were settled so, and
    the nodes that settling released or failed (for the lifecycle hooks)."""
    probes: list[tuple[Job, str, str, str, int]] = []  # job, node queue, node id, stem, spawned
    for job in jobs:
        if job.parent is None or not (job.attempts or job.stalls):
            continue
        up = job.parent
        probes.append((job, up.queue, up.id, stem_of(job, False), job.spawned))
        if not job.resumed:
            probes.append((job, job.shard, job.id, stem_of(job, True), job.adopted))
    if not probes:
        return 0, []
    marks = yield [Call.cmd("HGET", ks.job(q, node), "n:" + stem) for _, q, node, stem, _ in probes]
    todo = [
        (job, q, node, [f"{stem}{i}" for i in range(now, int(mark))])
        for (job, q, node, stem, now), mark in zip(probes, marks, strict=True)
        if mark is not None and int(mark) > now
    ]
    if not todo:
        return 0, []
    got = yield [
        Call.cmd("HMGET", ks.explicit(q, node), *part)
        for _, q, node, ids in todo
        for part in chunks(ids)
    ]
    where = iter(got)
    found: list[tuple[Job, str, str, list[str], list[Any]]] = []
    for job, q, node, ids in todo:
        queues: list[Any] = []
        for _ in chunks(ids):
            queues += next(where)
        found.append((job, q, node, ids, queues))
    probe = [
        Call.cmd("EXISTS", ks.job(_s(queue), i))
        for *_, ids, queues in found
        for i, queue in zip(ids, queues, strict=True)
        if queue is not None
    ]
    rows = iter((yield probe) if probe else [])
    calls, nodes = [], []
    for job, q, node, ids, queues in found:
        rowless = [i for i, queue in zip(ids, queues, strict=True) if queue and not next(rows)]
        if rowless:
            keys = [*ks.queue_keys(q), *ks.settle_keys(q, node)]
            calls.append(Call.lua("unspawn", keys, [node, q, job.id, *rowless]))
            nodes.append((q, node))
    if not calls:
        return 0, []
    replies = yield calls
    events = [(_s(r[1]), q, node) for r, (q, node) in zip(replies, nodes, strict=True) if r[1]]
    return sum(int(reply[0]) for reply in replies), events


def await_children(ks: Keyspace, jobs: Sequence[Job]) -> Op[list[Any]]:
    """End the first run of jobs that spawned children of their own (lua/await.lua): each
    waits for them as their parent. One round trip for them all. Per job: 0 its lease was gone
    (nothing written), ``"h"`` held, ``"r"`` released at once, ``"f"`` failed (a child died
    under fail-parent while it ran)."""
    calls = []
    for job in jobs:
        keys = [*ks.queue_keys(job.shard), ks.job(job.shard, job.id)]
        keys += [ks.dependencies(job.shard, job.id), ks.failed(job.shard, job.id)]
        calls.append(Call.lua("await", keys, [job.id, job.token, job.shard]))
    replies = yield calls
    return [_s(r) if isinstance(r, bytes | str) else r for r in replies]


class SyncSpawner:
    """What a threaded :class:`~echomq_core.Worker` gives its jobs as ``spawner``: what
    :meth:`Job.spawn` and :meth:`Job.children_values` call."""

    def __init__(self, client: Any) -> None:
        #: the EchoMQ (typed Any: the client's modules import this one's users, queue.py)
        self.client = client

    def __call__(self, job: Job, children: Iterable[Child], own: bool = False) -> list[str]:
        op = _spawn_op(self.client, job, children, own)
        if op is None:
            return []
        ids: list[str] = self.client.perform(op)
        return _counted(job, ids, own)

    def values(self, job: Job) -> dict[str, Any]:
        client = self.client
        op = flows.children_values(client.keys, job.shard, job.id, client.serializer)
        values: dict[str, Any] = client.perform(op)
        return values


def _spawn_op(client: Any, job: Job, children: Iterable[Child], own: bool) -> Op[list[str]] | None:
    """The spawn's op, its children planned (and refused, if bad) at once, in the caller;
    None for a spawn of nothing (no round trip)."""
    nodes = plan_spawn(
        job, children, dumps=client.encode, max_payload=client.max_payload_bytes,
        start=job.adopted if own else job.spawned, own=own,
    )  # fmt: skip
    if not nodes:
        return None
    return spawn(client.keys, job, nodes, shard_cache=client.shard_cache, own=own)


def _counted(job: Job, ids: list[str], own: bool) -> list[str]:
    """Count the spawned ids on the job only once they are written: a retried call derives
    the same ids."""
    if own:
        job.adopted += len(ids)
    else:
        job.spawned += len(ids)
    return ids


class AsyncSpawner:
    """What an :class:`~echomq_core.AsyncWorker` gives its jobs as ``spawner``: awaitables in
    an async handler (on ``loop``), the values themselves in a sync handler (run in a thread,
    which waits for the loop to do it)."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.loop = client, loop  # an AsyncEchoMQ (typed Any: see SyncSpawner)

    def _run(self, make: Callable[[], Any]) -> Any:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return make()
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result()

    def __call__(self, job: Job, children: Iterable[Child], own: bool = False) -> Any:
        op = _spawn_op(self.client, job, children, own)

        async def go() -> list[str]:
            if op is None:  # a spawn of nothing: still an awaitable in an async handler
                return []
            ids: list[str] = await self.client.connection.perform(op)
            return _counted(job, ids, own)

        return self._run(go)

    def values(self, job: Job) -> Any:
        client = self.client

        async def go() -> dict[str, Any]:
            op = flows.children_values(client.keys, job.shard, job.id, client.serializer)
            got: dict[str, Any] = await client.connection.perform(op)
            return got

        return self._run(go)
