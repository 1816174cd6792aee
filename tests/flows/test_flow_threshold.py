"""A flow's success threshold (``min_success``): decided in the death settle on the parent's
slot; the death that makes it unreachable fails the parent and its unstarted children are
cancelled by a durable follow-up (the 'x' signal)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from echomq_core import AsyncEchoMQ, Child, EchoMQ, FlowConflict, ParentFailed, Pump, Worker
from echomq_core.errors import InvalidArgument
from echomq_core.wire.calls import Call

from ..conftest import Backend
from ..flowkit import deliver_without_trim, work_off
from ..waiting import eventually

DOOMED = "doomed"


def _children(n: int, doomed: set[int], queue: str | None = None) -> list[Child]:
    return [Child(DOOMED if i in doomed else i, queue=queue, max_attempts=1) for i in range(n)]


def _dies(job: Any) -> bool:
    return bool(job.payload == DOOMED)


def _invariant(mq: EchoMQ, queue: str, parent_id: str) -> None:
    """While the parent has not failed: the three record hashes and the counter add up to N."""
    snap = mq.snapshot(queue, parent_id)
    if snap.parent_state != "failed":
        assert snap.processed + snap.ignored + snap.failed + snap.dependencies == snap.total


def _row(mq: EchoMQ, queue: str, job_id: str, *fields: str) -> list[Any]:
    (row,) = mq.connection.execute([Call.cmd("HMGET", mq.keys.job(queue, job_id), *fields)])
    return [None if v is None else v.decode() for v in row]


@pytest.mark.parametrize("cross", [False, True], ids=["same-queue", "cross-queue"])
def test_under_threshold_released_with_failures_listed(
    backend: Backend, prefix: str, cross: bool
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "th")
    child_q = work if cross else None
    ref = mq.add_flow(parents, _children(10, {3, 7}, child_q), min_success=0.8, barrier=True)
    assert mq.snapshot(parents, ref.parent_id).allowed == 2
    work_off(mq, [parents, work], lambda j: j.payload, die=_dies)
    snap = mq.snapshot(parents, ref.parent_id)
    assert (snap.parent_state, snap.outcome) == ("released", "released")
    assert (snap.processed, snap.failed, snap.ignored, snap.dependencies) == (8, 2, 0, 0)
    assert (snap.allowed, snap.to_dict()["allowed"]) == (2, 2)
    dead = {f"{ref.parent_id}.3", f"{ref.parent_id}.7"}
    assert set(mq.failed_children(parents, ref.parent_id)) == dead
    assert mq.ignored_failures(parents, ref.parent_id) == {}
    assert mq.dependencies(parents, ref.parent_id) == 0
    assert {f.job_id for f in mq.child_failures(parents, ref.parent_id)} == dead
    assert mq.wait(parents, ref.parent_id, timeout=1).failed == 2
    _invariant(mq, parents, ref.parent_id)
    mq.close()


@pytest.mark.parametrize("cross", [False, True], ids=["same-queue", "cross-queue"])
def test_over_threshold_fails_at_once_and_cancels_unstarted(
    backend: Backend, prefix: str, cross: bool
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "tx")
    child_q = work if cross else parents
    # 20 children, at least 18 must succeed: the third death tips it
    ref = mq.add_flow(parents, _children(20, {0, 1, 2}, child_q), min_success=18, barrier=True)
    pid = ref.parent_id
    q = mq.queue(child_q)
    jobs = q.claim(4)  # the three doomed ones and child 3 (leased: it may be running)
    assert [j.id for j in jobs] == [f"{pid}.{i}" for i in range(4)]
    pump = Pump(mq, [parents, work])
    try:
        q.fail(jobs[0], "bad input 0")
        pump.tick()
        _invariant(mq, parents, pid)
        assert mq.snapshot(parents, pid).parent_state == "held"  # tolerated
        q.fail(jobs[1], "bad input 1")
        pump.tick()
        _invariant(mq, parents, pid)
        snap = mq.snapshot(parents, pid)
        assert (snap.parent_state, snap.failed, snap.dependencies) == ("held", 2, 18)
        q.fail(jobs[2], "bad input 2")
        pump.tick()  # cross-queue: delivers the tipping death, and runs the follow-up at once
        snap = mq.snapshot(parents, pid)
        assert snap.parent_state == "failed"
        assert "3 children failed, more than the 2 allowed" in (snap.error or "")
        assert f"{pid}.2" in (snap.error or "") and "bad input 2" in (snap.error or "")
        assert set(mq.failed_children(parents, pid)) == {f"{pid}.{i}" for i in range(3)}
        if not cross:
            pump.tick()  # same-queue: the worker's Pump drains the 'x' signal
        tipped, stopped = _row(mq, parents, pid, "tipped", "stopped")
        assert tipped is not None and stopped == tipped
        # nothing of the flow is claimable any more; the leased child lost its lease
        assert q.claim(100) == []
        assert q.complete_many([(jobs[3], "late")]) == [False]
        states = {mq.get_job(child_q, f"{pid}.{i}").state for i in range(3, 20)}
        assert states == {"cancelled"}
        with pytest.raises(ParentFailed) as exc:
            mq.wait(parents, pid, timeout=1)
        assert set(exc.value.failed) == {f"{pid}.{i}" for i in range(3)}
        # a redelivered 'x', or another tick, changes nothing
        before = mq.queue(child_q).stats()
        assert pump.tick().stopped == 0
        assert mq.queue(child_q).stats() == before
    finally:
        pump.release_leases()
    mq.close()


def test_tip_follow_up_survives_a_crash_before_it_ran(backend: Backend, prefix: str) -> None:
    """Killed between: the settler failed the parent but died before the cancel follow-up
    (same-queue: a worker without a Pump; cross-queue: a Pump that delivered, then died before
    its follow-up and its trim). Another drainer reaches the 'x' signal and does it."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "tk")
    same = mq.add_flow(parents, _children(6, {0}), min_success=1.0, barrier=True)
    cross = mq.add_flow(parents, _children(6, {0}, work), min_success=6, barrier=True)
    (a,) = mq.queue(parents).claim(1)
    mq.queue(parents).fail(a, "boom")  # no Pump runs: the 'x' waits in the outbox
    (b,) = mq.queue(work).claim(1)
    mq.queue(work).fail(b, "boom")
    deliver_without_trim(mq, [work], "pump-that-dies", lease_ms=1)
    # same-queue: the tipping step parked its unstarted children (no claim reaches them);
    # cross-queue: the Pump died before parking them
    for ref, q, state in ((same, parents, "delayed"), (cross, work, "pending")):
        assert mq.snapshot(parents, ref.parent_id).parent_state == "failed"
        assert mq.get_job(q, f"{ref.parent_id}.3").state == state  # not cancelled yet
    assert mq.queue(parents).claim(10) == []
    time.sleep(0.01)  # the dead Pump's 1 ms outbox lease lapses
    pump = Pump(mq, [parents, work])
    try:
        for _ in range(3):
            pump.tick()
    finally:
        pump.release_leases()
    for ref, q in ((same, parents), (cross, work)):
        states = {mq.get_job(q, f"{ref.parent_id}.{i}").state for i in range(1, 6)}
        assert states == {"cancelled"}
        assert mq.failed_children(parents, ref.parent_id) == {f"{ref.parent_id}.0": "boom"}
    assert mq.queue(parents).stats()["outbox"] == 0 and mq.queue(work).stats()["outbox"] == 0
    mq.close()


def test_a_death_redelivered_counts_once(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "tr")
    ref = mq.add_flow(parents, _children(5, {0, 1}, work), min_success=3, barrier=True)
    jobs = mq.queue(work).claim(2)
    for job in jobs:
        mq.queue(work).fail(job, "boom")
    for i in range(3):  # three Pumps deliver the same page and die before trimming
        deliver_without_trim(mq, [work], f"pump-{i}", lease_ms=1)
        time.sleep(0.005)
        snap = mq.snapshot(parents, ref.parent_id)
        assert (snap.parent_state, snap.failed, snap.dependencies) == ("held", 2, 3)
    assert _row(mq, parents, ref.parent_id, "tolerated") == ["2"]
    work_off(mq, [parents, work], lambda j: j.payload)
    snap = mq.snapshot(parents, ref.parent_id)
    assert (snap.parent_state, snap.processed, snap.failed) == ("released", 3, 2)
    mq.close()


def test_readd_with_another_threshold_conflicts(mq: EchoMQ) -> None:
    kids = _children(4, set())
    ref = mq.add_flow("tc", kids, parent_id="JOB-af/dag/task/abc", min_success=0.5)
    assert mq.add_flow("tc", kids, parent_id=ref.parent_id, min_success=2) == ref  # same: 2 of 4
    for other in (0.75, 4, None):
        with pytest.raises(FlowConflict, match="success threshold"):
            mq.add_flow("tc", kids, parent_id=ref.parent_id, min_success=other)
    plain = mq.add_flow("tc", kids, parent_id="JOB-plain")
    with pytest.raises(FlowConflict, match="no success threshold"):
        mq.add_flow("tc", kids, parent_id=plain.parent_id, min_success=1.0)
    # replace=True takes a flow with another threshold away and adds this one
    mq.add_flow("tc", kids, parent_id=ref.parent_id, min_success=4, replace=True)
    assert mq.snapshot("tc", ref.parent_id).allowed == 0


@pytest.mark.parametrize(
    "value",
    [0, 0.0, -0.5, 1.5, float("nan"), 5, -1, True, False, "0.9", [0.9]],
)
def test_bad_threshold_refused_before_anything_is_written(
    backend: Backend, prefix: str, value: Any
) -> None:
    mq = backend.client(prefix)
    with pytest.raises(InvalidArgument, match="min_success") as exc:
        mq.add_flow("tb", _children(4, set()), parent_id="JOB-bad", min_success=value)
    assert repr(value)[:10] in str(exc.value) or "min_success" in str(exc.value)
    with pytest.raises(InvalidArgument, match="min_success"):
        mq.add_flow("tb", [Child(1, children=_children(3, set()), min_success=value)])
    with pytest.raises(InvalidArgument, match="for a child with children"):
        mq.add_flow("tb", [Child(1, min_success=0.5)])
    assert mq.snapshot("tb", "JOB-bad").parent_state is None
    assert mq.queue("tb").stats()["pending"] == 0
    mq.close()


def test_fraction_is_read_as_written() -> None:
    from echomq_core.flows.thresholds import allowance

    assert allowance("f", 0.99, 200_000) == 2_000
    assert allowance("f", 0.1, 3) == 2  # ceil(0.3) = 1 must succeed
    assert allowance("f", 1.0, 7) == 0
    assert allowance("f", 1e-9, 7) == 6  # at least one must succeed
    assert allowance("f", 7, 7) == 0 and allowance("f", 1, 7) == 6


def test_sub_flow_threshold(backend: Backend, prefix: str) -> None:
    """Child(min_success=): a sub-flow tolerates its own deaths; when it tips it fails, is one
    failure of its parent, and its own unstarted children are cancelled."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "ts")
    tolerant = Child("a", queue=work, children=_children(4, {0}), min_success=3)
    tipping = Child("b", queue=work, children=_children(4, {0, 1}), min_success=3)
    ref = mq.add_flow(parents, [tolerant, tipping], min_success=1, barrier=True)
    pid = ref.parent_id
    work_off(mq, [parents, work], lambda j: j.payload, die=_dies)
    a, b = f"{pid}.0", f"{pid}.1"
    assert mq.snapshot(work, a).parent_state == "completed"
    sub = mq.snapshot(work, b)
    assert sub.parent_state == "failed" and sub.failed == 2 and sub.allowed == 1
    snap = mq.snapshot(parents, pid)
    assert (snap.parent_state, snap.processed, snap.failed) == ("released", 1, 1)
    assert set(mq.failed_children(parents, pid)) == {b}
    mq.close()


def test_repair_of_a_tipped_flow_runs_everything_not_completed(mq: EchoMQ) -> None:
    ref = mq.add_flow("tp", _children(6, {0, 1}), min_success=5, barrier=True)
    pid = ref.parent_id
    q = mq.queue("tp")
    jobs = q.claim(3)
    q.complete(jobs[2], "ok")
    q.fail(jobs[0], "x")
    q.fail(jobs[1], "y")  # tips: 2 > 1 allowed
    pump = Pump(mq, ["tp"])
    assert pump.tick().stopped == 3  # drains the 'x': the 3 unstarted children are cancelled
    pump.release_leases()
    assert {mq.get_job("tp", f"{pid}.{i}").state for i in range(3, 6)} == {"cancelled"}
    result = mq.retry_flow("tp", pid)
    assert result.state == "held"
    _invariant(mq, "tp", pid)
    work_off(mq, ["tp"], lambda j: j.payload)  # now nothing dies
    snap = mq.snapshot("tp", pid)
    assert (snap.parent_state, snap.processed, snap.failed, snap.dependencies) == (
        "released",
        6,
        0,
        0,
    )
    assert _row(mq, "tp", pid, "tipped", "tolerated") == [None, None]


def test_workers_no_child_starts_after_the_tip(backend: Backend, prefix: str) -> None:
    """Real workers, cross-queue: the doomed children run in one queue; the rest wait in a
    queue no worker serves yet. Once the parent failed and the follow-up ran, a worker for that
    queue starts, and a sentinel job added behind the flow's children is the gate: when it ran,
    every child of the flow that was still pending would have run before it."""
    mq = backend.client(prefix)
    parents, bad, good = backend.queues_on_distinct_nodes(3, "tw")
    kids = [Child(DOOMED, queue=bad, max_attempts=1) for _ in range(3)]
    kids += [Child(i, queue=good) for i in range(50)]
    ref = mq.add_flow(parents, kids, min_success=0.96, barrier=True)  # 2 of 53 may die
    pid = ref.parent_id
    started: list[str] = []

    def boom(job: Any) -> None:
        raise ValueError("bad input")

    worker = Worker(mq, {bad: boom}, concurrency=1).start()
    try:
        eventually(lambda: mq.snapshot(parents, pid).parent_state == "failed", 20, "the tip")
        eventually(lambda: _row(mq, parents, pid, "stopped")[0], 20, "the follow-up")
    finally:
        worker.stop()
    mq.queue(good).add("sentinel", job_id="JOB-sentinel")
    ran = threading.Event()

    def record(job: Any) -> Any:
        if job.id == "JOB-sentinel":
            ran.set()
        else:
            started.append(job.id)
        return job.payload

    worker = Worker(mq, {good: record}, concurrency=4).start()
    try:
        assert ran.wait(20)
    finally:
        worker.stop()
    assert started == []
    snap = mq.snapshot(parents, pid)
    assert snap.parent_state == "failed" and snap.failed == 3
    mq.close()


def test_async_add_with_threshold(backend: Backend, prefix: str) -> None:
    async def main() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            ref = await amq.add_flow("ta", _children(10, set()), min_success=0.9)
            assert (await amq.snapshot("ta", ref.parent_id)).allowed == 1
            with pytest.raises(InvalidArgument, match="min_success"):
                await amq.add_flow("ta", _children(10, set()), min_success=11)
        finally:
            await amq.close()

    asyncio.run(main())


def test_flow_show_prints_failed_so_far_and_allowed(
    backend: Backend, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from echomq_core.cli import main

    mq = backend.client(prefix)
    ref = mq.add_flow("tv", _children(10, {4}), min_success=0.8, barrier=True)
    url = backend.url.replace("redis://", "redis+cluster://") if backend.cluster else backend.url
    conn = ["--url", url, "--prefix", prefix]
    capsys.readouterr()
    assert main(["flow", "show", "tv", ref.parent_id, *conn]) == 0
    assert "  threshold     0 failed so far / 2 allowed" in capsys.readouterr().out.splitlines()
    work_off(mq, ["tv"], lambda j: j.payload, die=_dies)
    assert main(["flow", "show", "tv", ref.parent_id, *conn]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  parent state  released, 1 failed of 10, 2 allowed" in lines
    assert "  threshold     1 failed so far / 2 allowed" in lines
    assert any(line.startswith(f"  failed child  {ref.parent_id}.4") for line in lines)
    mq.close()


def test_the_tip_parks_the_same_queue_children_in_its_own_step(mq: EchoMQ) -> None:
    """No Pump runs: the tipping fail alone makes the flow's unstarted children in the parent's
    queue unclaimable (a retrying one too); the leased one may still finish. A flow bigger
    than the tip's bound parks the window from the tipping child's index on, and the
    follow-up the rest."""
    from echomq_core.flows.lifecycle import PARK_CHUNK

    ref = mq.add_flow("tq", [Child(i, max_attempts=2) for i in range(8)], min_success=8)
    pid = ref.parent_id
    q = mq.queue("tq")
    jobs = q.claim(3)
    q.fail(jobs[1], "try again")  # child 1 retries later (delayed)
    q.fail(jobs[0], "first", retry=False)  # buried now: 1 > 0 allowed, the tip
    assert mq.snapshot("tq", pid).parent_state == "failed"
    assert q.claim(100) == []
    assert mq.get_job("tq", f"{pid}.1").state == "delayed"
    assert q.complete_many([(jobs[2], "leased before the tip")]) == [True]
    pump = Pump(mq, ["tq"])
    try:
        assert pump.tick().stopped == 6  # children 1 and 3..7
    finally:
        pump.release_leases()
    assert {mq.get_job("tq", f"{pid}.{i}").state for i in (1, 3, 4, 5, 6, 7)} == {"cancelled"}
    assert q.stats()["delayed"] == 0

    n = PARK_CHUNK + 2000
    big = mq.add_flow("tq", [Child(i, max_attempts=1) for i in range(n)], min_success=n)
    jobs = q.claim(1001)
    q.fail(jobs[1000], "the tip at index 1000")
    after = q.claim(3)  # beyond the tip's window: still claimable until the follow-up
    assert [j.id for j in after] == [f"{big.parent_id}.{i}" for i in (6000, 6001, 6002)]
    pump = Pump(mq, ["tq"])
    try:
        pump.tick()
    finally:
        pump.release_leases()
    assert q.claim(10) == []
    assert q.stats()["delayed"] == 0


@pytest.mark.parametrize("cross", [False, True], ids=["same-queue", "cross-queue"])
def test_repair_before_the_follow_up_ran(backend: Backend, prefix: str, cross: bool) -> None:
    """The tip parked children (same-queue) and no drainer ran the follow-up yet: the repair
    finishes the follow-up first, so the parked children run again and the flow releases; the
    late 'x' then changes nothing."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "tz")
    child_q = work if cross else parents
    ref = mq.add_flow(parents, _children(6, {0}, child_q), min_success=6, barrier=True)
    pid = ref.parent_id
    (job,) = mq.queue(child_q).claim(1)
    mq.queue(child_q).fail(job, "boom")
    if cross:
        deliver_without_trim(mq, [work], "pump-that-dies", lease_ms=1)
    assert mq.snapshot(parents, pid).parent_state == "failed"
    assert mq.retry_flow(parents, pid).state == "held"
    _invariant(mq, parents, pid)
    time.sleep(0.01)  # the dead Pump's 1 ms outbox lease lapses
    work_off(mq, [parents, work], lambda j: j.payload)  # the late 'x' is drained here too
    snap = mq.snapshot(parents, pid)
    assert (snap.parent_state, snap.processed, snap.failed) == ("released", 6, 0)
    assert mq.queue(child_q).stats()["delayed"] == 0
    mq.close()


def test_a_tipped_flow_expires_once_its_follow_up_ran(mq: EchoMQ) -> None:
    """Its cancelled children never settle, so 'a failed flow waits until its children are
    settled' must not keep it (and their rows) for ever: once `stopped`, it expires."""
    from echomq_core import JobNotFound
    from echomq_core.flows.retention import SETTINGS

    ref = mq.add_flow("te", _children(6, {0}), min_success=6, barrier=True)
    pid = ref.parent_id
    (job,) = mq.queue("te").claim(1)
    mq.queue("te").fail(job, "boom")
    mq.set_retention("te", **{n: 0 for n in SETTINGS if n.endswith("_age")})
    sweeper = Pump(mq, ["te"], sweep_every=0, maintain_every=0)
    try:
        expired = sweeper.tick().expired + sweeper.tick().expired  # follow-up, then the sweep
    finally:
        sweeper.release_leases()
    assert ("te", pid) in expired
    assert mq.snapshot("te", pid).parent_state is None
    for i in range(6):
        with pytest.raises(JobNotFound):
            mq.get_job("te", f"{pid}.{i}")


def test_a_parked_worker_run_sub_flow_is_cancelled_out_of_delayed(mq: EchoMQ) -> None:
    """A same-queue sub-flow released to pending (its parent job waiting for a worker) is
    parked by the tip like a leaf; the follow-up's cancel of that node takes it out of
    delayed too, so nothing of the flow stays queued."""
    ref = mq.add_flow(
        "tn",
        [Child("a", children=[Child(1)]), Child(DOOMED, max_attempts=1)],
        min_success=2,
        barrier=True,
    )
    pid = ref.parent_id
    q = mq.queue("tn")
    jobs = {j.id: j for j in q.claim(2)}
    assert set(jobs) == {f"{pid}.0.0", f"{pid}.1"}
    q.complete_many([(jobs[f"{pid}.0.0"], 1)])  # the sub-flow is released: pending
    assert mq.get_job("tn", f"{pid}.0").state == "pending"
    q.fail(jobs[f"{pid}.1"], "boom")  # the tip parks the sub-flow's parent job
    assert q.claim(10) == []
    pump = Pump(mq, ["tn"])
    try:
        pump.tick()
    finally:
        pump.release_leases()
    assert mq.get_job("tn", f"{pid}.0").state == "cancelled"
    assert (q.stats()["pending"], q.stats()["delayed"]) == (0, 0)


def test_a_capped_flow_admits_nothing_once_parked(backend: Backend, prefix: str) -> None:
    """max_running and min_success together, cross-queue: the follow-up's park marks the cap
    gate off, so a leased child that completes before the walk admits no waiting one."""
    from echomq_core.flows.lifecycle import stop_unstarted

    from ..flowkit import run_steps

    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "tg")
    kids = _children(8, {0}, work)
    ref = mq.add_flow(parents, kids, min_success=8, max_running=2, barrier=True)
    pid = ref.parent_id
    q = mq.queue(work)
    jobs = q.claim(10)
    assert len(jobs) == 2  # the cap
    doomed = next(j for j in jobs if j.payload == DOOMED)
    other = next(j for j in jobs if j.payload != DOOMED)
    q.fail(doomed, "boom")  # its token admits the next child
    deliver_without_trim(mq, [work], "pump-that-dies", lease_ms=1)  # the tip
    assert mq.snapshot(parents, pid).parent_state == "failed"
    run_steps(mq, stop_unstarted(mq.keys, parents, pid), 2)  # the read and the park; then dies
    assert q.complete_many([(other, "done")]) == [True]  # returns its token
    assert q.claim(10) == []
    time.sleep(0.01)  # the dead Pump's 1 ms outbox lease lapses
    pump = Pump(mq, [parents, work])
    try:
        pump.tick()
    finally:
        pump.release_leases()
    states = {mq.get_job(work, f"{pid}.{i}").state for i in range(8)}
    assert states == {"dead", "completed", "cancelled"}
    assert (q.stats()["pending"], q.stats()["delayed"]) == (0, 0)
    mq.close()


def test_a_same_queue_capped_flow_admits_nothing_after_the_tip(mq: EchoMQ) -> None:
    """The tipping death's own token, and a leased child's completion before the follow-up,
    admit no waiting child of a tipped flow (its gate is marked off in the tipping step)."""
    ref = mq.add_flow("tgs", _children(8, {0}), min_success=8, max_running=2, barrier=True)
    q = mq.queue("tgs")
    jobs = q.claim(10)
    assert len(jobs) == 2
    doomed = next(j for j in jobs if j.payload == DOOMED)
    other = next(j for j in jobs if j.payload != DOOMED)
    q.fail(doomed, "boom")  # the tip; no Pump runs the follow-up yet
    assert q.claim(10) == []
    assert q.complete_many([(other, "done")]) == [True]
    assert q.claim(10) == []
    pump = Pump(mq, ["tgs"])
    try:
        pump.tick()
    finally:
        pump.release_leases()
    pid = ref.parent_id
    assert {mq.get_job("tgs", f"{pid}.{i}").state for i in range(2, 8)} == {"cancelled"}
    cap = mq.flow_cap("tgs", pid)
    assert cap is not None and (cap.admitted, cap.waiting) == (0, 0)  # tokens all returned
