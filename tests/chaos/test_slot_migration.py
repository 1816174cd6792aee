"""A slot migration that lasts well over 5 s, on a real 3-master Cluster (issue 26, item 5).

A reshard moves a slot's keys in batches; until the slot is handed over, the scripts of its
queue that name a key missing from the node they reach get ``TRYAGAIN`` (most do: a result
hash, an empty index), so the queue pauses for the whole migration. Before the fix the router
gave up after 5 s (``cannot reach ...: the Cluster did not serve the call within 5 s
(TRYAGAIN ...)``): results could not be recorded, claims and Pump ticks failed.

* ``test_a_slow_migration_pauses_the_queue_and_loses_nothing``: two in-process workers and a
  Pump run a flow on one queue; once a quarter of it settled, its slot is moved 20 keys a
  batch with a pause between batches (the test sets it from the slot's key count so the move
  lasts :data:`MIGRATION_S` s, and holds the handover until then). Two children wait for a
  gate the test opens only after the handover, so the flow is mid-way for the whole move. No
  worker, Pump or call logs a failure; the flow completes exactly (each child's value once,
  each handler run once, the raw counter 0, the parent run once over every value); the
  longest stretch without a recorded completion is measured and reported.
* ``test_a_short_migration_wait_names_the_migrating_slot``: with ``?migration_wait=1`` in the
  URL, a claim of a queue whose slot is half-moved (held there by the test) fails after about
  1 s with ``ConnectionLost`` naming the slot, its queue and both nodes, for the sync and the
  async client, both when the source still holds some keys (``TRYAGAIN`` from the source:
  the target comes from the router's probe) and when every key is on the target (``ASK``
  then ``TRYAGAIN``); the claim did not run (nothing leased after the handover).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from echomq_core import AsyncEchoMQ, Child, EchoMQ, Job, Pump, Worker
from echomq_core.errors import ConfigurationError, ConnectionLost
from echomq_core.server import EmbeddedServer, _command
from echomq_core.wire.connection import MIGRATION_WAIT, connect, parse_url

from ..clusterkit import EmbeddedCluster
from ..waiting import eventually
from .harness import record

N = 1500  # children of the flow, plus the two gated ones
PAUSE_MS = 5  # per child
MIGRATION_S = 15.0  # how long the test makes the slot move last
BATCH = 20  # keys per MIGRATE, as in the reshard


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    """A Cluster of its own: these tests move slots, and leave them moved."""
    cluster = EmbeddedCluster(3).start()
    yield cluster
    cluster.stop()


def node(server: EmbeddedServer) -> str:
    return f"{server.host}:{server.port}"


def queue_and_target(cluster: EmbeddedCluster, stem: str) -> tuple[str, int, EmbeddedServer]:
    """A queue name of ``stem``, its slot, and another master to move the slot to."""
    queue = f"{stem}-{time.monotonic_ns()}"
    slot = key_slot(f"{{{queue}}}".encode())
    source = cluster.server_for_slot(slot)
    target = next(m for m in cluster.current_masters() if m is not source)
    return queue, slot, target


class Failures(logging.Handler):
    """Every WARNING or worse that echomq_core logs while installed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> Failures:
        logging.getLogger("echomq_core").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("echomq_core").removeHandler(self)


class Recorded:
    """Lifecycle hooks: when each completion was recorded (its call returned)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: list[float] = []

    def job_completed(self, *, job: Job, result: bytes) -> None:
        with self.lock:
            self.times.append(time.monotonic())


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch of [start, end] without an event of ``times``."""
    marks = [start, *sorted(t for t in times if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(marks))


@pytest.mark.slow
def test_a_slow_migration_pauses_the_queue_and_loses_nothing(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    queue, slot, target = queue_and_target(cluster, "busy")
    source = cluster.server_for_slot(slot)
    parent_id = "JOB-af/migrate/busy/0001"  # an Airflow-derived id, slashes included
    gate = threading.Event()
    runs: Counter[str] = Counter()
    parent_runs: list[tuple[int, int]] = []
    lock = threading.Lock()
    mq = EchoMQ(cluster.url, cluster=True, prefix=prefix)

    def handle(job: Job) -> Any:
        with lock:
            runs[job.id] += 1
        payload = job.payload
        if payload.get("parent"):
            values = mq.children_values(job.queue, job.id)
            total = sum(v["sq"] for v in values.values())
            with lock:
                parent_runs.append((len(values), total))
            return {"count": len(values), "sum": total}
        if payload.get("gate") and not gate.wait(120):
            raise RuntimeError("the gate never opened")
        time.sleep(PAUSE_MS / 1000)
        return {"sq": payload["n"] ** 2}

    total = N + 2
    children = [Child({"n": i}, queue=queue) for i in range(N)]
    children += [Child({"n": N + k, "gate": True}, queue=queue) for k in (0, 1)]
    recorded = Recorded()
    clients = [EchoMQ(cluster.url, cluster=True, prefix=prefix) for _ in range(3)]
    workers = [  # hooks: only job_completed (an event a hook object lacks is skipped)
        Worker(c, {queue: handle}, concurrency=4, max_batch=BATCH, lease=30, hooks=recorded)  # type: ignore[arg-type]
        for c in clients[:2]
    ]
    pump = Pump(clients[2], [queue])
    with Failures() as failures:
        try:
            mq.add_flow(queue, children, payload={"parent": True}, parent_id=parent_id)
            for worker in workers:
                worker.start()
            pump.start()
            settled = 0

            def a_quarter() -> bool:
                nonlocal settled
                settled = mq.snapshot(queue, parent_id).settled
                return settled >= N // 4

            eventually(
                a_quarter,
                60,
                lambda: f"{N // 4} settled: only {settled} of {total}",
                every=0.05,
            )

            keys = int(_command(source.host, source.port, "CLUSTER", "COUNTKEYSINSLOT", slot))
            pause = MIGRATION_S / math.ceil(keys / BATCH)
            began = time.monotonic()
            handover: dict[str, float] = {}

            def before_handover() -> None:
                # the test holds the slot half-moved until MIGRATION_S have passed
                time.sleep(max(0.0, began + MIGRATION_S - time.monotonic()))
                handover["at"] = time.monotonic()

            migration = cluster.migrate_slot(
                slot, target, batch=BATCH, pause=pause, before_handover=before_handover
            )
            moved = time.monotonic()
            assert cluster.server_for_slot(slot) is target
            assert migration.seconds >= MIGRATION_S  # three times the old 5 s bound
            gate.set()
            eventually(
                lambda: mq.get_job(queue, parent_id).state == "completed",
                60,
                lambda: f"the parent's completion: {mq.snapshot(queue, parent_id)}",
                every=0.05,
            )
            ended = time.monotonic()
        finally:
            gate.set()
            pump.stop()
            for worker in workers:
                worker.stop()
        assert not failures.records, "\n".join(r.getMessage() for r in failures.records[:5])

    routers: Counter[str] = Counter()
    for c in clients:
        routers.update(c.connection.stats)
    assert routers["tryagain"] > 0, f"the workers met the migration: {routers}"

    # exactly once: each child's value, each handler run, the parent over every value
    values = mq.children_values(queue, parent_id)
    assert {k: v["sq"] for k, v in values.items()} == {
        f"{parent_id}.{i}": i * i for i in range(total)
    }
    assert mq.ignored_failures(queue, parent_id) == {}
    raw = mq.connection.client.get(mq.keys.dependencies(queue, parent_id))
    assert raw == b"0", f"raw counter {raw!r}: below 0 would be a double count"
    squares = sum(i * i for i in range(total))
    parent = mq.get_job(queue, parent_id)
    assert (parent.state, parent.result) == ("completed", {"count": total, "sum": squares})
    assert parent_runs == [(total, squares)]
    assert set(runs) == {parent_id, *values} and set(runs.values()) == {1}, "each ran once"
    stats = mq.queue(queue).stats()
    assert (stats["pending"], stats["active"], stats["dead"], stats["outbox"]) == (0, 0, 0, 0)

    paused = longest_gap(recorded.times, began, moved)
    resumed = min(t for t in recorded.times if t > handover["at"]) - handover["at"]
    for c in [*clients, mq]:
        c.close()
    record(
        {
            "scenario": "slot migration of a busy queue lasting well over 5 s, 3 masters",
            "parameters": f"{total}-child same-queue flow ({PAUSE_MS} ms handlers, 2 gated until "
            f"the handover), 2 in-process workers x 4 threads (lease 30 s) + a Pump; the slot "
            f"moved from {N // 4} settled: {migration.keys} keys in {migration.batches} batches "
            f"of {BATCH}, {pause * 1000:.0f} ms apart, handover held until {MIGRATION_S:g} s; "
            f"migration_wait {MIGRATION_WAIT:g} s (the default)",
            "faults": f"migration {migration.seconds:.1f} s; longest stretch without a recorded "
            f"completion {paused:.1f} s; first completion {resumed:.2f} s after the handover; "
            f"failed calls 0; the routers met {dict(sorted(routers.items()))}",
            "lost": 0,
            "double_counted": 0,
            "poisoned": 0,
            "pause_s": round(paused, 1),
            "wall_s": round(ended - began, 1),
        }
    )


def test_a_short_migration_wait_names_the_migrating_slot(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    queue, slot, target = queue_and_target(cluster, "short")
    source = cluster.server_for_slot(slot)
    url = cluster.url + "?migration_wait=1"
    mq = EchoMQ(url, cluster=True, prefix=prefix)
    assert mq.connection.migration_wait == 1.0
    q = mq.queue(queue)
    q.add_bulk([{"n": i} for i in range(100)])
    some_moved, all_moved = threading.Event(), threading.Event()
    go_on, finish = threading.Event(), threading.Event()

    def on_batch(batches: int, keys: int) -> None:
        if batches == 1:  # one key moved: the source still holds the others
            some_moved.set()
            assert go_on.wait(60)

    def before_handover() -> None:
        all_moved.set()
        assert finish.wait(60)

    mover = threading.Thread(
        target=cluster.migrate_slot,
        args=(slot, target),
        kwargs={"batch": 1, "on_batch": on_batch, "before_handover": before_handover},
        daemon=True,
    )
    expected = (
        f"slot {slot} of queue {queue!r} is migrating from {node(source)} to {node(target)}: "
        f"TRYAGAIN for 1 s (migration_wait)"
    )

    async def claim_async() -> None:  # the op the asyncio worker drives
        amq = AsyncEchoMQ(url, cluster=True, prefix=prefix)
        try:
            await amq.connection.perform(q.claim_op(10))
        finally:
            await amq.close()

    def refused(claim: Any) -> str:
        began = time.monotonic()
        with pytest.raises(ConnectionLost) as caught:
            claim()
        waited = time.monotonic() - began
        assert 1.0 <= waited < 4.0, f"waited {waited:.1f} s for a 1 s migration_wait"
        return str(caught.value)

    try:
        mover.start()
        assert some_moved.wait(30)  # some keys moved, some not: TRYAGAIN from the source
        assert expected in refused(lambda: q.claim(10))
        assert expected in refused(lambda: asyncio.run(claim_async()))
        go_on.set()
        assert all_moved.wait(30)  # every key on the target: ASK, then TRYAGAIN from it
        assert expected in refused(lambda: q.claim(10))
        assert expected in refused(lambda: asyncio.run(claim_async()))
    finally:
        go_on.set()
        finish.set()
        mover.join(30)
    assert cluster.server_for_slot(slot) is target
    stats = q.stats()
    assert (stats["pending"], stats["active"]) == (100, 0), "no refused claim ran"
    assert len(q.claim(100)) == 100  # after the handover the queue serves at once
    mq.close()


def test_migration_wait_is_checked_and_the_argument_wins(cluster: EmbeddedCluster) -> None:
    assert parse_url("redis://h:1?migration_wait=2.5").migration_wait == 2.5
    assert parse_url("redis://h:1").migration_wait is None
    assert "migration_wait" not in parse_url("redis://h:1?migration_wait=2&cluster=1").url
    for bad in ("abc", "-1", "inf", "nan", "86401"):
        with pytest.raises(ConfigurationError, match="migration_wait"):
            parse_url(f"redis://h:1?migration_wait={bad}")
    for value in (-0.5, "x", True, float("inf")):
        with pytest.raises(ConfigurationError, match="migration_wait"):
            connect("redis://127.0.0.1:1", migration_wait=value)  # type: ignore[arg-type]
    assert connect("redis://127.0.0.1:1").migration_wait == MIGRATION_WAIT == 60.0
    conn = connect(cluster.url + "?migration_wait=5", cluster=True, migration_wait=0)
    try:
        assert conn.migration_wait == 0.0  # the argument wins over the URL, as cluster= does
    finally:
        conn.close()
