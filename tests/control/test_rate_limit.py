"""A queue's rate limit (issue 28 item 2): stored with the queue's settings, decided by the claim
script on the queue's slot, honoured by plain claims and by every worker - threads, asyncio and
processes - standalone and on a Cluster.

How starts are measured independently of the script's own state (its TAT): a claim scores each
job in ``active`` at (server time of the claim + lease), and the tests here read that score
back (lease 60 s: no heartbeat has moved it yet), so every start's claim time on the server's
clock is known - to the ms, floored; starts at least T apart stay at least T apart floored, so
no span of the window holds more in ms than in µs - and the starts in every sliding span of the
window are counted from it (:func:`most_in_a_window`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from echomq_core import AsyncEchoMQ, AsyncWorker, EchoMQ, InvalidArgument, Job, RateLimit, Worker
from echomq_core.cli import main
from echomq_core.control.rates import parse_rate
from echomq_core.work.running import RATE_RECHECK

from ..conftest import Backend
from ..flowkit import cmd
from ..waiting import eventually, eventually_async

PROC = str(Path(__file__).parent.parent / "procs" / "rate_proc.py")
LEASE = 60.0


def claimed_at(mq: EchoMQ, job: Job, lease: float = LEASE) -> int:
    """The server's clock (ms) when ``job`` was claimed: its lease deadline less the lease -
    as long as nothing extended the lease since (a worker's heartbeat, or its lease check of a
    job that waited in its buffer: see :func:`unextended`)."""
    score = cmd(mq, "ZSCORE", mq.keys.active(job.queue), job.id)
    return int(float(score)) - int(lease * 1000)


#: The lease of the workers whose handlers read their claim time: no heartbeat (every lease / 3)
#: falls within a test bounded at 60 s.
WORKER_LEASE = 600.0


def unextended(worker: Worker | AsyncWorker) -> None:
    """Switch off ``worker``'s lease check, which extends the lease of a job that waited in its
    buffer for a quarter of a second: its new deadline would no longer tell the claim's time
    (a CI run saw 19 starts in a window of 15 - jobs claimed in the two windows before, during
    a stall, then re-stamped by the check)."""
    worker.recheck = float("inf")


def most_in_a_window(times: list[int], window_ms: int) -> int:
    """The most starts (ms) in any span ``[t, t + window_ms)``, wherever it starts: the sliding
    count a vendor's "N per window" sees (a span that holds the most starts can be moved to
    begin at one of them)."""
    times = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= window_ms:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_most_in_a_window_slides() -> None:
    assert most_in_a_window([], 100) == 0
    assert most_in_a_window([0, 99, 100, 199], 100) == 2
    assert most_in_a_window([10, 20, 150, 160], 100) == 2
    # two fixed windows of 2 each, but 4 in the span that straddles their boundary
    assert most_in_a_window([80, 90, 110, 120], 100) == 4
    assert most_in_a_window([0, 100, 200], 100) == 1


def time_ms(mq: EchoMQ) -> int:
    seconds, micros = cmd(mq, "TIME")
    return int(seconds) * 1000 + int(micros) // 1000


# -- the setting -------------------------------------------------------------------------------


def test_rate_limit_round_trip(mq: EchoMQ) -> None:
    assert mq.rate_limit("api") is None
    mq.set_retention("api", completed_age=60)
    retention = mq.retention("api")
    for given, limit, window, text in [
        ("100/s", 100, 1000, "100/s"),
        ("6000/min", 6000, 60_000, "6000/min"),
        (" 5 / 500ms ", 5, 500, "5/500ms"),
        ("2/10 seconds", 2, 10_000, "2/10s"),
        ("1000/Hour", 1000, 3_600_000, "1000/h"),
        ("3/90s", 3, 90_000, "3/90s"),
        ("7/day", 7, 86_400_000, "7/d"),
    ]:
        mq.set_rate_limit("api", given)
        rate = mq.rate_limit("api")
        assert rate is not None
        assert (rate.limit, rate.window_ms, rate.text, rate.used) == (limit, window, text, 0)
        assert parse_rate(rate) == (limit, window)  # what is read back is taken again
    assert "api" in mq.queues()
    assert mq.retention("api") == retention  # the rate and retention live side by side
    mq.set_retention("api", completed_age=30)
    assert mq.rate_limit("api") is not None
    mq.set_rate_limit("api", "none")
    assert mq.rate_limit("api") is None
    mq.set_rate_limit("api", RateLimit(9, 2000))
    assert str(mq.rate_limit("api")) == "9/2s"
    mq.set_rate_limit("api", None)
    assert mq.rate_limit("api") is None
    assert mq.retention("api")["completed_age"] == 30


def test_a_burst_is_stored_with_the_rate(mq: EchoMQ) -> None:
    mq.set_rate_limit("api", "100/s", burst=20)
    assert cmd(mq, "HGET", mq.keys.config("api"), "rate") == b"100 1000 20"
    rate = mq.rate_limit("api")
    assert rate is not None and (rate.limit, rate.burst, rate.used, rate.ready) == (100, 20, 0, 20)
    assert str(rate) == "100/s burst 20" and rate.text == "100/s" and rate.next_in == 0.0
    mq.set_rate_limit("api", "100/s")  # no burst: 1, stored as before bursts existed
    assert cmd(mq, "HGET", mq.keys.config("api"), "rate") == b"100 1000"
    rate = mq.rate_limit("api")
    assert rate is not None and rate.burst == 1 and str(rate) == "100/s"
    mq.set_rate_limit("api", RateLimit(9, 2000, burst=3))  # a reading brings its burst
    assert str(mq.rate_limit("api")) == "9/2s burst 3"
    mq.set_rate_limit("api", RateLimit(9, 2000, burst=3), burst=1)
    assert str(mq.rate_limit("api")) == "9/2s"


@pytest.mark.parametrize(
    ("rate", "burst", "why"),
    [("10/s", 0, "1.."), ("10/s", -3, "1.."), ("10/s", 1.5, "an int"), ("10/s", "3", "an int"),
     ("10/s", True, "an int"), ("10/s", 10**9 + 1, "1.."), (None, 5, "needs a rate"),
     ("none", 1, "needs a rate"), ("10/s", 2.0, "an int")],
)  # fmt: skip
def test_bad_bursts_are_refused_and_nothing_is_written(
    mq: EchoMQ, rate: Any, burst: Any, why: str
) -> None:
    mq.set_rate_limit("api", "10/s", burst=2)
    before = cmd(mq, "HGETALL", mq.keys.config("api"))
    with pytest.raises(InvalidArgument, match=why):
        mq.set_rate_limit("api", rate, burst=burst)
    assert cmd(mq, "HGETALL", mq.keys.config("api")) == before
    with pytest.raises(InvalidArgument):
        mq.set_rate_limit("fresh", rate, burst=burst)
    assert "fresh" not in mq.queues()


@pytest.mark.parametrize(
    "bad",
    ["0/s", "-5/s", "abc/s", "100/fortnight", "1.5/s", "100", "", "100/0s", "5/5ms", "1/2d",
     "5/s/s", "1000000001/s", "nonee", 100, 1.5, True, b"100/s"],
)  # fmt: skip
def test_bad_rates_are_refused_and_nothing_is_written(mq: EchoMQ, bad: Any) -> None:
    mq.set_rate_limit("api", "10/s")
    before = cmd(mq, "HGETALL", mq.keys.config("api"))
    with pytest.raises(InvalidArgument) as err:
        mq.set_rate_limit("api", bad)
    assert repr(bad)[:20] in str(err.value)
    assert cmd(mq, "HGETALL", mq.keys.config("api")) == before
    with pytest.raises(InvalidArgument):
        mq.set_rate_limit("fresh", bad)
    assert "fresh" not in mq.queues()
    assert cmd(mq, "EXISTS", mq.keys.config("fresh")) == 0


def test_unknown_unit_is_named() -> None:
    with pytest.raises(InvalidArgument, match="unknown unit 'fortnight'"):
        parse_rate("100/fortnight")


def test_async_twins(backend: Backend, prefix: str) -> None:
    async def main() -> tuple[RateLimit | None, RateLimit | None, int]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            await amq.set_rate_limit("aq", "4/1d")
            first = await amq.rate_limit("aq")
            q = amq.queue("aq")
            await q.add_bulk(range(10))
            got = len(await q.claim(10))
            await amq.set_rate_limit("aq", None)
            return first, await amq.rate_limit("aq"), got
        finally:
            await amq.close()

    first, after, got = asyncio.run(main())
    assert first is not None and (first.limit, first.window_ms) == (4, 86_400_000)
    assert after is None
    assert got == 1  # burst 1: one start now, the next a quarter of a day later


# -- the claim ---------------------------------------------------------------------------------


def test_a_claim_takes_one_start_and_says_when_the_next_conforms(mq: EchoMQ) -> None:
    q = mq.queue("api", lease=LEASE)
    q.add_bulk(range(30))
    mq.set_rate_limit("api", "3/1h")  # one start per 20 minutes
    cmd(mq, "DEL", mq.keys.wake("api"))
    first = q.claim(3)
    assert len(first) == 1
    # the batch was cut short by the rate: no wake-up passed on
    assert cmd(mq, "ZCARD", mq.keys.wake("api")) == 0
    assert 1190 <= first.opens_in <= 1200
    again = q.claim(10)
    assert list(again) == [] and 1190 <= again.opens_in <= first.opens_in
    rate = mq.rate_limit("api")
    assert rate is not None and (rate.used, rate.ready) == (1, 0)
    assert 1190 <= rate.next_in <= again.opens_in and rate.resets_in == rate.next_in
    assert q.stats()["pending"] == 29
    mq.set_rate_limit("api", "3600/1h")  # raised: the next start comes one new interval on
    raised = q.claim(10)
    assert list(raised) == [] and 0 < raised.opens_in <= 1.0
    mq.set_rate_limit("api", None)  # removed: the claim is the plain one again
    rest = q.claim(10)
    assert len(rest) == 10 and rest.opens_in == 0.0


def test_a_burst_starts_at_once_then_the_interval_holds(mq: EchoMQ) -> None:
    q = mq.queue("api", lease=LEASE)
    q.add_bulk(range(20))
    mq.set_rate_limit("api", "6/1h", burst=5)  # one start per 10 minutes, 5 at once
    a = q.claim(4)
    assert len(a) == 4 and a.opens_in == 0.0  # one more conforms now: no wait
    rate = mq.rate_limit("api")
    assert rate is not None and (rate.used, rate.ready, rate.next_in) == (4, 1, 0.0)
    assert 2390 <= rate.resets_in <= 2400  # four intervals booked
    b = q.claim(10)
    assert len(b) == 1 and 590 <= b.opens_in <= 600  # the burst spent: one interval
    c = q.claim(1)
    assert len(c) == 0 and 0 < c.opens_in <= b.opens_in
    assert len({claimed_at(mq, j) // 1000 for j in [*a, *b]}) <= 2  # all at once


def test_starts_are_an_interval_apart_and_the_key_deletes_itself(mq: EchoMQ) -> None:
    q = mq.queue("api", lease=LEASE)
    q.add_bulk(range(10))
    mq.set_rate_limit("api", "2/200ms")  # one start per 100 ms
    tat_key = mq.keys.rate_tat("api")
    got = list(q.claim(5))
    assert len(got) == 1
    # it expires at the TAT: a TTL of at most one interval (+ 1: the TAT in µs rounded up to
    # the ms, the TTL counted from the ms the claim fell in), or gone already (-2) when the
    # claim was slow to return on a loaded machine (never -1: no expiry)
    ttl = cmd(mq, "PTTL", tat_key)
    assert ttl == -2 or 0 <= ttl <= 101, ttl
    eventually(lambda: len(got) >= 6 or got.extend(q.claim(5)), 10, "six starts")
    times = sorted(claimed_at(mq, j) for j in got)
    assert min(b - a for a, b in itertools.pairwise(times)) >= 100, times
    assert most_in_a_window(times, 200) <= 2
    eventually(lambda: cmd(mq, "EXISTS", tat_key) == 0, 5, "the TAT key to expire")


def test_no_rate_writes_nothing_new(mq: EchoMQ) -> None:
    q = mq.queue("plain")
    q.add_bulk(range(5))
    got = q.claim(2)
    assert len(got) == 2 and got.opens_in == 0.0
    assert cmd(mq, "EXISTS", mq.keys.rate_tat("plain")) == 0
    assert cmd(mq, "EXISTS", mq.keys.config("plain")) == 0


@pytest.mark.parametrize("burst", [1, 5])
def test_claimers_on_three_connections_hold_every_sliding_window(
    backend: Backend, prefix: str, burst: int
) -> None:
    """Three threads, each on its own connection, claim from a 20 per 200 ms queue as fast as
    they are let (sleeping only the ``opens_in`` a claim returns) until 200 jobs started: no
    span of 200 ms, wherever it starts, holds more than 20 starts (+ burst - 1), by the
    server's clock (each job's claim time, read from its score in ``active``). A fixed window
    lets up to 40 into a span that straddles a boundary."""
    limit, window_ms, total = 20, 200, 200
    mq = backend.client(prefix)
    mq.set_rate_limit("api", f"{limit}/{window_ms}ms", burst=burst)
    mq.queue("api", lease=LEASE).add_bulk(range(total))
    clients = [backend.client(prefix) for _ in range(3)]
    claimed: list[Job] = []
    lock = threading.Lock()

    def claimer(c: EchoMQ) -> None:
        q = c.queue("api", lease=LEASE)
        while len(claimed) < total:
            got = q.claim(5)
            with lock:
                claimed.extend(got)
            time.sleep(got.opens_in)

    threads = [threading.Thread(target=claimer, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in clients:
        c.close()
    assert len(claimed) == total and not any(t.is_alive() for t in threads)
    times = [claimed_at(mq, j) for j in claimed]
    most = most_in_a_window(times, window_ms)
    assert most <= limit + burst - 1, most
    if burst == 1:
        ordered = sorted(times)
        assert min(b - a for a, b in itertools.pairwise(ordered)) >= 10
    mq.close()


# -- workers -----------------------------------------------------------------------------------


def recording_handler(mq: EchoMQ, seen: list[int]) -> Callable[[Job], int]:
    lock = threading.Lock()

    def handle(job: Job) -> int:
        at = claimed_at(mq, job, WORKER_LEASE)
        with lock:
            seen.append(at)
        return at

    return handle


def run_async_worker(backend: Backend, prefix: str, queue: str, stop: threading.Event,
                     seen: list[int]) -> None:  # fmt: skip
    async def main() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        sync = backend.client(prefix)
        handle = recording_handler(sync, seen)
        worker = AsyncWorker(amq, {queue: handle}, concurrency=3, lease=WORKER_LEASE, pump=False)
        unextended(worker)
        await worker.start()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await worker.stop()
        await amq.close()
        sync.close()

    asyncio.run(main())


def test_worker_threads_never_exceed_the_limit(backend: Backend, prefix: str) -> None:
    """Two threaded workers and an asyncio one share a 15 per 250 ms limit."""
    limit, window_ms, total = 15, 250, 150
    mq = backend.client(prefix)
    mq.set_rate_limit("api", f"{limit}/{window_ms}ms")
    mq.queue("api").add_bulk(range(total))
    seen: list[int] = []
    clients = [backend.client(prefix) for _ in range(2)]
    workers = [
        Worker(
            c, {"api": recording_handler(c, seen)}, concurrency=4, lease=WORKER_LEASE, pump=False
        )
        for c in clients
    ]
    for w in workers:
        unextended(w)
    stop = threading.Event()
    aio = threading.Thread(target=run_async_worker, args=(backend, prefix, "api", stop, seen))
    try:
        for w in workers:
            w.start()
        aio.start()
        eventually(lambda: len(seen) >= total, 60, lambda: f"{len(seen)} of {total} started")
    finally:
        stop.set()
        for w in workers:
            w.stop()
        aio.join(30)
        for c in clients:
            c.close()
    assert len(seen) == total
    assert most_in_a_window(seen, window_ms) <= limit, sorted(seen)
    assert mq.queue("api").stats()["completed"] == total
    mq.close()


@pytest.fixture
def rate_procs(
    backend: Backend, prefix: str, proc_env: dict[str, str]
) -> Iterator[Callable[[str, int], list[subprocess.Popen[str]]]]:
    started: list[subprocess.Popen[str]] = []

    def start(queue: str, count: int) -> list[subprocess.Popen[str]]:
        argv = [sys.executable, PROC, backend.url, "1" if backend.cluster else "0", prefix, queue]
        procs = [
            subprocess.Popen(argv, env=proc_env, stdout=subprocess.PIPE, text=True)
            for _ in range(count)
        ]
        started.extend(procs)
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        return procs

    yield start
    for p in started:
        if p.poll() is None:
            p.terminate()
    for p in started:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_worker_processes_never_exceed_the_limit(
    backend: Backend, prefix: str, rate_procs: Callable[[str, int], list[subprocess.Popen[str]]]
) -> None:
    limit, window_ms, total = 20, 250, 160
    mq = backend.client(prefix)
    mq.set_rate_limit("api", f"{limit}/{window_ms}ms")
    rate_procs("api", 3)  # started before the jobs exist: all three compete from the start
    mq.queue("api").add_bulk(range(total))
    seen_key = f"{prefix}:test:claimed"

    def started() -> int:
        return int(cmd(mq, "LLEN", seen_key))

    eventually(lambda: started() >= total, 60, lambda: f"{started()} of {total} started")
    seen = [int(x) for x in cmd(mq, "LRANGE", seen_key, 0, -1)]
    assert len(seen) == total
    assert most_in_a_window(seen, window_ms) <= limit, sorted(seen)
    workers = {int(x) for x in cmd(mq, "SMEMBERS", f"{prefix}:test:pids")}
    assert len(workers) >= 2  # the fleet shared the window, not one process alone
    mq.close()


def test_an_idle_rate_limited_worker_does_not_spin(backend: Backend, prefix: str) -> None:
    """A worker serves a spent rate-limited queue and a free one. Jobs keep arriving in both
    (each add sets the limited queue's wake-up hint): the worker runs the free ones and makes
    no claim on the limited queue until its next start could conform, nor takes its hint."""
    mq = backend.client(prefix)
    limited, free = backend.queues_on_distinct_nodes(2, "spin") if backend.cluster else (
        "spin-limited", "spin-free")  # fmt: skip
    mq.set_rate_limit(limited, "1/1d")
    mq.queue(limited).add_bulk(range(3))
    done: list[str] = []
    worker = Worker(mq, {limited: lambda j: done.append(j.queue), free: lambda j: done.append(
        j.queue)}, concurrency=1, lease=LEASE, pump=False)  # fmt: skip
    claims = Counter[str]()
    for name, queue in worker.queues.items():
        real = queue.claim_op  # the fetcher's claims (routines.claim_turn)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            claims[_name] += 1
            return _real(*args, **kw)

        queue.claim_op = counted  # type: ignore[method-assign]
    worker.start()
    try:
        eventually(lambda: done.count(limited) == 1, 20, "the day's one start")
        began, before = time.monotonic(), claims[limited]
        for i in range(20):
            mq.queue(limited).add(i)  # sets the hint a spinning worker would take
            mq.queue(free).add(i)
            eventually(lambda n=i: done.count(free) == n + 1, 20, "the free job")
        elapsed = time.monotonic() - began
        waited = claims[limited] - before
        hint = cmd(mq, "ZCARD", mq.keys.wake(limited))
    finally:
        worker.stop()
    assert done.count(limited) == 1
    assert waited <= 1 + elapsed / RATE_RECHECK, (waited, elapsed)
    assert claims[free] >= 20
    assert hint == 1  # the limited queue's hint was left for whoever can use it


def test_an_idle_rate_limited_async_worker_does_not_spin(backend: Backend, prefix: str) -> None:
    """As above, for the asyncio worker."""
    mq = backend.client(prefix)
    limited, free = backend.queues_on_distinct_nodes(2, "aspin") if backend.cluster else (
        "aspin-limited", "aspin-free")  # fmt: skip
    mq.set_rate_limit(limited, "1/1d")
    mq.queue(limited).add_bulk(range(3))

    async def main() -> tuple[list[str], Counter[str], float, int]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        done: list[str] = []

        async def handle(job: Job) -> None:
            done.append(job.queue)

        worker = AsyncWorker(amq, {limited: handle, free: handle}, lease=LEASE, pump=False)
        claims = Counter[str]()
        for name, queue in worker.queues.items():
            real = queue.claim_op  # the fetcher's claims (routines.claim_turn)

            def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                claims[_name] += 1
                return _real(*args, **kw)

            queue.claim_op = counted  # type: ignore[method-assign]
        await worker.start()
        try:
            await eventually_async(lambda: done.count(limited) == 1, 20, "the one start")
            began, before = time.monotonic(), claims[limited]
            for i in range(20):
                await amq.queue(limited).add(i)
                await amq.queue(free).add(i)
                await eventually_async(lambda n=i: done.count(free) == n + 1, 20, "the free job")
            elapsed = time.monotonic() - began
            claims["waited"] = claims[limited] - before
        finally:
            await worker.stop()
            await amq.close()
        return done, claims, elapsed, int(cmd(mq, "ZCARD", mq.keys.wake(limited)))

    done, claims, elapsed, hint = asyncio.run(main())
    assert done.count(limited) == 1
    assert claims["waited"] <= 1 + elapsed / RATE_RECHECK, (claims, elapsed)
    assert claims[free] >= 20
    assert hint == 1
    mq.close()


# -- the CLI -----------------------------------------------------------------------------------


def run_cli(backend: Backend, prefix: str, capsys: pytest.CaptureFixture[str],
            *argv: str) -> tuple[int, str, str]:  # fmt: skip
    capsys.readouterr()
    status = main([*argv, "--url", backend.url, "--prefix", prefix])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.onlystandalone
def test_cli_sets_shows_and_removes_the_rate(
    backend: Backend, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    mq = backend.client(prefix)
    status, out, err = run_cli(backend, prefix, capsys, "queue", "config", "api", "--rate",
                               "100/s")  # fmt: skip
    assert (status, err) == (0, "")
    assert out.splitlines()[-1] == "rate limit of 'api': 100/s; 1 may start now (set)"
    rate = mq.rate_limit("api")
    assert rate is not None and (rate.limit, rate.window_ms) == (100, 1000)
    status, out, _ = run_cli(backend, prefix, capsys, "queue", "config", "api", "--rate",
                             "6000/min", "--json")  # fmt: skip
    doc = json.loads(out)
    assert doc["changed"] == ["rate"]
    assert doc["rate"] == {"limit": 6000, "window_s": 60.0, "text": "6000/min", "burst": 1,
                           "used": 0, "ready": 1, "next_in_s": 0.0,
                           "resets_in_s": 0.0}  # fmt: skip
    status, out, _ = run_cli(backend, prefix, capsys, "queue", "config", "api", "--rate",
                             "6/h", "--burst", "4")  # fmt: skip
    assert out.splitlines()[-1] == "rate limit of 'api': 6/h burst 4; 4 may start now (set)"
    q = mq.queue("api")
    q.add_bulk(range(5))
    assert len(q.claim(4)) == 4
    status, out, _ = run_cli(backend, prefix, capsys, "queue", "stats", "api")
    line = out.splitlines()[-1]
    assert line.startswith("rate limit of 'api': 6/h burst 4; 0 may start now (the next in 5")
    doc = json.loads(run_cli(backend, prefix, capsys, "queue", "stats", "--json")[1])
    assert doc["api"]["rate"]["used"] == 4 and doc["api"]["rate"]["ready"] == 0
    assert 2390 <= doc["api"]["rate"]["resets_in_s"] <= 2400  # 4 intervals of 10 min booked
    assert 590 <= doc["api"]["rate"]["next_in_s"] <= 600
    for bad in ("0", "x", "-2", "1.5"):
        status, _, err = run_cli(backend, prefix, capsys, "queue", "config", "api", "--rate",
                                 "6/h", f"--burst={bad}")  # fmt: skip
        assert status == 2 and "burst" in err, err
    status, _, err = run_cli(backend, prefix, capsys, "queue", "config", "api", "--burst", "3")
    assert status == 1 and "--burst goes with --rate" in err
    status, _, err = run_cli(backend, prefix, capsys, "queue", "config", "api", "--rate",
                             "none", "--burst", "3")  # fmt: skip
    assert status != 0 and "needs a rate" in err
    assert str(mq.rate_limit("api")) == "6/h burst 4"
    # bad input: a usage error naming the value, nothing written
    status, out, err = run_cli(backend, prefix, capsys, "queue", "config", "api", "--rate",
                               "100/fortnight")  # fmt: skip
    assert status == 2 and "'100/fortnight'" in err and "unknown unit" in err
    assert str(mq.rate_limit("api")) == "6/h burst 4"
    for bad in ("0/s", "-3/min", "x/s"):
        status, _, err = run_cli(backend, prefix, capsys, "queue", "config", "api", f"--rate={bad}")
        assert status == 2 and repr(bad) in err
    assert str(mq.rate_limit("api")) == "6/h burst 4"
    status, out, _ = run_cli(backend, prefix, capsys, "queue", "config", "api", "--rate", "none")
    assert out.splitlines()[-1] == "rate limit of 'api': none (set)"
    assert mq.rate_limit("api") is None
    status, out, _ = run_cli(backend, prefix, capsys, "queue", "stats", "api")
    assert "rate limit" not in out
    doc = json.loads(run_cli(backend, prefix, capsys, "queue", "config", "api", "--json")[1])
    assert "rate" not in doc
    mq.close()
