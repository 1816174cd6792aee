"""Flow lifecycle I (issue 13): barrier flows read from outside and closed by their reader;
retention on the server for every end state; the sweep forgets a flow as a unit across its
queues and never what a live flow needs; children claimable in the order given. On standalone
and on the Cluster with the parent and child queues on different nodes."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    Child,
    EchoMQ,
    FlowConflict,
    FlowRef,
    InvalidArgument,
    JobNotFound,
    Pump,
)
from echomq_core.flows.retention import SETTINGS

from ..conftest import Backend
from ..flowkit import keys_of, work_off

ALL_ZERO = {name: 0 for name in SETTINGS if name.endswith("_age")}


def job_keys(backend: Backend, prefix: str) -> list[str]:
    """Every row, counter and record left (queue-level structures aside)."""
    return sorted(k for k in keys_of(backend, prefix) if ":job:" in k or ":ref:" in k)


def sweep(mq: EchoMQ, queues: list[str], rounds: int = 10) -> Pump:
    """Tick a sweeping Pump until a tick forgets nothing (bounded); then stop it, giving up
    its sweep lease (the next one may be another Pump)."""
    pump = Pump(mq, queues, sweep_every=0, maintain_every=0)
    try:
        _ticks(pump, rounds)
    finally:
        pump.release_leases()
    return pump


def _ticks(pump: Pump, rounds: int) -> None:
    for _ in range(rounds):
        stats = pump.tick()
        if not stats.swept and not stats.busy:
            return


def test_a_barrier_flow_is_released_readable_never_claimed_and_closed(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "bar")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(20)], payload="p", barrier=True)
    assert [f.parent_id for f in mq.list_flows(parents, "held")] == [ref.parent_id]
    (summary,) = mq.list_flows(parents)
    assert (summary.state, summary.total, summary.settled) == ("held", 20, 0)
    with pytest.raises(FlowConflict, match="held"):
        mq.close_flow(parents, ref.parent_id)
    work_off(mq, [parents, work], lambda job: job.payload * 10)
    snap = mq.wait(parents, ref.parent_id, timeout=5)
    assert (snap.parent_state, snap.released, snap.processed) == ("released", True, 20)
    assert mq.queue(parents).stats()["pending"] == 0  # no worker ever gets the parent
    assert mq.queue(parents).claim(10) == []
    assert len(mq.children_values(parents, ref.parent_id)) == 20
    (summary,) = mq.list_flows(parents)
    assert (summary.state, summary.settled) == ("released", 20)
    assert mq.list_flows(parents, "held") == []
    assert mq.close_flow(parents, ref.parent_id) == "closed"
    assert mq.close_flow(parents, ref.parent_id) == "closed"  # idempotent
    assert mq.snapshot(parents, ref.parent_id).parent_state == "closed"
    assert mq.wait(parents, ref.parent_id, timeout=1).released  # reads still work
    assert [f.state for f in mq.list_flows(parents)] == ["closed"]
    mq.close()


def test_close_refuses_what_is_not_a_closable_root(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cl")
    with pytest.raises(JobNotFound):
        mq.close_flow(parents, "JOB-nothing")
    mq.queue(parents).add(1, job_id="JOB-plain")
    with pytest.raises(FlowConflict, match="not a flow parent"):
        mq.close_flow(parents, "JOB-plain")
    nested = mq.add_flow(parents, [Child("sub", children=[Child(1, queue=work)])], barrier=True)
    with pytest.raises(FlowConflict, match="close the root"):
        mq.close_flow(parents, nested.parent_id + ".0")
    failing = mq.add_flow(parents, [Child(1, queue=work, max_attempts=1)], barrier=True)
    work_off(mq, [parents, work], die=lambda job: job.queue == work)
    assert mq.close_flow(parents, failing.parent_id) == "failed"  # its own retention runs
    failed = {f.parent_id for f in mq.list_flows(parents, "failed")}
    assert failed == {failing.parent_id, nested.parent_id}  # the nested child died too
    mq.close()


def test_a_closed_flow_expires_as_a_unit_across_queues(backend: Backend, prefix: str) -> None:
    """Rows, counters, records, explicit-id records, inner nodes in other queues, children's
    index entries and the named references: all gone, in every queue, and nothing else."""
    mq = backend.client(prefix)
    parents, a, b = backend.queues_on_distinct_nodes(3, "ux")
    queues = [parents, a, b]
    keep = mq.add_flow(parents, [Child(1, queue=a)], parent_id="JOB-keep", barrier=True)
    kids = [
        Child(1, queue=a),
        Child(2, queue=b, id="JOB-explicit"),
        Child("sub", queue=a, children=[Child(3, queue=b), Child(4, queue=parents)]),
        Child(5, queue=b, ignore_dependency_on_failure=True, max_attempts=1),
    ]
    ref = mq.add_flow(parents, kids, parent_id="JOB-gone", barrier=True)
    mq.queue(a).add("plain", job_id="JOB-plain-a")
    mq.save_ref("asset/gone", ref)
    mq.save_ref("asset/moved", ref)
    work_off(mq, queues, die=lambda job: job.payload == 5)
    assert mq.snapshot(parents, "JOB-gone").released
    mq.save_ref("asset/moved", keep)  # now points elsewhere: not the expiring flow's to drop
    for queue in queues:
        mq.set_retention(queue, **{**ALL_ZERO, "unclosed_age": 3600})
    before = job_keys(backend, prefix)
    assert any("JOB-gone.2" in k for k in before) and any("JOB-explicit" in k for k in before)
    sweep(mq, queues)
    assert mq.snapshot(parents, "JOB-gone").parent_state == "released"  # not closed yet
    assert mq.close_flow(parents, "JOB-gone") == "closed"
    pump = sweep(mq, queues)
    left = job_keys(backend, prefix)
    assert not [k for k in left if "JOB-gone" in k or "JOB-explicit" in k], left
    assert mq.load_ref("asset/gone") is None
    assert mq.load_ref("asset/moved") == FlowRef(parents, "JOB-keep")
    assert mq.snapshot(parents, "JOB-keep").parent_state == "released"  # another flow: kept
    assert mq.snapshot(parents, "JOB-gone").parent_state is None
    assert not any(k.endswith(":job:JOB-plain-a") for k in left)  # completed plain job: gone
    for queue in queues:
        assert mq.queue(queue).stats()["completed"] == 0
        assert mq.queue(queue).stats()["dead"] == 0
    assert pump.tick().swept == 0
    with pytest.raises(JobNotFound):
        mq.close_flow(parents, "JOB-gone")
    mq.close()


def test_held_flows_and_their_children_are_never_swept(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "hd")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(10)], barrier=True)
    q = mq.queue(work)
    leased = q.claim(4)  # some done, some leased, the rest pending
    q.complete_many([(job, job.payload) for job in leased[:2]])
    pump = Pump(mq, [parents, work], sweep_every=None)
    pump.tick()  # deliver
    for queue in (parents, work):
        mq.set_retention(queue, **ALL_ZERO, completed_count=0, dead_count=0)
    before = job_keys(backend, prefix)
    sweep(mq, [parents, work])
    after = job_keys(backend, prefix)
    assert after == before, sorted(set(before) ^ set(after))
    snap = mq.snapshot(parents, ref.parent_id)
    assert (snap.parent_state, snap.processed, snap.dependencies) == ("held", 2, 8)
    assert all(q.complete_many([(job, job.payload) for job in leased[2:]]))
    work_off(mq, [parents, work], pump=pump)
    assert mq.snapshot(parents, ref.parent_id).processed == 10
    mq.close()


def test_a_failed_flow_waits_for_its_running_children_then_expires(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "fw")
    ref = mq.add_flow(parents, [Child(i, queue=work, max_attempts=1) for i in range(3)])
    q = mq.queue(work)
    first, *others = q.claim(3)
    assert q.fail(first, "boom", retry=False)
    pump = Pump(mq, [parents, work], sweep_every=None)
    pump.tick()
    assert mq.snapshot(parents, ref.parent_id).parent_state == "failed"
    for queue in (parents, work):
        mq.set_retention(queue, **ALL_ZERO)
    sweep(mq, [parents, work])
    assert mq.snapshot(parents, ref.parent_id).parent_state == "failed"  # children still run
    assert all(q.get_job(j.id).state == "active" for j in others)
    q.complete_many([(j, j.payload) for j in others])
    pump.tick()
    pump.release_leases()
    # re-checked a minute after the failed sweep looked: make that now
    mq.connection.client.zadd(mq.keys.flows(parents, "failed"), {ref.parent_id: 0})
    sweep(mq, [parents, work])
    assert mq.snapshot(parents, ref.parent_id).parent_state is None
    assert job_keys(backend, prefix) == []
    mq.close()


def test_unclosed_barrier_and_worker_run_flows_expire_by_their_own_settings(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "uw")
    barrier = mq.add_flow(parents, [Child(1, queue=work)], barrier=True)
    worker_run = mq.add_flow(parents, [Child(2, queue=work)])
    work_off(mq, [parents, work])  # runs the worker-run parent too
    assert mq.snapshot(parents, worker_run.parent_id).parent_state == "completed"
    mq.set_retention(parents, completed_age=0, unclosed_age=3600)
    mq.set_retention(work, completed_age=0)
    sweep(mq, [parents, work])
    assert mq.snapshot(parents, worker_run.parent_id).parent_state is None
    assert mq.snapshot(parents, barrier.parent_id).parent_state == "released"
    mq.set_retention(parents, unclosed_age=0)
    sweep(mq, [parents, work])
    assert mq.snapshot(parents, barrier.parent_id).parent_state is None
    assert job_keys(backend, prefix) == []
    mq.close()


@pytest.mark.onlystandalone
def test_counts_dead_and_poison_retention(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    q = mq.queue("cnt", max_attempts=1)
    ids = q.add_bulk(list(range(5)))
    for job in q.claim(5):
        q.complete(job, job.payload)
        time.sleep(0.003)  # distinct finish times (ms): the newest two are well defined
    mq.set_retention("cnt", completed_count=2)
    sweep(mq, ["cnt"])
    assert q.stats()["completed"] == 2
    assert [q.get_job(i).state for i in ids[-2:]] == ["completed", "completed"]
    with pytest.raises(JobNotFound):
        q.get_job(ids[0])
    dead = q.add("x")
    q.fail(q.claim()[0], "dies", retry=False)
    mq.set_retention("cnt", dead_age=0)
    sweep(mq, ["cnt"])
    with pytest.raises(JobNotFound):
        q.get_job(dead)
    client = mq.connection.client
    client.rpush(mq.keys.outbox("cnt"), b"garbage-1", b"garbage-2", b"garbage-3")
    pump = Pump(mq, ["cnt"], max_tries=1, sweep_every=None)
    for _ in range(3):
        pump.tick()
    assert q.stats()["poison"] == 3
    mq.set_retention("cnt", poison_count=1)
    sweep(mq, ["cnt"])
    assert q.stats()["poison"] == 1
    mq.set_retention("cnt", poison_age=0)
    sweep(mq, ["cnt"])
    assert q.stats()["poison"] == 0
    mq.close()


@pytest.mark.onlystandalone
def test_an_idle_sweep_writes_nothing_and_one_pump_sweeps_a_queue(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    q = mq.queue("idle")
    q.add_bulk(list(range(3)))
    for job in q.claim(3):
        q.complete(job, 1)
    lease = mq.keys.sweep_lease("idle")
    sweep(mq, ["idle"])
    assert not mq.connection.client.exists(lease)  # nothing was due: no lease, no write
    mq.set_retention("idle", completed_age=0)
    one, two = (Pump(mq, ["idle"], sweep_every=0, maintain_every=0) for _ in range(2))
    first, second = one.tick(), two.tick()
    assert (first.swept, second.swept) == (3, 0)
    assert mq.connection.client.get(lease) == one.id.encode()
    mq.close()


def test_retention_settings_round_trip_and_bad_ones_are_refused(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    assert mq.retention("cfg") == SETTINGS
    mq.set_retention("cfg", completed_age=60, failed_count=10, unclosed_age=None)
    got = mq.retention("cfg")
    assert (got["completed_age"], got["failed_count"], got["unclosed_age"]) == (60, 10, None)
    assert got["dead_age"] == SETTINGS["dead_age"]
    other = backend.client(prefix)  # another process sees the same settings
    assert other.retention("cfg") == got
    for bad in (
        {"completed_age": -1},
        {"completed_age": float("nan")},
        {"completed_age": "1d"},
        {"failed_count": 1.5},
        {"failed_count": -3},
        {"keep": 3},
    ):
        with pytest.raises(InvalidArgument):
            mq.set_retention("cfg", **bad)
    assert mq.retention("cfg") == got
    with pytest.raises(InvalidArgument):
        mq.list_flows("cfg", "sleeping")
    with pytest.raises(InvalidArgument):
        mq.add_flow("cfg", [Child(1)], barrier="yes")  # type: ignore[arg-type]
    other.close()
    mq.close()


def test_children_are_claimable_in_the_order_given_whatever_their_options(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "ord")
    kids: list[Child] = []
    for i in range(60):
        options: dict[str, Any] = {}
        if i % 7 == 0:
            options["ignore_dependency_on_failure"] = True
        if i % 11 == 0:
            options["max_attempts"] = 5
        if i % 13 == 0:
            options["timeout"] = 30
        kids.append(Child(i, queue=work if i % 2 else parents, **options))
    ref = mq.add_flow(parents, kids)
    for queue, parity in ((work, 1), (parents, 0)):
        claimed = [job.payload for job in mq.queue(queue).claim(100)]
        assert claimed == [i for i in range(60) if i % 2 == parity]
    assert ref.children[0] == (parents, ref.parent_id + ".0")
    mq.close()


def test_async_close_and_list(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "as")

    async def scenario() -> list[str]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            ref = await amq.add_flow(parents, [Child(1, queue=work)], barrier=True)
            held = [f.state for f in await amq.list_flows(parents)]
            await asyncio.to_thread(work_off, mq, [parents, work])
            await amq.wait(parents, ref.parent_id, timeout=5)
            closed = await amq.close_flow(parents, ref.parent_id)
            return [*held, closed, *[f.state for f in await amq.list_flows(parents)]]
        finally:
            await amq.close()

    assert asyncio.run(scenario()) == ["held", "closed", "closed"]
    mq.close()


def test_list_flows_pages_and_reports_ages(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    (queue,) = backend.queues_on_distinct_nodes(1, "pg")
    ids = [mq.add_flow(queue, [Child(i)], parent_id=f"JOB-f{i:02}").parent_id for i in range(25)]
    time.sleep(0.05)
    page1 = mq.list_flows(queue, "held", limit=10)
    page3 = mq.list_flows(queue, "held", limit=10, offset=20)
    assert [f.parent_id for f in page1] == ids[:10]
    assert [f.parent_id for f in page3] == ids[20:]
    assert all(f.age is not None and f.age >= 0.04 for f in page1)
    assert page1[0].to_dict()["state"] == "held"
    mq.close()
