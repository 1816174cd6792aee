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
are spawned (no sub-flows), and only siblings (a job growing children of its own is not
offered).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import sharding
from .calls import Call, Op
from .checks import text as _s
from .errors import InvalidArgument
from .flows import plan
from .keyspace import MAX_ID_LENGTH, Keyspace, check_job_id
from .models import Child, Job
from .ops import chunks

if TYPE_CHECKING:
    from .client import AsyncEchoMQ, EchoMQ

#: How many children one flow may have in all, those it was added with and every spawn's.
MAX_FLOW = 1_000_000
#: How many children one spawn call may add.
MAX_SPAWN = 10_000


def plan_spawn(
    job: Job, children: Sequence[Child], *, dumps: Any, max_payload: int, start: int
) -> list[Any]:
    """Validate the spawned children (as an add validates its leaves) and give each its id
    ``<spawner>.s<start + i>``, its queue (default: the spawner's), payload and options.
    :class:`InvalidArgument` for a job not in a flow, explicit ids, sub-flows, too many."""
    if job.parent is None:
        raise InvalidArgument(
            f"job {job.id} is not in a flow: it has no parent to spawn siblings under "
            "(add a flow instead)"
        )
    if not isinstance(children, list | tuple) or not children:
        raise InvalidArgument(f"job {job.id}: spawn takes a non-empty list of Child")
    if len(children) > MAX_SPAWN:
        raise InvalidArgument(
            f"job {job.id}: {len(children)} children in one spawn; at most {MAX_SPAWN} a call"
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
        list(children),
        default_attempts=job.max_attempts,
        dumps=dumps,
        max_payload=max_payload,
    )
    for i, node in enumerate(root.children):
        node.id = f"{job.id}.s{start + i}"
        if len(node.id) > MAX_ID_LENGTH:
            check_job_id(node.id)  # raises InvalidJobId, naming the id
    return root.children


def spawn(
    ks: Keyspace,
    job: Job,
    nodes: list[Any],
    bound: int = MAX_FLOW,
    shard_cache: dict[str, sharding.Shards] | None = None,
) -> Op[list[str]]:
    """Count the children on the parent's slot, land them, read the parent's state (see the
    module doc). Returns their ids. Three round trips (four when the flow has a cap: its gates'
    shares are read; one more when the flow was cancelled meanwhile; one more the first time a
    process spawns into a queue: its shard count is read, and a child of a sharded queue goes
    to its id's shard, as an add places it). ``bound``: how many children the flow may have."""
    up = job.parent
    assert up is not None
    shards = yield from sharding.resolve(
        ks, {} if shard_cache is None else shard_cache, {n.queue for n in nodes}
    )
    for n in nodes:
        n.queue = sharding.shard_of(shards[n.queue], n.id)
    keys = [ks.job(up.queue, up.id), ks.dependencies(up.queue, up.id)]
    keys.append(ks.explicit(up.queue, up.id))
    pairs = [x for n in nodes for x in (n.id, n.queue)]
    ((flags, cap),) = yield [Call.lua("spawn", keys, [job.id, bound, *pairs])]
    queues = list(dict.fromkeys(n.queue for n in nodes))
    shares: dict[str, Any] = {}
    if cap:  # each queue's share of the cap, as the add's split gave it (its gate's cap)
        got = yield [
            Call.cmd("HGET", ks.gate_keys(q, up.queue, up.id)[1], "cap") for q in queues
        ]
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
            for n in part:
                argv += [n.id, n.payload]
            keys = [*fixed, *(rows + n.id for n in part), *gate]
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


def sync_spawner(client: EchoMQ) -> Callable[[Job, Sequence[Child]], list[str]]:
    """What a threaded :class:`~echomq_core.Worker` gives its jobs as ``spawner``."""

    def run(job: Job, children: Sequence[Child]) -> list[str]:
        nodes = plan_spawn(
            job, children, dumps=client.encode, max_payload=client.max_payload_bytes,
            start=job.spawned,
        )  # fmt: skip
        ids = client.perform(spawn(client.keys, job, nodes, shard_cache=client.shard_cache))
        job.spawned += len(ids)  # only once it is written: a retried call derives the same ids
        return ids

    return run


def async_spawner(client: AsyncEchoMQ, loop: asyncio.AbstractEventLoop) -> Callable[..., Any]:
    """What an :class:`~echomq_core.AsyncWorker` gives its jobs as ``spawner``: an awaitable
    in an async handler (on ``loop``), the ids themselves in a sync handler (run in a thread,
    which waits for the loop to do it)."""

    def run(job: Job, children: Sequence[Child]) -> Any:
        nodes = plan_spawn(
            job, children, dumps=client.encode, max_payload=client.max_payload_bytes,
            start=job.spawned,
        )  # fmt: skip

        async def go() -> list[str]:
            op = spawn(client.keys, job, nodes, shard_cache=client.shard_cache)
            ids: list[str] = await client.connection.perform(op)
            job.spawned += len(ids)
            return ids

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            return go()
        return asyncio.run_coroutine_threadsafe(go(), loop).result()

    return run
