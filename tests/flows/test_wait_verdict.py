"""The one rule of waiting on a flow (:mod:`echomq_core.flows.waiting`), driven over real flows on
real servers, standalone and Cluster: each verdict, the stall hint it carries, the pause
sequence, and the callers that drive it (the clients' waits, ``flow show --watch``), plus the
core's homes of the child-id grammar and of repair on re-add.

No test here depends on timing: a timeout or stall limit of 0 ends the wait on a known read,
and the pause sequence is judged at times the test passes in (``judge(..., now=...)``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    Child,
    EchoMQ,
    FlowCancelled,
    FlowWait,
    InvalidArgument,
    InvalidJobId,
    Job,
    JobNotFound,
    ParentFailed,
    Verdict,
)
from echomq_core.flows.lifecycle import repair_on_readd
from echomq_core.flows.waiting import (
    CANCELLED,
    CLOSED,
    FAILED,
    FAST_POLL,
    FIRST_POLL,
    MISSING,
    RELEASED,
    STALLED,
    TIMED_OUT,
    WAITING,
)
from echomq_core.seeing.inspection import read_tree
from echomq_core.wire.keyspace import child_stem, derived_index

from ..conftest import Backend
from ..flowkit import work_off


def two_queues(backend: Backend, stem: str) -> tuple[str, str]:
    """A parent queue and a child queue (on a Cluster, on two nodes: the children's signals
    go through an outbox and a Pump)."""
    parents, work = backend.queues_on_distinct_nodes(2, stem)
    return parents, work


def payload(job: Job) -> Any:
    return job.payload


def verdict(mq: EchoMQ, wait: FlowWait) -> Verdict:
    return mq.perform(wait.read(mq.keys))


# -- the verdicts ---------------------------------------------------------------------------


def test_released_then_closed(backend: Backend, mq: EchoMQ) -> None:
    parents, work = two_queues(backend, "vr")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(3)], barrier=True)
    wait = FlowWait(ref.queue, ref.parent_id, poll=0.1)
    held = verdict(mq, wait)
    assert (held.kind, held.done, held.ready) == (WAITING, False, False)
    assert held.snap.dependencies == 3 and held.pause > 0
    work_off(mq, [parents, work])
    released = verdict(mq, wait)
    assert (released.kind, released.done, released.ready, released.pause) == (
        RELEASED,
        True,
        True,
        0.0,
    )
    assert released.snap.processed == 3
    assert mq.wait(ref.queue, ref.parent_id, timeout=5).parent_state == "released"
    mq.close_flow(ref.queue, ref.parent_id)
    closed = verdict(mq, FlowWait(ref.queue, ref.parent_id, poll=0.1))
    assert (closed.kind, closed.ready, closed.never_released) == (CLOSED, True, False)
    # a closed flow is still read: a wait on it returns at once
    assert mq.wait(ref.queue, ref.parent_id, timeout=0).parent_state == "closed"


def test_failed_names_the_child(backend: Backend, mq: EchoMQ) -> None:
    parents, work = two_queues(backend, "vf")
    ref = mq.add_flow(parents, [Child(i, queue=work, max_attempts=1) for i in range(3)])
    work_off(mq, [parents, work], die=lambda job: job.payload == 1)
    seen = verdict(mq, FlowWait(ref.queue, ref.parent_id, poll=0.1))
    assert (seen.kind, seen.done, seen.never_released, seen.ready) == (FAILED, True, True, False)
    dead = f"{ref.parent_id}.1"
    with pytest.raises(ParentFailed) as caught:
        mq.wait(ref.queue, ref.parent_id, timeout=5)
    assert caught.value.failed == {dead: f"died: {dead}"}
    assert not isinstance(caught.value, FlowCancelled)

    async def async_wait() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=mq.keys.prefix)
        try:
            await amq.wait(ref.queue, ref.parent_id, timeout=5)
        finally:
            await amq.close()

    with pytest.raises(ParentFailed) as caught:
        asyncio.run(async_wait())
    assert caught.value.failed == {dead: f"died: {dead}"}


def test_cancelled(backend: Backend, mq: EchoMQ) -> None:
    parents, work = two_queues(backend, "vc")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(2)])
    mq.cancel_flow(ref.queue, ref.parent_id, reason="bad input")
    seen = verdict(mq, FlowWait(ref.queue, ref.parent_id, poll=0.1))
    assert (seen.kind, seen.done, seen.never_released) == (CANCELLED, True, True)
    assert seen.snap.error == "bad input"
    with pytest.raises(FlowCancelled, match="bad input"):
        mq.wait(ref.queue, ref.parent_id, timeout=5)


def test_missing_waits_or_ends(mq: EchoMQ) -> None:
    waiting = verdict(mq, FlowWait("vm", "JOB-never-added", poll=0.1))
    assert (waiting.kind, waiting.done) == (MISSING, False)  # another system may add it
    assert waiting.pause == FIRST_POLL
    ended = verdict(mq, FlowWait("vm", "JOB-never-added", poll=0.1, missing_ok=False))
    assert (ended.kind, ended.done, ended.ready) == (MISSING, True, False)
    # EchoMQ.wait ends at once on a missing flow (issue 48): no timeout run out first
    with pytest.raises(JobNotFound, match="no flow 'JOB-never-added' in queue 'vm'"):
        mq.wait("vm", "JOB-never-added", timeout=60)


def test_timed_out_carries_the_stall_hint(backend: Backend, mq: EchoMQ) -> None:
    parents, work = two_queues(backend, "vt")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(2)], barrier=True)
    seen = verdict(mq, FlowWait(ref.queue, ref.parent_id, poll=0.1, timeout=0))
    assert (seen.kind, seen.done, seen.gave_up, seen.ready) == (TIMED_OUT, True, True, False)
    assert seen.hint == f"{work!r} has 2 pending job(s) and none running: does a worker serve it?"
    # a judge handed no stall reading still times out, without a hint
    bare = FlowWait(ref.queue, ref.parent_id, poll=0.1, timeout=0)
    assert bare.judge(mq.snapshot(ref.queue, ref.parent_id)).hint == ""


def test_stalled_unless_a_child_runs(backend: Backend, mq: EchoMQ) -> None:
    """stall_timeout=0: the first read is progress (the wait starts), the second, with no
    child settled, is a stall - unless a child is running (leased)."""
    parents, work = two_queues(backend, "vs")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(2)], barrier=True)
    wait = FlowWait(ref.queue, ref.parent_id, poll=0.1, stall_timeout=0)
    assert verdict(mq, wait).kind == WAITING
    stalled = verdict(mq, wait)
    assert (stalled.kind, stalled.done, stalled.gave_up) == (STALLED, True, True)
    assert f"{work!r} has 2 pending job(s) and none running" in stalled.hint

    q = mq.queue(work)
    (running,) = q.claim(1)  # a child that runs long: leased, not settled
    wait = FlowWait(ref.queue, ref.parent_id, poll=0.1, stall_timeout=0)
    assert verdict(mq, wait).kind == WAITING
    assert verdict(mq, wait).kind == WAITING  # busy: not a stall
    q.complete(running, 1)  # cross-queue and no Pump: the signal waits in the outbox
    after = verdict(mq, wait)  # nothing settled, nothing runs: a stall, and the hint says why
    assert after.kind == STALLED
    assert f"the outbox of {work!r} holds 1 signal(s) and nothing drains it" in after.hint


# -- the pause ------------------------------------------------------------------------------


def test_the_pause_grows_from_5_ms_to_poll(mq: EchoMQ) -> None:
    ref = mq.add_flow("vp", [Child(i) for i in range(4)], barrier=True)
    snap = mq.snapshot(ref.queue, ref.parent_id)
    wait = FlowWait(ref.queue, ref.parent_id, poll=0.05)
    at, pauses = wait.started, []
    for _ in range(8):
        v = wait.judge(snap, now=at)
        pauses.append(v.pause)
        at += v.pause
    assert pauses == pytest.approx(
        [0.005, 0.0075, 0.01125, 0.016875, 0.0253125, 0.03796875, 0.05, 0.05]
    )
    # a caller whose first read comes late anyway (the trigger) starts at poll
    late = FlowWait(ref.queue, ref.parent_id, poll=0.05, first=0.05)
    assert late.judge(snap, now=late.started).pause == 0.05


def test_the_pause_shrinks_as_children_settle_and_meets_the_deadline(mq: EchoMQ) -> None:
    ref = mq.add_flow("vq", [Child(i) for i in range(100)], barrier=True)
    wait = FlowWait(ref.queue, ref.parent_id, poll=1.0, first=1.0, timeout=10)
    t0 = wait.started
    assert wait.judge(mq.snapshot(ref.queue, ref.parent_id), now=t0).pause == 1.0
    q = mq.queue("vq")
    q.complete_many([(j, 1) for j in q.claim(90)])  # 90 settled in 1 s: 10 to go, ~0.11 s
    snap = mq.snapshot(ref.queue, ref.parent_id)
    assert (snap.settled, snap.dependencies) == (90, 10)
    assert wait.judge(snap, now=t0 + 1).pause == pytest.approx(10 / 90)
    q.complete_many([(j, 1) for j in q.claim(9)])  # 9 in 1 s: the last one at that rate
    last = wait.judge(mq.snapshot(ref.queue, ref.parent_id), now=t0 + 2)
    assert last.pause == pytest.approx(1 / 9)
    # close to the timeout, the pause ends at it
    assert wait.judge(last.snap, now=t0 + 9.97).pause == pytest.approx(0.03)
    assert wait.judge(last.snap, now=t0 + 10).kind == TIMED_OUT
    # the rate never makes a pause shorter than FAST_POLL
    near_ref = mq.add_flow("vq2", [Child(i) for i in range(100)], barrier=True)
    near = FlowWait(near_ref.queue, near_ref.parent_id, poll=1.0, first=1.0)
    near.judge(mq.snapshot(near_ref.queue, near_ref.parent_id), now=near.started)
    q2 = mq.queue("vq2")
    q2.complete_many([(j, 1) for j in q2.claim(99)])  # 99 in 1 s, 1 to go: 10 ms at that rate
    seen = near.judge(mq.snapshot(near_ref.queue, near_ref.parent_id), now=near.started + 1)
    assert seen.snap.dependencies == 1 and seen.pause == FAST_POLL


def test_bad_options_are_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match="poll"):
        FlowWait("q", "JOB-p", poll=0)
    with pytest.raises(InvalidArgument, match="timeout"):
        FlowWait("q", "JOB-p", poll=1, timeout=-1)
    with pytest.raises(InvalidArgument, match="stall_timeout"):
        FlowWait("q", "JOB-p", poll=1, stall_timeout=float("nan"))
    with pytest.raises(InvalidJobId):
        FlowWait("q", "not-a-job", poll=1)


# -- callers --------------------------------------------------------------------------------


@pytest.mark.onlystandalone
def test_flow_show_watch_ends_on_a_cancelled_flow(
    backend: Backend, mq: EchoMQ, proc_env: dict[str, str]
) -> None:
    """``--watch`` stops at a cancelled flow (exit 1, saying so) instead of waiting out its
    timeout for a release that cannot come."""
    ref = mq.add_flow("vw", [Child(1), Child(2)])
    mq.cancel_flow(ref.queue, ref.parent_id, reason="stop")
    conn = ["--url", backend.url, "--prefix", mq.keys.prefix]
    done = subprocess.run(
        [sys.executable, "-m", "echomq_core.cli", "flow", "show", "vw", ref.parent_id,
         "--watch", "--timeout", "20", *conn],
        env=proc_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert f"flow {ref.parent_id} cancelled" in done.stderr
    assert "not settled" not in done.stderr
    assert "parent state  cancelled" in done.stdout


# -- the child-id grammar and repair on re-add ----------------------------------------------


def test_derived_ids_are_read_back_in_every_generation(mq: EchoMQ) -> None:
    pid = "JOB-af/dag/task/abc"
    ref = mq.add_flow("vg", [Child(i) for i in range(3)], parent_id=pid)
    first = [cid for _, cid in ref.children]
    assert first == [f"{child_stem(pid)}{i}" for i in range(3)] == [f"{pid}.{i}" for i in range(3)]
    again = mq.add_flow("vg", [Child(i) for i in range(2)], parent_id=pid, replace=True)
    second = [cid for _, cid in again.children]
    assert second == [f"{pid}.g1.{i}" for i in range(2)]
    assert [derived_index(pid, cid) for cid in first + second] == [0, 1, 2, 0, 1]
    for other in (f"{pid}x.1", f"{pid}.gx.1", f"{pid}.g1", f"{pid}.a.1", "JOB-other.1", pid):
        assert derived_index(pid, other) is None, other


def test_repair_on_readd(backend: Backend, mq: EchoMQ) -> None:
    parents, work = two_queues(backend, "va")
    pid = "JOB-readd-1"
    children = [Child(i, queue=work, max_attempts=1) for i in range(3)]
    ref = mq.add_flow(parents, children, parent_id=pid, barrier=True)
    held = mq.perform(repair_on_readd(mq.keys, ref.queue, pid, repair=True))
    assert (held.broken, held.repaired) == (False, None)  # the earlier try's, still running
    work_off(mq, [parents, work], payload, die=lambda job: job.payload == 2)
    mq.add_flow(parents, children, parent_id=pid, barrier=True)  # the retry: converges
    kept = mq.perform(repair_on_readd(mq.keys, ref.queue, pid, repair=False))
    assert (kept.broken, kept.repaired, kept.snap.outcome) == (True, None, "failed")
    assert mq.snapshot(ref.queue, pid).outcome == "failed"  # repair=False: left as it is
    found = mq.perform(repair_on_readd(mq.keys, ref.queue, pid, repair=True))
    assert found.broken and found.snap.outcome == "failed"
    assert found.repaired is not None and found.repaired.requeued == 1
    assert mq.snapshot(ref.queue, pid).parent_state == "held"
    work_off(mq, [parents, work], payload)
    released = mq.perform(repair_on_readd(mq.keys, ref.queue, pid, repair=True))
    assert (released.broken, released.repaired, released.snap.outcome) == (
        False,
        None,
        "released",
    )
    assert mq.children_values(ref.queue, pid) == {f"{pid}.{i}": i for i in range(3)}


def test_the_tree_of_a_replaced_flow_finds_its_sub_flows(mq: EchoMQ) -> None:
    """``flow show`` and the dashboard look for a parent's unsettled sub-flows by their derived
    ids: in a replaced flow's generation those are ``<id>.g<n>.<i>``."""
    pid = "JOB-tree-replaced"
    mq.add_flow("vx", [Child(1), Child(2)], parent_id=pid)
    mq.add_flow("vx", [Child(children=[Child(2), Child(3)])], parent_id=pid, replace=True)
    tree = read_tree(mq, "vx", pid)
    assert [node.snap.parent_id for node in tree.subflows] == [f"{pid}.g1.0"]
    assert tree.subflows[0].snap.total == 2
