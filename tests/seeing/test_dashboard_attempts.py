"""The job page's attempts, start time and lease holder on a real ``echomq dashboard`` process
with real workers: a failed-then-retried job's attempts with their times and worker, an
active job's worker (and the active browse page's), an older worker's token shown as
unknown and still completing, and the bound on a job's attempt records."""

from __future__ import annotations

import html
import json
import threading
import time
import uuid
from urllib.parse import quote

import pytest
import redis

from echomq_core import Backoff, EchoMQ, Job, Worker
from echomq_core.models import split_done
from echomq_core.queues import claiming
from echomq_core.queues.registry import read_token
from echomq_core.server import EmbeddedServer

from ..dashkit import Dashboard
from ..waiting import eventually

AF_ID = "JOB-af/etl/parse/0f3c"  # an Airflow-derived id: the page's path holds its slashes


@pytest.fixture
def mq(client: EchoMQ) -> EchoMQ:
    """The standalone server's client (these tests run on standalone only)."""
    return client


def api_job(d: Dashboard, queue: str, job_id: str) -> dict[str, object]:
    reply = d.get(f"/api/job/{quote(queue, safe='')}/{quote(job_id, safe='/')}")
    assert reply.status == 200, reply.body
    got: dict[str, object] = json.loads(reply.body)
    return got


def test_a_failed_then_retried_job_shows_each_attempt_with_its_times(
    mq: EchoMQ, readonly: Dashboard
) -> None:
    q = mq.queue("at-retry", max_attempts=4, backoff=Backoff(0, 0))
    q.add({"n": 1}, job_id=AF_ID)
    tries: list[int] = []

    def flaky(job: Job) -> object:
        tries.append(time.time_ns() // 1_000_000)
        if len(tries) < 3:
            raise RuntimeError(f"try {len(tries)} failed\nsecond line never shown")
        return "ok"

    before = time.time_ns() // 1_000_000
    worker = Worker(mq, {"at-retry": flaky}).start()
    tail = worker.presence.entry.id.rsplit("-", 1)[-1]
    try:
        eventually(lambda: q.stats()["completed"] == 1, 30)
        got = api_job(readonly, "at-retry", AF_ID)  # while the worker lives: its entry
        page = readonly.get(f"/job/at-retry/{AF_ID}").body
    finally:
        worker.stop()
    after = time.time_ns() // 1_000_000
    log = got["attempt_log"]
    assert isinstance(log, list) and [a["outcome"] for a in log] == ["retry", "retry"]
    assert [a["error"] for a in log] == [f"RuntimeError: try {i} failed" for i in (1, 2)]
    assert all(a["worker"] == tail for a in log)
    for a in log:
        assert before <= a["started_ms"] <= a["ended_ms"] <= after
    assert log[0]["ended_ms"] <= log[1]["started_ms"]
    # the final attempt: its start on the row, from the token of its claim
    assert got["state"] == "completed" and got["holder"] == tail
    started, finished = got["started_ms"], got["finished_ms"]
    assert isinstance(started, int) and isinstance(finished, int)
    assert log[1]["ended_ms"] <= started <= finished <= after
    worker_dict = got["worker"]
    assert isinstance(worker_dict, dict) and worker_dict["id"] == worker.presence.entry.id
    # the page: three attempt rows in order, the last one completed, and where it ran
    assert 'id="job-attempt-log"' in page
    assert [o for o in ("retry", "retry", "completed")] == [
        part.split('"', 1)[0] for part in page.split('data-outcome="')[1:]
    ]
    table = page.split('id="job-attempt-log"', 1)[1].split("</table>", 1)[0]
    assert "try 2 failed" in table and "second line never shown" not in table
    assert f'href="/workers#worker-{html.escape(worker.presence.entry.id)}"' in page
    shown = page.split('id="job-started">', 1)[1].split("<", 1)[0]
    assert shown.startswith(time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started / 1000)))


def test_an_active_job_shows_its_worker_and_when_it_started(
    standalone_server: EmbeddedServer, mq: EchoMQ, readonly: Dashboard
) -> None:
    """The handler holds the job until the test sets a gate key on the server."""
    raw = redis.Redis.from_url(standalone_server.url)
    gate = f"at-gate-{uuid.uuid4().hex}"
    q = mq.queue("at-active")
    job_id = q.add({"n": 1})
    running = threading.Event()

    def held(job: Job) -> object:
        running.set()
        eventually(lambda: raw.exists(gate), 30, "the gate key", every=0.01)
        return "done"

    before = time.time_ns() // 1_000_000
    worker = Worker(mq, {"at-active": held}).start()
    entry = worker.presence.entry
    try:
        assert running.wait(30)
        got = api_job(readonly, "at-active", job_id)
        assert got["state"] == "active"
        token = got["lease"]
        assert isinstance(token, str)
        assert read_token(token)[0] == entry.id.rsplit("-", 1)[-1]
        started = got["started_ms"]
        assert isinstance(started, int) and before <= started <= time.time_ns() // 1_000_000
        w = got["worker"]
        assert isinstance(w, dict) and (w["id"], w["host"], w["pid"]) == (
            entry.id,
            entry.host,
            entry.pid,
        )
        page = readonly.get(f"/job/at-active/{job_id}").body
        link = page.split('id="job-worker"', 1)
        assert len(link) == 2 and f"{entry.host} pid {entry.pid}" in link[1][:200]
        assert f'href="/workers#worker-{entry.id}" id="job-worker"' in page
        # the active browse page: the same worker on the job's row, with its start
        listing = readonly.get("/queue/at-active?state=active").body
        row = listing.split(f'data-job="{job_id}"', 1)[1].split("</tr>", 1)[0]
        assert f"{entry.host} pid {entry.pid}" in row and f"#worker-{entry.id}" in row
        api = json.loads(readonly.get("/api/queue/at-active?state=active").body)
        (only,) = api["jobs"]
        assert only["worker"]["id"] == entry.id and only["started_ms"] == started
        # the workers page has the anchor the link points at
        assert f'id="worker-{entry.id}"' in readonly.get("/workers").body
    finally:
        raw.set(gate, 1)
        worker.stop()
        raw.close()
    assert q.stats()["completed"] == 1


def test_an_older_workers_token_shows_as_unknown_and_still_completes(
    mq: EchoMQ, readonly: Dashboard
) -> None:
    """A claim with a token as workers made it before (uuid4 hex, no holder in it)."""
    q = mq.queue("at-old")
    job_id = q.add({"n": 1})
    old = uuid.uuid4().hex
    (reply,) = mq.connection.execute([claiming.claim_call(mq.keys, "at-old", 1, 30_000, old, 0)])
    _, ids = claiming.claimed_ids(reply)
    (job,) = mq.perform(claiming.leased(mq.keys, "at-old", ids, old, mq.serializer))
    assert job.token == old
    got = api_job(readonly, "at-old", job_id)
    assert got["lease"] == old and got["holder"] is None and got["started_ms"] is None
    page = readonly.get(f"/job/at-old/{job_id}").body
    assert f"unknown (token <code>{old}</code>)" in page
    q.complete(job, 5)
    got = api_job(readonly, "at-old", job_id)
    assert got["state"] == "completed" and got["result"] == 5 and got["started_ms"] is None


def test_a_jobs_attempt_records_are_bounded_and_a_completion_adds_a_few_bytes(
    standalone_server: EmbeddedServer, mq: EchoMQ
) -> None:
    """15 failed attempts with long errors keep 10 records (the newest); a completed job's
    row grows by one field only: 'done', its result behind the lease token of its last claim,
    which names the worker and the claim's time (a direct claim: no worker)."""
    raw = redis.Redis.from_url(standalone_server.url)
    q = mq.queue("at-bound", max_attempts=20, backoff=Backoff(0, 0))
    q.holder = "host-1-abcdef12"  # as a worker's handle: its tokens name it
    job_id = q.add({"n": 1})
    for i in range(15):
        (job,) = eventually(lambda: q.claim(1), 10)
        assert not q.fail(job, f"failure {i} " + "x" * 500)
    row = mq.keys.job("at-bound", job_id)
    lines = raw.hget(row, "history").decode().split("\n")  # type: ignore[union-attr]
    assert len(lines) == 10 and " r failure 5 x" in lines[0] and " r failure 14 x" in lines[-1]
    assert all(len(line.encode()) <= 160 and " abcdef12 r " in line for line in lines)
    assert raw.hstrlen(row, "history") <= 1600
    plain = mq.queue("at-bytes")
    a, b = plain.add({"n": 1}), plain.add({"n": 1})
    (ja,) = plain.claim(1)
    plain.holder = "host-1-abcdef12"
    (jb,) = plain.claim(1)
    plain.complete_many([(ja, 1), (jb, 1)])
    row_a = raw.hgetall(mq.keys.job("at-bytes", a))
    assert split_done(row_a[b"done"]) == (ja.token, b"1") and b"started" not in row_a
    held_by, since = read_token(ja.token)
    assert held_by is None and since is not None and since > 0  # a direct claim: no worker
    row_b = raw.hgetall(mq.keys.job("at-bytes", b))
    token_b, result_b = split_done(row_b[b"done"])
    assert read_token(token_b)[0] == "abcdef12" and result_b == b"1"
    assert set(row_b) == {b"payload", b"run", b"done"}
    assert len(b"done") + len(row_b[b"done"]) - len(result_b) <= 40
    raw.close()


def test_an_async_workers_leases_and_attempts_name_it(
    standalone_server: EmbeddedServer, mq: EchoMQ, prefix: str
) -> None:
    """The asyncio worker's tokens name it as the threaded worker's do: a failed attempt's
    record and the completed row carry its id's tail."""
    import asyncio

    from echomq_core import AsyncEchoMQ, AsyncWorker
    from echomq_core.seeing.browse import job_detail

    q = mq.queue("at-async", max_attempts=3, backoff=Backoff(0, 0))
    job_id = q.add({"n": 1})
    seen: list[int] = []

    async def flaky(job: Job) -> object:
        seen.append(1)
        if len(seen) == 1:
            raise RuntimeError("first async try")
        return "ok"

    async def main() -> str:
        amq = AsyncEchoMQ(standalone_server.url, prefix=prefix)
        options = {"max_attempts": 3, "backoff": Backoff(0, 0)}
        worker = AsyncWorker(amq, {"at-async": flaky}, queue_options=options)
        await worker.start()
        try:
            for _ in range(1500):
                if q.stats()["completed"] == 1:
                    break
                await asyncio.sleep(0.02)
        finally:
            await worker.stop()
            await amq.close()
        return worker.presence.entry.id

    me = asyncio.run(main())
    tail = me.rsplit("-", 1)[-1]
    detail = mq.perform(job_detail(mq.keys, "at-async", job_id, mq.serializer))
    assert detail is not None and detail.info.state == "completed"
    assert [(a.worker, a.outcome) for a in detail.attempts] == [(tail, "retry")]
    assert detail.holder == tail and detail.started_ms is not None
