"""A step on a server at ``maxmemory`` (``noeviction``) is written whole or refused whole, on
standalone and on a Cluster.

Before, ``complete.lua`` and the minute's ``tally.lua`` went in one pipeline: a cross-queue
child's completion ran in full (its first write, a ``ZREM``, is not refused on a full server)
and the tally's ``HSET`` was refused, so the step raised :class:`~echomq_core.ServerFull`
("nothing written") after completing the jobs - the retry met lost leases, the
``job_completed`` hooks never fired, and memory kept climbing past ``maxmemory`` while full.
Every script now declares its flags (``#!lua``): a full server refuses one that may grow
memory before it runs, the tally is written inside the batch's own script, and a step of
several calls cut between them raises :class:`~echomq_core.PartlyWritten`, saying what it
wrote. The full state is set by the tests (``maxmemory`` measured against what a batch
grows), never waited for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from echomq_core import Child, EchoMQ, Job, PartlyWritten, Pump, Queue, ServerFull, Worker
from echomq_core.flows.retention import sweep
from echomq_core.queues import maintenance
from echomq_core.queues.throughput import read_minutes
from echomq_core.server import EmbeddedServer
from echomq_core.work.routines import drive, record

from ..clusterkit import EmbeddedCluster
from ..conftest import Backend
from ..waiting import eventually

pytestmark = pytest.mark.slow

#: A realistic long flow id: a cross-queue child's signal carries it (and its queue) whole, so
#: a batch's completions grow the server by much more than the batch's own arguments.
PARENT = "JOB-af/etl/warehouse_events/fan_out/" + "2026-12-01T00.00.00/" * 8
#: A long parent queue name (at most 128), carried whole by every signal too.
LONG = "/warehouse-events" * 6


#: The children's own short ids (explicit), so that a batch's arguments stay small.
CHILD = "JOB-c{}"


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """A server (or a 3-master Cluster) of this test's own, unlike the session's shared ones:
    what it holds is only this test's, so its memory moves only with what the test does (no
    other test's keys whose tables a rehash could grow or shrink by some 100 KB meanwhile)."""
    if request.param == "cluster":
        cluster = EmbeddedCluster(3).start()
        try:
            yield Backend("cluster", cluster.url, True, list(cluster.servers), cluster)
        finally:
            cluster.stop()
    else:
        server = EmbeddedServer().start()
        try:
            yield Backend("standalone", server.url, False, [server], server)
        finally:
            server.stop()


@pytest.fixture
def admin(backend: Backend) -> Iterator[dict[str, redis.Redis]]:
    """A client per server node (by URL); every node's maxmemory is lifted again afterwards."""
    nodes = {s.url: redis.Redis.from_url(s.url) for s in backend.servers}
    try:
        yield nodes
    finally:
        for node in nodes.values():
            node.config_set("maxmemory", 0)
            node.close()


def _node(backend: Backend, admin: dict[str, redis.Redis], queue: str) -> redis.Redis:
    """The client of the node that owns ``queue``'s slot (the only one on standalone)."""
    return admin[backend.servers[backend.node_of_queue(queue)].url]


def _used(node: redis.Redis) -> int:
    return int(node.info("memory")["used_memory"])


def _fill_at(node: redis.Redis, limit: int) -> None:
    node.config_set("maxmemory-policy", "noeviction")
    node.config_set("maxmemory", limit)


def _completed(mq: EchoMQ, queue: str) -> int:
    return sum(m.completed for m in mq.perform(read_minutes(mq.keys, queue, 3)))


def _flow(mq: EchoMQ, parents: str, work: str, n: int) -> None:
    """A flow of ``n`` children in ``work`` (explicit short ids) under :data:`PARENT`."""
    children = [Child({"n": i}, queue=work, id=CHILD.format(i)) for i in range(n)]
    ref = mq.add_flow(parents, children, parent_id=PARENT, barrier=True)
    assert len(ref.children) == n


def _limit_halfway(node: redis.Redis, rehearse: Callable[[], object], part: float = 0.5) -> int:
    """Run a rehearsal batch call (of jobs claimed before, as every job of the test) to learn
    how much such a batch grows the server, then set ``maxmemory`` ``part`` of that above what
    it holds: the next batch of that size starts below the limit and ends above it."""
    before = _used(node)
    rehearse()
    grew = _used(node) - before
    # the batch's arguments (short ids, small values) are far less than what it writes: the
    # signals carry the long flow id; half the growth leaves room for the arguments' buffer
    assert grew > 40_000, grew
    limit = _used(node) + int(grew * part)
    _fill_at(node, limit)
    return limit


def _completes(q: Queue, jobs: list[Job]) -> Callable[[], object]:
    def call() -> object:
        assert all(q.complete_many([(j, 1) for j in jobs]))
        return None

    return call


def test_a_cross_queue_batch_is_completed_whole_or_refused_whole(
    backend: Backend, mq: EchoMQ, admin: dict[str, redis.Redis]
) -> None:
    """A batch of cross-queue children that starts below ``maxmemory`` and ends above it is
    written whole, tally included, and reported completed (before: ServerFull, and its retry
    got lost leases). The next batch, on the now full server, is refused before it runs:
    nothing written, its leases intact, and recorded in full once memory is freed."""
    parents, work = "fs-parents" + LONG, "fs-work"
    _flow(mq, parents, work, 1500)
    node = _node(backend, admin, work)
    q = mq.queue(work)
    rehearsal, a, b = q.claim(500), q.claim(500), q.claim(500)
    assert len(a) == len(b) == 500  # all claimed before the server is full
    limit = _limit_halfway(node, _completes(q, rehearsal))

    assert all(q.complete_many([(j, 1) for j in a]))  # written whole: reported so
    assert _used(node) > limit  # the gate: the server is full now
    assert _completed(mq, work) == 1000  # the tally went with the batch
    held = q.stats()
    with pytest.raises(ServerFull) as refused:
        q.complete_many([(j, 1) for j in b])
    assert not isinstance(refused.value, PartlyWritten)  # one call: refused whole
    assert q.stats() == held and held["active"] == 500  # nothing written, leases intact
    assert _completed(mq, work) == 1000

    node.config_set("maxmemory", 0)  # memory freed
    assert all(q.complete_many([(j, 1) for j in b]))  # no lost lease: it was not written
    assert _completed(mq, work) == 1500
    assert q.stats()["completed"] == 1500 and q.stats()["outbox"] == 1500


def test_a_bulk_completion_cut_between_its_calls_says_what_it_wrote(
    backend: Backend, mq: EchoMQ, admin: dict[str, redis.Redis]
) -> None:
    """1,000 completions are two script calls of 500 in one round trip: one fills the server,
    the other is refused. PartlyWritten (a ServerFull) names the 500 written, with
    their statuses, and the 500 refused, whose leases are intact and which complete once
    memory is freed (before: a bare ServerFull, and the written half came back as lost
    leases)."""
    parents, work = "fs-cut-parents" + LONG, "fs-cut-work"
    _flow(mq, parents, work, 1500)
    node = _node(backend, admin, work)
    q = mq.queue(work)
    rehearsal, jobs = q.claim(500), q.claim(1000)
    assert len(jobs) == 1000
    _limit_halfway(node, _completes(q, rehearsal))
    pairs = [(j, 1) for j in jobs]
    with pytest.raises(PartlyWritten) as cut:
        q.complete_many(pairs)
    part = cut.value
    assert isinstance(part, ServerFull)
    # one call of the two was written, whole (which one: the first may be refused for the
    # second's arguments still buffered, the second for what the first wrote)
    halves = [[j.id for j in jobs[:500]], [j.id for j in jobs[500:]]]
    written, left = [j.id for j, _ in part.written], [j.id for j, _ in part.refused]
    assert [written, left] in (halves, halves[::-1])
    assert part.settled.statuses == [1] * 500
    assert q.stats()["active"] == 500 and _completed(mq, work) == 1000

    node.config_set("maxmemory", 0)
    assert all(q.complete_many([(j, 1) for j, _ in part.refused]))
    assert q.stats()["completed"] == 1500 and _completed(mq, work) == 1500


def test_a_bulk_failure_cut_between_its_calls_says_what_it_wrote(
    backend: Backend, mq: EchoMQ, admin: dict[str, redis.Redis]
) -> None:
    """The same for 501 failed attempts that bury their jobs (each dead child's row gets its
    error and history, its flow a signal carrying the long flow id), two calls of 500 and 1
    in one round trip: one is written, the other refused (which one: the 500's arguments
    wait in a buffer that counts as memory, so the first could be refused and the second
    written; as measured, the first is written and fills the server). PartlyWritten says
    which, with the written call's statuses; the tally has what was written, and the refused
    part fails once freed."""
    parents, work = "fs-f-parents" + LONG, "fs-f-work"
    _flow(mq, parents, work, 1500)
    node = _node(backend, admin, work)
    q = mq.queue(work)
    rehearsal, jobs = q.claim(500), q.claim(501)
    assert len(jobs) == 501
    error = "RuntimeError: not there yet"

    def rehearse() -> None:
        assert q.fail_many([(j, error, False) for j in rehearsal]) == [2] * 500

    _limit_halfway(node, rehearse)
    with pytest.raises(PartlyWritten) as cut:
        q.fail_many([(j, error, False) for j in jobs])
    part = cut.value
    calls = [[j.id for j in jobs[:500]], [jobs[500].id]]
    written, left = [r[0].id for r in part.written], [r[0].id for r in part.refused]
    assert [written, left] in (calls, calls[::-1])
    assert part.settled.statuses == [2] * len(written)
    found = mq.perform(read_minutes(mq.keys, work, 3))
    assert sum(m.failed for m in found) == 500 + len(written)  # the rehearsal's too
    assert sum(m.deaths for m in found) == 500 + len(written)
    assert q.stats()["active"] == len(left) and q.stats()["dead"] == 500 + len(written)

    node.config_set("maxmemory", 0)
    assert q.fail_many([(r[0], error, False) for r in part.refused]) == [2] * len(left)
    assert q.stats()["dead"] == 1001


def test_a_worker_records_the_written_part_of_a_cut_batch_and_keeps_the_rest(
    backend: Backend, mq: EchoMQ, admin: dict[str, redis.Redis]
) -> None:
    """A worker's batch call of 1,000 results cut by a full server (results pile up past 500
    while the flusher is behind): the 500 written are counted and get their hooks, only the
    500 refused are kept, and those complete once memory is freed - none is re-sent and met
    as a lost lease (before: all 1,000 were kept, no hook fired, and 500 of them came back
    as lost leases)."""
    parents, work = "fs-r-parents" + LONG, "fs-r-work"
    _flow(mq, parents, work, 1500)
    node = _node(backend, admin, work)
    hooks = _Hooks()
    # not started: its recording routine is driven here, with its own hand, lock and counts
    worker = Worker(mq, {work: lambda job: 1}, hooks=hooks, pump=False)
    queue = worker.queues[work]
    rehearsal, jobs = queue.claim(500), queue.claim(1000)
    assert len(jobs) == 1000
    for job in jobs:
        worker._hand.inflight[(work, job.id)] = job
    _limit_halfway(node, _completes(queue, rehearsal))
    done = queue.encode_results([(j, 1) for j in jobs])
    routine = record(worker._loop, queue, done, [])
    drive(routine, mq.perform)
    kept = [job for job, _ in worker._hand.results]
    assert len(hooks.completed) == 500 and worker.completed == 500
    assert len(kept) == 500 and not {j.id for j in kept} & set(hooks.completed)
    assert {j.id for j in kept} | set(hooks.completed) == {j.id for j in jobs}
    assert len(worker._hand.inflight) == 500  # the kept ones stay in hand

    node.config_set("maxmemory", 0)
    assert all(queue.complete_many([(j, 1) for j in kept]))
    assert queue.stats()["completed"] == 1500


class _Hooks:
    """Counts ``job_completed`` per job id (the worker fires it from its own threads)."""

    def __init__(self) -> None:
        self.completed: dict[str, int] = {}
        self.lock = threading.Lock()

    def job_completed(self, *, job: Job, result: bytes) -> None:
        with self.lock:
            self.completed[job.id] = self.completed.get(job.id, 0) + 1


class _Sampler(threading.Thread):
    """Samples the node's ``used_memory`` as fast as it answers, until stopped: the most it
    held while full."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.stop = threading.Event()
        self.peak = 0
        self.samples = 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, _used(self.client))
            self.samples += 1


def test_workers_on_a_full_server_lose_no_completion_and_stay_within_the_limit(
    backend: Backend, mq: EchoMQ, admin: dict[str, redis.Redis], caplog: pytest.LogCaptureFixture
) -> None:
    """Two workers complete 8,000 cross-queue children into a server given 300 KB of room once
    they run, which fills up early (no Pump: the outbox grows). While full, their completions
    are refused whole and kept, claims are refused, heartbeats still run; memory stays within
    1 % of ``maxmemory``. Freed, every job completes: one ``job_completed`` hook per job, the
    server's completed count and the minute tallies all 8,000, no lease lost, and the flow is
    released with every child counted once."""
    n = 8000
    parents, work = "fs-w-parents", "fs-w-work"
    _flow(mq, parents, work, n)
    node = _node(backend, admin, work)
    # 10 MB of other data (not the jobs' payloads: the rows a claim reads while full are a
    # reply buffer, memory too) make the limit a realistic size beside what is not data (each
    # connection's buffers, some KB): 1 % of it is about 100 KB
    node.set("{fs-w-work}ballast", b"x" * 10_000_000)
    url = backend.servers[backend.node_of_queue(work)].url
    hooks = _Hooks()
    caplog.set_level(logging.INFO, logger="echomq_core")
    go = threading.Event()
    running: set[str] = set()

    def handle(job: Job) -> str:
        running.add(job.id)
        go.wait(60)  # the first ones wait here until the limit is set
        return "r" * 20

    workers = [
        Worker(mq, {work: handle}, hooks=hooks, pump=False, concurrency=4, lease=60.0,
               max_batch=100)
        for _ in range(2)
    ]  # fmt: skip
    sampler = _Sampler(url)
    for w in workers:
        w.start()
    try:
        # the limit is set once the workers run (their connections hold memory too)
        eventually(lambda: len(running) == 8, 30, "eight handlers running")
        # the least the node holds over a second while the handlers wait: a single reading
        # can hold transient buffers (claims' replies), and under load that room outlasted the
        # jobs' growth (every job completed before the server stayed full)
        quiet = time.monotonic() + 1.0
        floor = _used(node)
        while time.monotonic() < quiet:
            floor = min(floor, _used(node))
        limit = floor + 300_000  # far less than the 8,000 signals and leases need
        _fill_at(node, limit)
        sampler.start()
        go.set()
        eventually(lambda: _used(node) >= limit, 60, "the server full")

        def refused() -> int:  # claims or completions (kept), whichever met the limit
            return sum("maxmemory" in r.getMessage() for r in caplog.records)

        eventually(lambda: refused() >= 1, 60, "calls refused while full")
        # full for a while: the workers keep retrying what was refused, the sampler watches
        seen = sampler.samples
        eventually(lambda: sampler.samples >= seen + 300, 60, "300 samples while full")
        # how many completions landed before it filled is the machine's timing (beside four
        # CPU hogs the workers' 898 leases alone filled it, before the first completion): what
        # holds is that the full server held work back, which lands once it is freed
        full = mq.queue(work).stats()
        assert full["completed"] < n, full
        sampler.stop.set()
        sampler.join()
        node.config_set("maxmemory", 0)  # memory freed
        eventually(lambda: mq.queue(work).stats()["completed"] == n, 120, mq.queue(work).stats)
    finally:
        go.set()
        sampler.stop.set()
        for w in workers:
            w.stop()
    assert sampler.samples > 10
    assert sampler.peak <= limit * 1.01, (sampler.peak, limit, sampler.peak / limit)
    assert len(hooks.completed) == n and set(hooks.completed.values()) == {1}
    assert _completed(mq, work) == n
    assert not [r.getMessage() for r in caplog.records if "lease was gone" in r.getMessage()]
    pump = Pump(mq, [parents, work], sweep_every=None)
    while pump.tick().delivered:
        pass
    snap = mq.snapshot(parents, PARENT)
    assert (snap.parent_state, snap.processed, snap.total) == ("released", n, n)


@pytest.mark.onlycluster
def test_a_recovery_pass_reports_what_it_did_where_one_node_is_full(
    backend: Backend, mq: EchoMQ, admin: dict[str, redis.Redis]
) -> None:
    """The Pump's recovery pass sends one call per queue in one step: with one queue's node
    full, the other queue's expired leases are recovered (buried here: ``max_stalls`` 0) and
    reported, with the jobs buried for their hooks; the full node's queue is left as it was
    for the next pass, which recovers it once memory is freed (before: the pass raised
    ServerFull and the jobs it had buried were never reported)."""
    a, b = backend.queues_on_distinct_nodes(2, stem="fs-rec")
    deadlines = []
    for name in (a, b):
        q = mq.queue(name)
        q.add_bulk([{"n": i} for i in range(50)])
        assert len(q.claim(50, lease=0.01)) == 50
        node = _node(backend, admin, name)
        deadlines.append((node, max(s for _, s in node.zrange(mq.keys.active(name), 0, -1,
                                                               withscores=True))))  # fmt: skip

    def expired() -> bool:  # by the servers' clocks, which stamp the leases
        return all(int(n.time()[0]) * 1000 + int(n.time()[1]) // 1000 > d for n, d in deadlines)

    eventually(expired, 10, "the leases expired")
    _fill_at(_node(backend, admin, b), 1)  # b's node full: every write refused
    recovered, dead = mq.perform(maintenance.recover(mq.keys, [a, b], 100, 0, mq.serializer))
    assert recovered == 0  # every one buried (stalled once, max_stalls 0), none re-queued
    assert {j.queue for j, _ in dead} == {a} and len(dead) == 50
    assert mq.queue(a).stats()["dead"] == 50
    assert mq.queue(b).stats()["active"] == 50  # refused: as it was
    with pytest.raises(ServerFull):  # a pass whose every call is refused says so
        mq.perform(maintenance.recover(mq.keys, [b], 100, 0, mq.serializer))
    _node(backend, admin, b).config_set("maxmemory", 0)
    recovered, dead = mq.perform(maintenance.recover(mq.keys, [a, b], 100, 0, mq.serializer))
    assert recovered == 0 and {j.queue for j, _ in dead} == {b} and len(dead) == 50


def test_what_only_frees_memory_still_runs_on_a_full_server(
    backend: Backend, mq: EchoMQ, admin: dict[str, redis.Redis]
) -> None:
    """On a server refusing every write that may grow memory (``maxmemory`` 1): heartbeats
    extend leases (so no job runs twice while full), a release gives jobs back, and the
    retention sweep forgets finished jobs and frees their memory - how a full server is
    freed. A claim is refused (before: the heartbeat and the sweep were refused, while a
    claim, whose first write frees memory, ran and grew it)."""
    name = "fs-free"
    q = mq.queue(name)
    q.add_bulk([{"n": i, "path": PARENT} for i in range(3000)])
    done = q.claim(2000)
    assert all(q.complete_many([(j, {"rows": j.payload["n"]}) for j in done]))
    held = q.claim(100)
    mq.set_retention(name, completed_count=0)
    node = _node(backend, admin, name)
    _fill_at(node, 1)

    with pytest.raises(ServerFull):
        q.claim(10)
    assert all(q.heartbeat(held, lease=120.0))
    assert all(q.release(held[:50]))
    before = _used(node)
    swept = mq.perform(sweep(mq.keys, [name], "pump-fs", lease_ms=5000, limit=5000))
    assert swept.swept == 2000  # the completed entries, their rows with them
    assert q.stats()["completed"] == 0
    assert _used(node) < before - 200_000, (before, _used(node))  # the rows' memory is free
    node.config_set("maxmemory", 0)
    assert all(q.complete_many([(j, 1) for j in held[50:]]))  # leases kept while full
