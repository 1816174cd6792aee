"""Flow lifecycle II (issue 14): cancel a flow, repair a failed or cancelled one, replace a
changed one - on standalone and on the Cluster with parent and child queues on different
nodes; the invariant ``processed + ignored + dependencies == N`` checked after every step."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    Child,
    EchoMQ,
    FlowCancelled,
    FlowConflict,
    InvalidArgument,
    Job,
    JobNotFound,
    LeaseLost,
    ParentFailed,
    Pump,
    Worker,
)
from echomq_core.flows import lifecycle as lifecycle_ops

from ..conftest import Backend
from ..flowkit import keys_of, run_steps, work_off


def invariant(mq: EchoMQ, queue: str, parent_id: str) -> Any:
    snap = mq.snapshot(queue, parent_id)
    assert snap.processed + snap.ignored + snap.dependencies == snap.total, snap
    return snap


def test_cancel_stops_every_child_that_has_not_started(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, a, b = backend.queues_on_distinct_nodes(3, "cx")
    kids = [Child(i, queue=a if i % 2 else b) for i in range(60)]
    kids.append(Child("sub", queue=b, children=[Child(j, queue=a) for j in range(5)]))
    ref = mq.add_flow(parents, kids, barrier=True)
    pump = Pump(mq, [parents, a, b], sweep_every=None)
    qa, qb = mq.queue(a), mq.queue(b)
    qa.complete_many([(j, j.payload) for j in qa.claim(10)])  # done: values stay
    running = qb.claim(5)  # leased (running, or claimed and not started)
    retrying = qa.claim(1)
    qa.fail(retrying[0], "try again later")  # in delayed, with a backoff
    pump.tick()
    before = invariant(mq, parents, ref.parent_id)
    result = mq.cancel_flow(parents, ref.parent_id, reason="bad input file")
    assert (result.state, result.nodes) == ("cancelled", 2)
    assert result.children == 60 + 5 - 10  # all but the ten that completed
    for q in (qa, qb):
        stats = q.stats()
        assert (stats["pending"], stats["delayed"], stats["active"]) == (0, 0, 0), stats
    assert q.claim(100) == []
    with pytest.raises(LeaseLost):  # a running child's report changes nothing
        qb.complete(running[0], "late")
    pump.tick()
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.parent_state, snap.processed, snap.error) == ("cancelled", 10, "bad input file")
    assert snap.processed == before.processed
    assert len(mq.children_values(parents, ref.parent_id)) == 10  # the reads still work
    with pytest.raises(FlowCancelled, match="bad input file"):
        mq.wait(parents, ref.parent_id, timeout=1)
    assert mq.snapshot(b, ref.parent_id + ".60").parent_state == "cancelled"
    again = mq.cancel_flow(parents, ref.parent_id, reason="twice")  # idempotent
    assert (again.state, again.children) == ("cancelled", 0)
    assert mq.snapshot(parents, ref.parent_id).error == "bad input file"
    assert [f.parent_id for f in mq.list_flows(parents, "cancelled")] == [ref.parent_id]
    assert mq.close_flow(parents, ref.parent_id) == "cancelled"
    mq.close()


def test_reports_already_on_their_way_are_counted_never_release_and_are_not_poisoned(
    backend: Backend, prefix: str
) -> None:
    """Children that finished before the cancel: their reports are history, recorded as usual
    (a repair neither re-runs nor waits for them); the cancelled parent never releases."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cw")
    ref = mq.add_flow(parents, [Child(i, queue=work, max_attempts=1) for i in range(6)])
    q = mq.queue(work)
    jobs = q.claim(6)
    q.complete_many([(j, j.payload) for j in jobs[:3]])  # signals in the outbox
    q.fail(jobs[3], "died", retry=False)  # a failure signal too
    mq.cancel_flow(parents, ref.parent_id)
    pump = Pump(mq, [parents, work], max_tries=1, sweep_every=None)
    stats = pump.tick()
    pump.release_leases()
    assert (stats.delivered, stats.poisoned) == (4, 0)
    assert mq.snapshot(parents, ref.parent_id).parent_state == "cancelled"
    snap = mq.snapshot(parents, ref.parent_id)
    assert (snap.processed, snap.failed, snap.dependencies) == (3, 1, 3)
    assert q.stats()["poison"] == 0
    q.complete_many([(j, j.payload) for j in jobs[4:]])  # running: lease gone, refused
    assert mq.snapshot(parents, ref.parent_id).processed == 3
    result = mq.retry_flow(parents, ref.parent_id)  # re-runs the dead one and the two
    assert (result.state, result.requeued) == ("held", 3)
    work_off(mq, [parents, work])
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.parent_state, snap.processed) == ("completed", 6)
    mq.close()


@pytest.mark.parametrize("batch_jobs", [6])
def test_a_worker_drops_claimed_children_of_a_cancelled_flow_before_they_start(
    backend: Backend, prefix: str, batch_jobs: int
) -> None:
    """Slow handlers and a batch of claimed children: once cancel returns, at most the
    children whose handler was starting within one lease re-check (0.25 s) start."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cd")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(40)])
    started: list[tuple[float, int]] = []
    gate = threading.Event()

    def handle(job: Job) -> Any:
        started.append((time.monotonic(), job.payload))
        if len(started) >= batch_jobs:
            gate.set()
        time.sleep(0.1)
        return job.payload

    # fast_job=10 s: every job counts as fast, so the claim batch doubles (1, 2, 4, 8...)
    worker = Worker(mq, {work: handle}, concurrency=1, fast_job=10.0, max_batch=16).start()
    try:
        assert gate.wait(30)
        mq.cancel_flow(parents, ref.parent_id)
        returned = time.monotonic()
        time.sleep(1.5)
    finally:
        worker.stop()
    late = [p for t, p in started if t > returned]
    assert len(late) <= 3, (late, worker.dropped)  # at most 0.25 s of 0.1 s jobs
    assert worker.dropped > 0, "claimed, unstarted children were dropped"
    assert mq.queue(work).stats()["active"] == 0
    assert len(started) < 40
    mq.close()


def test_repair_reruns_only_the_dead_children_and_keeps_the_values(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, a, b = backend.queues_on_distinct_nodes(3, "rp")
    kids = [
        Child(i, queue=a if i % 2 else b, max_attempts=1, ignore_dependency_on_failure=i == 7)
        for i in range(40)
    ]
    ref = mq.add_flow(parents, kids, barrier=True)
    runs: dict[int, int] = {}
    broken = {3, 7, 12}

    def handler(job: Job) -> Any:
        runs[job.payload] = runs.get(job.payload, 0) + 1
        return job.payload * 2

    work_off(mq, [parents, a, b], handler, die=lambda job: job.payload in broken)
    snap = mq.snapshot(parents, ref.parent_id)
    assert snap.parent_state == "failed"
    assert set(mq.failed_children(parents, ref.parent_id)) == {
        f"{ref.parent_id}.3",
        f"{ref.parent_id}.12",
    }
    assert set(mq.ignored_failures(parents, ref.parent_id)) == {f"{ref.parent_id}.7"}
    result = mq.retry_flow(parents, ref.parent_id)  # "the bug was fixed"
    assert (result.state, result.requeued, result.repairs) == ("held", 2, 1)
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.parent_state, snap.failed, snap.dependencies) == ("held", 0, 2)
    assert mq.failed_children(parents, ref.parent_id) == {}
    assert mq.queue(b).get_job(f"{ref.parent_id}.12").attempts == 0
    assert [f.state for f in mq.list_flows(parents)] == ["held"]
    broken.clear()
    work_off(mq, [parents, a, b], handler)
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.parent_state, snap.processed, snap.ignored) == ("released", 39, 1)
    # (a handler that "dies" here never returned: runs counts the successful runs)
    assert runs[3] == runs[12] == 1 and 7 not in runs  # ignored failures are not re-run...
    assert all(runs[i] == 1 for i in range(40) if i != 7)  # ...nor completed ones
    again = mq.retry_flow(parents, ref.parent_id, ignored=True)  # ...unless asked
    assert (again.state, again.requeued, again.repairs) == ("held", 1, 2)
    invariant(mq, parents, ref.parent_id)
    work_off(mq, [parents, a, b], handler)
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.parent_state, snap.processed, snap.ignored) == ("released", 40, 0)
    assert mq.children_values(parents, ref.parent_id)[f"{ref.parent_id}.7"] == 14
    with pytest.raises(FlowConflict, match="nothing to repair"):
        mq.close_flow(parents, ref.parent_id)
        mq.retry_flow(parents, ref.parent_id)
    mq.close()


def test_repair_of_nested_flows_is_bottom_up(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, mid, leaves = backend.queues_on_distinct_nodes(3, "rn")
    sub = Child(
        "sub", queue=mid, children=[Child(j, queue=leaves, max_attempts=1) for j in range(4)]
    )
    ref = mq.add_flow(parents, [Child(0, queue=leaves), sub])
    work_off(mq, [parents, mid, leaves], die=lambda job: job.payload == 2)
    assert mq.snapshot(parents, ref.parent_id).parent_state == "failed"
    assert mq.snapshot(mid, ref.parent_id + ".1").parent_state == "failed"
    result = mq.retry_flow(parents, ref.parent_id)
    assert (result.state, result.nodes, result.requeued) == ("held", 2, 1)
    assert mq.snapshot(mid, ref.parent_id + ".1").parent_state == "held"
    work_off(mq, [parents, mid, leaves])
    assert mq.snapshot(parents, ref.parent_id).parent_state == "completed"  # worker-run root
    assert mq.snapshot(mid, ref.parent_id + ".1").processed == 4
    mq.close()


def test_a_cancelled_flow_is_repaired_by_running_what_never_ran(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rc")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(20)], barrier=True)
    q = mq.queue(work)
    q.complete_many([(j, j.payload) for j in q.claim(8)])
    leased = q.claim(2)
    mq.cancel_flow(parents, ref.parent_id, reason="paused")
    result = mq.retry_flow(parents, ref.parent_id)
    assert (result.state, result.requeued) == ("held", 12)
    with pytest.raises(LeaseLost):
        q.complete(leased[0], "from before the cancel")
    runs: list[int] = []
    work_off(mq, [parents, work], lambda job: runs.append(job.payload) or job.payload)
    snap = invariant(mq, parents, ref.parent_id)
    assert (snap.parent_state, snap.processed) == ("released", 20)
    assert sorted(runs) == list(range(8, 20))
    mq.close()


def test_a_repair_cut_short_is_completed_by_a_retry(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, a, b = backend.queues_on_distinct_nodes(3, "rx")
    ref = mq.add_flow(
        parents, [Child(i, queue=a if i % 2 else b, max_attempts=1) for i in range(30)]
    )
    work_off(mq, [parents, a, b], die=lambda job: job.payload % 5 == 0)
    for cut in (1, 2):  # after the parent flipped; after some children went back
        run_steps(
            mq,
            lifecycle_ops.retry_flow(mq.keys, parents, ref.parent_id, ignored=False),
            cut,
            partial=1,
        )
        invariant(mq, parents, ref.parent_id)
    result = mq.retry_flow(parents, ref.parent_id)
    assert result.state == "held"
    stats = [mq.queue(q).stats() for q in (a, b)]
    assert sum(s["pending"] for s in stats) == 6 and sum(s["dead"] for s in stats) == 0
    assert not any(":repair" in k for k in keys_of(backend, prefix))  # the record is gone
    work_off(mq, [parents, a, b])
    assert mq.snapshot(parents, ref.parent_id).parent_state == "completed"
    mq.close()


def test_replace_swaps_a_changed_flow_under_the_same_parent_id(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rr")
    old = mq.add_flow(
        parents, [Child(i, queue=work) for i in range(100)], parent_id="JOB-r", barrier=True
    )
    q = mq.queue(work)
    done = q.claim(10)
    q.complete_many([(j, j.payload) for j in done[:5]])  # one report on its way, one running
    with pytest.raises(FlowConflict, match="100 children, not 101"):
        mq.add_flow(parents, [Child(i, queue=work) for i in range(101)], parent_id="JOB-r")
    new = mq.add_flow(
        parents,
        [Child(i, queue=work) for i in range(101)],
        parent_id="JOB-r",
        barrier=True,
        replace=True,
    )
    assert new.children[0] == (work, "JOB-r.g1.0")
    assert old.children[0] == (work, "JOB-r.0")
    snap = invariant(mq, parents, "JOB-r")
    assert (snap.parent_state, snap.total, snap.processed) == ("held", 101, 0)
    with pytest.raises(LeaseLost):
        q.complete(done[5], "old generation, running")
    pump = Pump(mq, [parents, work], max_tries=1, sweep_every=None)
    pump.tick()  # the old generation's signals are delivered, and change nothing
    pump.release_leases()
    snap = invariant(mq, parents, "JOB-r")
    assert snap.processed == 0 and q.stats()["poison"] == 0
    assert not [k for k in keys_of(backend, prefix) if k.endswith(":job:JOB-r.3")]
    assert (
        mq.add_flow(
            parents,
            [Child(i, queue=work) for i in range(101)],
            parent_id="JOB-r",
            barrier=True,
            replace=True,
        )
        == new
    )  # a retry converges
    work_off(mq, [parents, work])
    snap = invariant(mq, parents, "JOB-r")
    assert (snap.parent_state, snap.processed) == ("released", 101)
    assert set(mq.children_values(parents, "JOB-r")) == {f"JOB-r.g1.{i}" for i in range(101)}
    third = mq.add_flow(parents, [Child("x", queue=work)], parent_id="JOB-r", replace=True)
    assert third.children == ((work, "JOB-r.g2.0"),)
    with pytest.raises(InvalidArgument, match="parent_id"):
        mq.add_flow(parents, [Child(1)], replace=True)
    mq.close()


def _shapes(work: str) -> dict[str, list[Child]]:
    """Flows of two children that differ only below the root: the same child ids and queues."""
    return {
        "leaves": [Child({"n": 1}, queue=work), Child({"n": 2}, queue=work)],
        "payload": [Child({"n": 1}, queue=work), Child({"n": 3}, queue=work)],
        "policy": [
            Child({"n": 1}, queue=work),
            Child({"n": 2}, queue=work, ignore_dependency_on_failure=True),
        ],
        "sub-flow": [Child(children=[Child({"n": 5}, queue=work)]), Child({"n": 2}, queue=work)],
        "wider sub-flow": [
            Child(children=[Child({"n": 5}, queue=work), Child({"n": 6}, queue=work)]),
            Child({"n": 2}, queue=work),
        ],
    }


@pytest.mark.parametrize("first", ["leaves", "sub-flow"])
def test_replace_compares_the_whole_tree_not_only_the_roots_children(
    backend: Backend, prefix: str, first: str
) -> None:
    """A replacing add of a flow that differs only below the root (a payload, a policy, a leaf
    that became a sub-flow, a sub-flow of other children) replaces it; the same flow again
    converges to it. Parent ids as the Airflow provider derives them (with '/')."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rt")
    shapes = _shapes(work)
    for name, children in shapes.items():
        if name == first:
            continue
        pid = f"JOB-af/dag/fan_out/{first}-{name}".replace(" ", "_")
        old = mq.add_flow(parents, shapes[first], parent_id=pid, barrier=True, replace=True)
        again = mq.add_flow(parents, shapes[first], parent_id=pid, barrier=True, replace=True)
        assert again == old, name  # the same flow: converged, not replaced
        new = mq.add_flow(parents, children, parent_id=pid, barrier=True, replace=True)
        assert new.children[0][1] == f"{pid}.g1.0", name
        assert mq.add_flow(parents, children, parent_id=pid, barrier=True, replace=True) == new
        work_off(mq, [parents, work])
        snap = invariant(mq, parents, pid)
        assert (snap.parent_state, snap.total) == ("released", 2), name
        values = mq.children_values(parents, pid)
        assert set(values) == {f"{pid}.g1.0", f"{pid}.g1.1"}, name
    mq.close()


def test_replace_of_a_flow_added_without_replace_swaps_a_changed_sub_flow(
    backend: Backend, prefix: str
) -> None:
    """A flow first added without ``replace`` keeps no digest of its tree: a replacing add
    whose root matches but whose sub-flow does not still replaces it (it was refused with
    FlowConflict from the sub-flow's hold)."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rn")
    shapes = _shapes(work)
    for first, then in (("leaves", "sub-flow"), ("sub-flow", "wider sub-flow")):
        pid = f"JOB-af/dag/fan_out/{first}-{then}".replace(" ", "_")
        mq.add_flow(parents, shapes[first], parent_id=pid, barrier=True)
        with pytest.raises(FlowConflict):
            mq.add_flow(parents, shapes[then], parent_id=pid, barrier=True)
        new = mq.add_flow(parents, shapes[then], parent_id=pid, barrier=True, replace=True)
        assert new.children[0][1] == f"{pid}.g1.0"
        work_off(mq, [parents, work])
        assert invariant(mq, parents, pid).parent_state == "released"
    mq.close()


def test_cancel_and_retry_refuse_what_is_not_a_flow_root(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cr")
    with pytest.raises(JobNotFound):
        mq.cancel_flow(parents, "JOB-none")
    with pytest.raises(JobNotFound):
        mq.retry_flow(parents, "JOB-none")
    mq.queue(parents).add(1, job_id="JOB-plain")
    with pytest.raises(FlowConflict, match="not a flow parent"):
        mq.cancel_flow(parents, "JOB-plain")
    ref = mq.add_flow(parents, [Child("sub", queue=work, children=[Child(1, queue=work)])])
    with pytest.raises(FlowConflict, match="cancel the root"):
        mq.cancel_flow(work, ref.parent_id + ".0")
    with pytest.raises(InvalidArgument):
        mq.cancel_flow(parents, ref.parent_id, reason="x" * 1001)
    with pytest.raises(ParentFailed):  # FlowCancelled is a ParentFailed
        mq.cancel_flow(parents, ref.parent_id)
        mq.wait(parents, ref.parent_id, timeout=1)
    mq.close()


def test_async_cancel_and_retry(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "ac")

    async def scenario() -> list[str]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            ref = await amq.add_flow(parents, [Child(i, queue=work) for i in range(3)])
            cancelled = await amq.cancel_flow(parents, ref.parent_id, reason="r")
            repaired = await amq.retry_flow(parents, ref.parent_id)
            return [cancelled.state, repaired.state, str(repaired.requeued)]
        finally:
            await amq.close()

    assert asyncio.run(scenario()) == ["cancelled", "held", "3"]
    work_off(mq, [parents, work])
    mq.close()


@pytest.mark.parametrize("how", ["tipped", "cancelled"])
def test_a_death_on_its_way_at_the_repair_is_counted_once(
    backend: Backend, prefix: str, how: str
) -> None:
    """A repaired tipped or cancelled flow runs its cancelled children again, and the deaths it
    recorded; a child in another queue that died before the repair, whose report was still in
    that queue's outbox, is not run again: its report counts when the Pump delivers it (run
    again, its death and its new result were both counted - the model test found it: the
    counter went one below what was left to run)."""
    mq = backend.client(prefix)
    parents, other = backend.queues_on_distinct_nodes(2, "rq")
    kids = [
        Child(0, queue=parents, max_attempts=1),
        Child(1, queue=other, max_attempts=1),
        Child(2, queue=parents, max_attempts=1),
        Child(3, queue=other, max_attempts=1, ignore_dependency_on_failure=True),
        Child(4, queue=other, max_attempts=1),
    ]
    pid = "JOB-rq/1"
    mq.add_flow(parents, kids, parent_id=pid, min_success=4 if how == "tipped" else None)
    pump = Pump(mq, [parents, other], page=10_000, sweep_every=None)
    qp, qo = mq.queue(parents), mq.queue(other)
    # 1 and 3 die in the other queue: their reports wait in its outbox (no Pump tick yet)
    dying = qo.claim(2)
    assert sorted(j.id for j in dying) == [f"{pid}.1", f"{pid}.3"]
    assert qo.fail_many([(j, f"err {j.id}", False) for j in dying]) == [2, 2]
    if how == "tipped":  # 0 and 2 die in the parent's queue: the second one tips the flow
        assert qp.fail_many([(j, f"err {j.id}", False) for j in qp.claim(2)]) == [2, 2]
        assert mq.snapshot(parents, pid).parent_state == "failed"
    else:
        mq.cancel_flow(parents, pid, reason="stop")
    repaired = mq.retry_flow(parents, pid)
    # tipped: 0 and 2 (recorded deaths) and 4 (cancelled by the tip's follow-up); cancelled: 0,
    # 2 and 4 (cancelled). Never 1 or 3.
    assert repaired.requeued == 3, repaired
    pump.tick()  # the reports of 1 (fail-parent) and 3 (ignored) arrive
    assert mq.failed_children(parents, pid) == {f"{pid}.1": f"err {pid}.1"}
    assert mq.ignored_failures(parents, pid) == {f"{pid}.3": f"err {pid}.3"}
    snap = mq.snapshot(parents, pid)
    if how == "cancelled":  # no threshold: 1's death fails the repaired flow again
        assert snap.parent_state == "failed"
        return
    # 1's death tolerated (1 of 5 may die); 0, 2 and 4 run again
    assert (snap.parent_state, snap.failed, snap.ignored, snap.dependencies) == ("held", 1, 1, 3), (
        snap
    )
    again = [*qp.claim(10), *qo.claim(10)]
    assert sorted(j.id for j in again) == [f"{pid}.0", f"{pid}.2", f"{pid}.4"]
    for j in again:
        mq.queue(j.queue).complete(j, j.payload)
    pump.tick()
    snap = mq.snapshot(parents, pid)
    assert (snap.parent_state, snap.processed, snap.dependencies) == ("pending", 3, 0), snap
    assert mq.children_values(parents, pid) == {f"{pid}.{i}": i for i in (0, 2, 4)}
    mq.close()
