"""Per-minute tallies of completed and failed attempts (echomq_core.queues.throughput,
lua/tally.lua) against real servers: written by a real worker's batches, one command per batch,
yesterday's field read as zero, the hash's memory with a full day of minutes, and the dashboard's
chart and JSON on a real ``echomq dashboard`` process."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
import redis

from echomq_core import Backoff, EchoMQ, Job, JobSpec, Unrecoverable, Worker
from echomq_core.errors import InvalidArgument
from echomq_core.queues.throughput import DAY, read_minutes
from echomq_core.server import EmbeddedServer

from ..conftest import Backend
from ..dashkit import Dashboard, env_for
from ..waiting import eventually


def handle(job: Job) -> object:
    if job.payload.get("fail"):
        raise RuntimeError("asked to fail")
    return job.payload["n"]


def totals(mq: EchoMQ, queue: str, minutes: int = 3) -> tuple[int, int]:
    found = mq.perform(read_minutes(mq.keys, queue, minutes))
    return sum(m.completed for m in found), sum(m.failed for m in found)


def test_a_workers_batches_are_tallied_per_minute(backend: Backend, mq: EchoMQ) -> None:
    q = mq.queue("tp-work", max_attempts=1)
    q.add_bulk([JobSpec({"n": i, "fail": i % 5 == 0}) for i in range(50)])
    worker = Worker(mq, {"tp-work": handle}, concurrency=2).start()
    try:
        eventually(lambda: q.stats()["completed"] == 40 and q.stats()["dead"] == 10, 30)
    finally:
        worker.stop()
    # three minutes: a batch may have landed in the minute before this one
    assert totals(mq, "tp-work") == (40, 10)
    found = mq.perform(read_minutes(mq.keys, "tp-work", 60))
    assert len(found) == 60 and found[-1].at > found[0].at
    assert [m.at - found[0].at for m in found] == [i * 60_000 for i in range(60)]
    assert totals(mq, "tp-other") == (0, 0)  # a queue never tallied


def test_one_tally_per_batch_not_per_job(standalone_server: EmbeddedServer, prefix: str) -> None:
    """600 completions: two complete script calls (chunks of 500), each tallying its own
    completions inside (no tally call of its own: a full server could refuse it alone)."""
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    raw = redis.Redis.from_url(standalone_server.url)
    q = mq.queue("tp-batch")
    q.add_bulk([JobSpec(i) for i in range(600)])
    jobs = q.claim(600)
    assert len(jobs) == 600
    raw.config_resetstat()
    assert all(q.complete_many([(j, 1) for j in jobs]))
    calls = raw.info("commandstats")
    assert int(calls["cmdstat_evalsha"]["calls"]) == 2
    assert totals(mq, "tp-batch") == (600, 0)
    raw.close()
    mq.close()


def test_a_field_from_yesterday_reads_as_zero_and_restarts(
    standalone_server: EmbeddedServer, prefix: str
) -> None:
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    raw = redis.Redis.from_url(standalone_server.url)
    minute = int(raw.time()[0]) // 60
    key = mq.keys.minutes("tp-stale")
    # this minute's field as a day-old minute wrote it (and every other field too)
    raw.hset(key, mapping={str(m % DAY): f"{m - DAY} 7 7 7" for m in range(minute - 2, minute + 3)})
    assert totals(mq, "tp-stale") == (0, 0)
    q = mq.queue("tp-stale")
    q.add(1)
    (job,) = q.claim(1)
    q.complete(job, 2)
    assert totals(mq, "tp-stale") == (1, 0)
    value = raw.hget(key, str(int(raw.time()[0]) // 60 % DAY))
    assert value is not None and value.decode().endswith(" 1 0 0")
    assert 0 < raw.pttl(key) <= 25 * 3600 * 1000
    raw.close()
    mq.close()


def test_deaths_are_counted_apart_from_failed_attempts(backend: Backend, mq: EchoMQ) -> None:
    """Three jobs failing twice each (max_attempts=2): six failed attempts, three deaths; a
    job failing once then succeeding adds a failed attempt and no death; one buried at once
    (Unrecoverable) is one of each."""
    q = mq.queue("tp-deaths", max_attempts=2, backoff=Backoff(0, 0))
    q.add_bulk([JobSpec({"n": i, "fail": True}) for i in range(3)])
    flaky = q.add({"n": 7})
    buried = q.add({"n": 8})
    seen: set[int] = set()

    def flaky_once(job: Job) -> object:
        if job.payload["n"] == 7 and 7 not in seen:
            seen.add(7)
            raise RuntimeError("first try fails")
        if job.payload["n"] == 8:
            raise Unrecoverable("no retry")
        return handle(job)

    worker = Worker(mq, {"tp-deaths": flaky_once}).start()
    try:
        eventually(lambda: q.stats()["dead"] == 4 and q.stats()["completed"] == 1, 30)
    finally:
        worker.stop()
    found = mq.perform(read_minutes(mq.keys, "tp-deaths", 3))
    assert sum(m.failed for m in found) == 8
    assert sum(m.deaths for m in found) == 4
    assert sum(m.completed for m in found) == 1
    assert mq.get_job("tp-deaths", flaky).state == "completed"
    assert mq.get_job("tp-deaths", buried).state == "dead"


def test_minutes_is_checked(backend: Backend, mq: EchoMQ) -> None:
    for bad in (0, DAY + 1, "60"):
        with pytest.raises(InvalidArgument, match="minutes"):
            mq.perform(read_minutes(mq.keys, "tp-x", bad))  # type: ignore[arg-type]


@pytest.mark.onlystandalone
def test_a_full_day_of_minutes_costs_a_bounded_memory(
    standalone_server: EmbeddedServer, prefix: str
) -> None:
    """The bound the module doc states: 1,440 fields at most; MEMORY USAGE of a full day with
    realistic counts (the value written by tally.lua for every minute)."""
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    raw = redis.Redis.from_url(standalone_server.url)
    minute = int(raw.time()[0]) // 60
    key = mq.keys.minutes("tp-mem")
    raw.hset(
        key,
        mapping={str(m % DAY): f"{m} 123456 789 12" for m in range(minute - DAY + 1, minute + 1)},
    )
    q = mq.queue("tp-mem")
    q.add(1)
    (job,) = q.claim(1)
    q.complete(job, 1)  # one more tally: still 1,440 fields
    assert raw.hlen(key) == DAY
    used = int(raw.memory_usage(key, samples=0) or 0)
    print(f"minutes hash, a full day: {used:,} bytes")
    assert used < 128 * 1024
    raw.close()
    mq.close()


@pytest.fixture
def dashboard(
    standalone_server: EmbeddedServer, prefix: str, proc_env: dict[str, str]
) -> Iterator[Dashboard]:
    d = Dashboard(standalone_server.url, prefix, env_for(proc_env))
    yield d
    d.stop()


def test_the_queue_page_draws_the_minutes_and_the_api_serves_them(
    standalone_server: EmbeddedServer, prefix: str, dashboard: Dashboard
) -> None:
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    q = mq.queue("tp-page", max_attempts=1)
    q.add_bulk([JobSpec({"n": i, "fail": i < 3}) for i in range(12)])
    worker = Worker(mq, {"tp-page": handle}).start()
    try:
        eventually(lambda: q.stats()["completed"] == 9 and q.stats()["dead"] == 3, 30)
    finally:
        worker.stop()
    q.add({"n": 99})  # one pending: the gauge shows its age
    got = json.loads(dashboard.get("/api/throughput/tp-page?minutes=5").body)
    assert len(got["minutes"]) == 5
    assert (got["completed"], got["failed"], got["deaths"]) == (9, 3, 3)
    assert sum(m["completed"] for m in got["minutes"]) == 9
    assert sum(m["deaths"] for m in got["minutes"]) == 3
    assert "chart" not in got  # the markup only when asked for (the page's live refresh)
    live = json.loads(dashboard.get("/api/throughput/tp-page?minutes=1440&chart=1").body)
    svg = live["chart"]
    assert svg.startswith('<svg id="throughput-chart"') and 'data-per="4"' in svg
    assert got["oldest_pending_age"] is not None and got["oldest_pending_age"] >= 0
    page = dashboard.get("/queue/tp-page").body
    assert '<svg id="throughput-chart"' in page
    done = [int(n) for n in re.findall(r'class="done"[^>]*data-n="(\d+)"', page)]
    failed = [int(n) for n in re.findall(r'class="failed"[^>]*data-n="(\d+)"', page)]
    assert sum(done) == 9 and sum(failed) == 3
    deaths = [int(n) for n in re.findall(r'class="deaths"[^>]*data-n="(\d+)"', page)]
    assert sum(deaths) == 3 and 'id="t-deaths" data-k="deaths">3<' in page
    day = dashboard.get("/queue/tp-page?minutes=1440").body
    assert "Last 24 hours" in day and 'data-bars="360"' in day
    assert dashboard.get("/queue/tp-page?minutes=61").status == 400
    assert 'id="oldest-age"' in page and "none pending" not in page
    bad = dashboard.get("/api/throughput/tp-page?minutes=0")
    assert bad.status == 400 and "minutes" in bad.body
    mq.close()
