"""The queue lifecycle on standalone and Cluster: add, claim, complete, fail, leases."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from echomq_core import (
    Backoff,
    ConnectionLost,
    EchoMQ,
    InvalidArgument,
    InvalidJobId,
    InvalidPayload,
    InvalidQueueName,
    JobNotFound,
    JobSpec,
    LeaseLost,
    Pump,
)

from ..waiting import eventually


def test_add_claim_complete(mq: EchoMQ) -> None:
    q = mq.queue("work")
    ids = q.add_bulk([{"n": i} for i in range(10)])
    assert len(set(ids)) == 10
    assert q.stats()["pending"] == 10
    jobs = q.claim(4)
    assert [j.payload["n"] for j in jobs] == [0, 1, 2, 3]  # FIFO
    assert all(j.token == jobs[0].token for j in jobs)
    assert q.stats()["active"] == 4
    assert q.get_job(jobs[0].id).state == "active"
    assert q.complete_many([(j, j.payload["n"] * 2) for j in jobs]) == [True] * 4
    info = q.get_job(jobs[1].id)
    assert (info.state, info.result, info.payload, info.attempts) == ("completed", 2, {"n": 1}, 0)
    stats = q.stats()
    assert (stats["pending"], stats["active"], stats["completed"]) == (6, 0, 4)


def test_add_by_id_is_idempotent(mq: EchoMQ) -> None:
    q = mq.queue("work")
    assert q.add({"a": 1}, job_id="JOB-x1") == "JOB-x1"
    (job,) = q.claim()
    q.complete(job, "done")
    q.add({"a": 2}, job_id="JOB-x1")  # a retry by id never re-queues
    assert q.stats()["pending"] == 0
    assert q.get_job("JOB-x1").payload == {"a": 1}


def test_priority_and_delay(mq: EchoMQ) -> None:
    q = mq.queue("work")
    q.add_bulk(
        [JobSpec("low", priority=5), JobSpec("high", priority=0), JobSpec("later", delay=0.3)]
    )
    assert [j.payload for j in q.claim(5)] == ["high", "low"]
    assert q.get_job(q.add("later2", delay=0.3)).state == "delayed"
    time.sleep(0.35)
    assert sorted(j.payload for j in q.claim(5)) == ["later", "later2"]  # claim promotes


def test_stale_completion_refused(mq: EchoMQ) -> None:
    q = mq.queue("work", lease=0.1)
    q.add("x")
    (first,) = q.claim()
    time.sleep(0.15)
    assert Pump(mq, ["work"]).tick().recovered == 1
    (second,) = q.claim()
    assert second.id == first.id and second.token != first.token
    with pytest.raises(LeaseLost):
        q.complete(first, "stale")
    with pytest.raises(LeaseLost):
        q.fail(first, "stale")
    assert q.heartbeat([first, second]) == [False, True]
    assert q.get_job(first.id).state == "active"  # the stale calls changed nothing
    q.complete(second, "fresh")
    info = q.get_job(first.id)
    assert (info.state, info.result, info.stalls) == ("completed", "fresh", 1)


def test_lease_expiry_and_recovery(mq: EchoMQ) -> None:
    q = mq.queue("work", lease=60)
    q.add_bulk(["a", "b"])
    jobs = q.claim(2)
    # a heartbeat sets a lease from now: b's to 50 ms, so only b expires (a keeps its 60 s
    # however slowly this machine runs: no sleep here has an upper bound)
    assert q.heartbeat([jobs[1]], lease=0.05) == [True]
    time.sleep(0.1)
    pump = Pump(mq, ["work"])
    assert pump.tick().recovered == 1
    assert q.get_job(jobs[1].id).state == "pending"
    assert q.get_job(jobs[0].id).state == "active"
    (again,) = q.claim()
    assert again.id == jobs[1].id and again.stalls == 1


def test_stalls_bury_after_limit(mq: EchoMQ) -> None:
    q = mq.queue("work", lease=0.05)
    job_id = q.add("crashy")
    pump = Pump(mq, ["work"], max_stalls=1, maintain_every=0)
    for _ in range(2):
        (_job,) = q.claim()
        time.sleep(0.08)
        pump.tick()
    info = q.get_job(job_id)
    assert info.state == "dead" and "lease expired 2 times" in (info.error or "")


def test_retries_with_backoff_then_dead(mq: EchoMQ) -> None:
    q = mq.queue("work", max_attempts=3, backoff=Backoff(base_ms=50, cap_ms=200))
    job_id = q.add("doomed")
    seen = []

    def attempt() -> bool:
        """Claim the job when it is due and fail it: True once it died."""
        jobs = q.claim()
        if not jobs:
            return False
        seen.append(time.monotonic())
        died = q.fail(jobs[0], f"boom {len(seen)}")
        info = q.get_job(job_id)
        if died:
            return True
        assert info.state == "delayed" and info.error == f"boom {len(seen)}"
        return False

    eventually(attempt, 5, "the job's death", every=0.01)
    assert len(seen) == 3
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert gaps[0] >= 0.025 and gaps[1] >= 0.05  # jittered 50 ms, then 100 ms, at least half
    info = q.get_job(job_id)
    assert (info.state, info.attempts, info.error) == ("dead", 3, "boom 3")
    assert q.stats()["dead"] == 1


def test_unrecoverable_fail_buries_at_once(mq: EchoMQ) -> None:
    q = mq.queue("work", max_attempts=5)
    job_id = q.add("x")
    (job,) = q.claim()
    assert q.fail(job, "bad input", retry=False) is True
    assert q.get_job(job_id).state == "dead"


def test_refused_inputs(mq: EchoMQ) -> None:
    q = mq.queue("work")
    for bad in ["", "a{b}", "a:b", "a b", "a\nb", "x" * 129, "tab\t"]:
        with pytest.raises(InvalidQueueName):
            mq.queue(bad)
    with pytest.raises(InvalidQueueName):
        mq.queue(42)  # type: ignore[arg-type]
    for bad_id in ["nope", "JOB-", "JOB-a b", "JOB-{x}", "JOB-" + "x" * 201, "job-x"]:
        with pytest.raises(InvalidJobId):
            q.add("x", job_id=bad_id)
        with pytest.raises(InvalidJobId):
            q.get_job(bad_id)
    with pytest.raises(JobNotFound):
        q.get_job("JOB-missing")
    with pytest.raises(InvalidPayload):
        q.add(object())
    with pytest.raises(InvalidPayload):
        q.add(float("nan"))
    small = mq.__class__(
        mq.url, cluster=mq.connection.is_cluster, prefix=mq.keys.prefix, max_payload_bytes=100
    )
    with pytest.raises(InvalidPayload):
        small.queue("work").add("x" * 200)
    small.close()
    for kwargs in [{"max_attempts": 0}, {"lease": -1}, {"lease": "1"}]:
        with pytest.raises(InvalidArgument):
            mq.queue("work", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        q.claim(0)
    with pytest.raises(InvalidArgument):
        q.add("x", priority=-1)
    assert q.stats() == {
        "pending": 0,
        "active": 0,
        "delayed": 0,
        "dead": 0,
        "completed": 0,
        "outbox": 0,
        "poison": 0,
    }


def test_wrong_token_refused_by_the_server(mq: EchoMQ) -> None:
    q = mq.queue("work")
    q.add("x")
    (job,) = q.claim()
    job.token = "forged"
    with pytest.raises(LeaseLost):
        q.complete(job, 1)
    assert q.get_job(job.id).state == "active"


def test_script_reload_after_flush(mq: EchoMQ) -> None:
    q = mq.queue("work")
    q.add("x")
    client = mq.connection.client
    client.script_flush()  # the server forgets every script: the next call sees NOSCRIPT
    assert len(q.claim()) == 1


@pytest.mark.onlystandalone
def test_a_refused_script_load_is_a_typed_error_sync_and_async(
    mq: EchoMQ, prefix: str, standalone_server: Any
) -> None:
    """After a script flush, a user who may call scripts but not load them gets EchoMQ's typed
    error from both drivers (the server's NOPERM), not redis-py's ResponseError."""
    import asyncio
    import uuid

    from echomq_core import AsyncEchoMQ, EchoMQError

    admin = mq.connection.client
    user, password = f"noload-{uuid.uuid4().hex[:8]}", "pw-" + uuid.uuid4().hex
    admin.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["*"],
        commands=["+@all", "-script|load"],
    )  # fmt: skip
    try:
        admin.script_flush()
        url = f"redis://{user}:{password}@{standalone_server.host}:{standalone_server.port}/0"
        with EchoMQ(url, prefix=prefix) as limited, pytest.raises(EchoMQError) as sync_error:
            limited.queue("noload").add("x")
        assert "NOPERM" in str(sync_error.value) or "permission" in str(sync_error.value)

        async def add() -> None:
            amq = AsyncEchoMQ(url, prefix=prefix)
            try:
                await amq.snapshot("noload", "JOB-none")  # a script call
            finally:
                await amq.close()

        with pytest.raises(EchoMQError) as async_error:
            asyncio.run(add())
        assert type(async_error.value) is type(sync_error.value)
    finally:
        admin.acl_deluser(user)


def test_bulk_chunks_across_script_calls(mq: EchoMQ) -> None:
    q = mq.queue("bulk")
    ids = q.add_bulk(range(5203))
    assert q.stats()["pending"] == 5203
    jobs = q.claim(5203)  # past Lua's unpack limit: the claim writes in slices
    assert len(jobs) == 5203 and {j.id for j in jobs} == set(ids)
    assert all(q.complete_many([(j, None) for j in jobs]))
    assert q.stats()["completed"] == 5203


def test_retention_sweeps_completed_jobs(mq: EchoMQ) -> None:
    from echomq_core import Child

    q = mq.queue("work")
    flat = q.add("x")
    ref = mq.add_flow("work", [Child(1), Child(2)])
    for _ in range(2):
        q.complete_many([(j, j.payload) for j in q.claim(10)])
    mq.set_retention("work", completed_age=0.2)
    pump = Pump(mq, ["work"], sweep_every=0, maintain_every=0)
    assert pump.tick().swept == 0  # too young
    time.sleep(0.25)
    stats = pump.tick()
    # the plain job, the children's index entries, and their parent: the flow as a unit
    assert (stats.swept, stats.expired) == (4, [("work", ref.parent_id)])
    assert not [k for k in mq.connection.client.keys(f"{mq.keys.prefix}:*") if b":job:" in k]
    with pytest.raises(JobNotFound):
        q.get_job(flat)
    with pytest.raises(JobNotFound, match="expired with its retention"):
        mq.children_values("work", ref.parent_id)  # the flow is gone: said at once
    assert mq.snapshot("work", ref.parent_id).parent_state is None
    assert q.stats()["completed"] == 0


def test_unix_socket_url(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from echomq_core.server import EmbeddedServer

    sock = tmp_path / "v.sock"
    with EmbeddedServer(extra_args=["--unixsocket", str(sock)]) as server:
        assert server.is_running()
        mq = EchoMQ(f"unix://{sock}")
        q = mq.queue("u")
        q.add("over a socket")
        assert [j.payload for j in q.claim()] == ["over a socket"]
        mq.close()


def test_not_a_redis_server_is_a_server_error() -> None:
    import socket
    import threading

    from echomq_core import ServerError

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer_http() -> None:
        conn, _ = listener.accept()
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    threading.Thread(target=answer_http, daemon=True).start()
    mq = EchoMQ(f"redis://127.0.0.1:{listener.getsockname()[1]}/0")
    with pytest.raises((ServerError, ConnectionLost)):
        mq.queue("x").stats()
    listener.close()


def test_retry_dead_revives_plain_jobs_only(mq: EchoMQ) -> None:
    from echomq_core import Child, InvalidArgument

    q = mq.queue("revive")
    plain = q.add({"n": 1}, max_attempts=2, timeout=30)
    (job,) = q.claim()
    assert q.fail(job, "gone", retry=False)
    flow = mq.add_flow("revive", [Child("kid", queue="revive")])
    (kid,) = q.claim()
    assert q.fail(kid, "kid gone", retry=False)
    waiting = q.add("waiting")
    assert q.stats()["dead"] == 2

    revived, left = q.retry_dead([plain, kid.id, waiting, "JOB-nobody"])
    assert (revived, left) == (1, [kid.id, waiting, "JOB-nobody"])
    info = q.get_job(plain)
    assert (info.state, info.attempts, info.error, info.max_attempts) == ("pending", 0, None, 2)
    assert q.get_job(kid.id).state == "dead"  # a flow's child: repaired with its flow instead
    assert q.stats()["dead"] == 1
    # it runs again, behind what was pending, and can complete this time
    first, second = q.claim(2)
    assert (first.id, second.id) == (waiting, plain) and second.payload == {"n": 1}
    q.complete(second, "ok")
    assert q.get_job(plain).state == "completed"
    assert q.retry_dead([plain]) == (0, [plain])  # not dead any more: left as it is
    assert q.retry_dead([]) == (0, [])
    with pytest.raises(InvalidArgument):
        q.retry_dead(plain)  # a string, not a list of ids
    assert mq.dependencies("revive", flow.parent_id) == 1


def _counting_steps(mq: EchoMQ) -> list[int]:
    """Record the number of calls of each step (round trip) ``mq`` makes from now on."""
    steps: list[int] = []
    execute = mq.connection.execute

    def counting(calls: Any) -> Any:
        steps.append(len(calls))
        return execute(calls)

    mq.connection.execute = counting  # type: ignore[method-assign]
    return steps


def test_a_claim_ahead_leases_the_next_batch_in_the_rows_round_trip(mq: EchoMQ) -> None:
    """``claim(ahead=True)``: a full claim leases the next batch in the round trip that reads
    its rows, and holds it unread; the next call returns it (in claim order, under its own
    token) and leases the one after in one round trip. A short claim ahead is held too, an
    empty one ends it; every job comes back once and each lease is the one the server
    holds."""
    q = mq.queue("ahead")
    q.add_bulk(range(1200))
    q.stats()  # the shard count: read once per process, then cached
    steps = _counting_steps(mq)
    first = q.claim(500, ahead=True)
    assert steps == [1, 2]  # the claim; then its rows and the next claim together
    assert [j.payload for j in first] == list(range(500))
    assert q.ahead is not None and len(q.ahead[0]) == 500
    assert q.stats()["active"] == 1000
    del steps[:]
    second = q.claim(500, ahead=True)
    assert steps == [2]  # one round trip for a whole batch
    assert [j.payload for j in second] == list(range(500, 1000))
    assert q.ahead is not None and len(q.ahead[0]) == 200  # a short claim ahead, held too
    third = q.claim(500, ahead=True)
    assert [j.payload for j in third] == list(range(1000, 1200))
    assert q.ahead is None  # the claim ahead of it found nothing
    assert q.claim(500, ahead=True) == []
    jobs = [*first, *second, *third]
    assert len({j.token for j in jobs}) == 3  # a token per claim
    assert all(q.complete_many([(j, None) for j in jobs]))
    assert q.stats()["completed"] == 1200 and q.stats()["active"] == 0


def test_a_claim_without_ahead_returns_the_held_jobs_and_claims_nothing(mq: EchoMQ) -> None:
    q = mq.queue("ahead2")
    q.add_bulk(range(1500))
    q.claim(500, ahead=True)
    held = q.claim(1)  # what a worker calls before it waits or stops
    assert [j.payload for j in held] == list(range(500, 1000))
    assert q.ahead is None
    assert q.stats()["active"] == 1000 and q.stats()["pending"] == 500


def test_a_claim_ahead_keeps_within_the_rate_limit(mq: EchoMQ) -> None:
    """The claim made ahead is held to the rate limit like any claim: it takes what conforms
    now, and its reply's ``opens_in`` says when the next start does."""
    q = mq.queue("ahead3")
    mq.set_rate_limit("ahead3", "700/h", burst=700)  # 700 may start at once, then 1 per 5.1 s
    q.add_bulk(range(2000))
    first = q.claim(500, ahead=True)
    assert len(first) == 500 and first.opens_in > 0  # the claim ahead spent the burst
    assert q.ahead is not None and len(q.ahead[0]) == 200
    rest = q.claim(500)  # held: returned, nothing claimed
    assert len(rest) == 200
    later = q.claim(500)
    assert later == [] and later.opens_in > 0
    assert q.stats()["active"] == 700


def test_a_sharded_queue_s_logical_handle_claims_nothing_ahead(mq: EchoMQ) -> None:
    mq.set_shards("ahead4", 3)
    q = mq.queue("ahead4")
    q.add_bulk(range(3000))
    jobs = q.claim(500, ahead=True)
    assert len(jobs) == 500 and q.ahead is None
