"""Holes in the counting promise, closed (issue 12, items 2, 3, 6 and 7): two flows are never
merged, a taken child id never leaves a parent waiting for ever, a finished parent's records
never outlive its row, and a refused call writes nothing - on standalone and on the Cluster,
with the parent queue and the child queues on different nodes."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from echomq_core import (
    Child,
    EchoMQ,
    EchoMQError,
    FlowConflict,
    InvalidArgument,
    InvalidFlow,
    JobSpec,
    ParentFailed,
    Pump,
    Worker,
)
from echomq_core.flows import add, plan

from ..conftest import Backend
from ..flowkit import keys_of, normalised, work_off
from ..waiting import eventually


def test_explicit_child_id_of_a_plain_job_is_refused_and_nothing_is_written(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "tk")
    mq.queue(work).add("a plain job", job_id="JOB-plain")
    mq.queue(parents).add("a plain job", job_id="JOB-same-queue")
    before = normalised(backend, prefix)
    for taken, queue in (("JOB-plain", work), ("JOB-same-queue", parents)):
        children = [Child(1, queue=work), Child(2, queue=queue, id=taken)]
        with pytest.raises(FlowConflict, match=f"{taken} in queue .* is taken by a plain job"):
            mq.add_flow(parents, children, parent_id="JOB-p")
        assert normalised(backend, prefix) == before  # no parent, no child, no registry entry
    # the plain jobs run as they were, once
    assert mq.queue(work).get_job("JOB-plain").payload == "a plain job"
    assert mq.queue(work).stats()["pending"] == 1
    mq.close()


def test_explicit_child_id_of_another_flow_is_refused(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "of")
    mq.add_flow(parents, [Child(1, queue=work, id="JOB-shared")], parent_id="JOB-first")
    with pytest.raises(FlowConflict, match=r"JOB-shared .* a child of JOB-first"):
        mq.add_flow(parents, [Child(2, queue=work, id="JOB-shared")], parent_id="JOB-second")
    assert mq.snapshot(parents, "JOB-second").parent_state is None
    # a sub-parent id that is another flow's node is refused the same way
    with pytest.raises(FlowConflict, match="JOB-first"):
        mq.add_flow(parents, [Child(3, id="JOB-first", children=[Child(4)])], parent_id="JOB-3")
    work_off(mq, [parents, work])
    assert mq.children_values(parents, "JOB-first") == {
        "JOB-shared": {"id": "JOB-shared", "payload": 1}
    }
    mq.close()


def test_one_parent_id_in_two_queues_does_not_take_the_others_children(
    backend: Backend, prefix: str
) -> None:
    """Derived child ids (``<parent id>.<n>``) do not name the parent's queue: a flow of the
    same parent id in another queue, with children in a shared queue, must not take over the
    first flow's children (the first would wait for ever). The second add is refused naming
    the id; the first completes as it was."""
    mq = backend.client(prefix)
    qa, qb, kids = backend.queues_on_distinct_nodes(3, "tq")
    mq.add_flow(qa, [Child(1, queue=kids)], parent_id="JOB-af/dag/task/same")
    with pytest.raises(FlowConflict, match=r"JOB-af/dag/task/same\.0 .* in another queue"):
        mq.add_flow(qb, [Child(2, queue=kids)], parent_id="JOB-af/dag/task/same")
    work_off(mq, [qa, kids])
    assert mq.children_values(qa, "JOB-af/dag/task/same") == {
        "JOB-af/dag/task/same.0": {"id": "JOB-af/dag/task/same.0", "payload": 1}
    }
    assert mq.snapshot(qa, "JOB-af/dag/task/same").released
    assert mq.snapshot(qb, "JOB-af/dag/task/same").parent_state == "failed"
    mq.close()


@pytest.mark.parametrize("given", [False, True], ids=["derived", "explicit"])
def test_one_parent_id_in_two_queues_does_not_take_the_others_sub_flows(
    backend: Backend, prefix: str, given: bool
) -> None:
    """The same for an inner node: two roots of one id in two queues, each with a sub-flow in
    a shared queue (derived ``<id>.0``, or the same explicit id). The second root's sub-flow
    would find the first's, of a parent of the same id, and take it for its own (the second
    root waiting for ever on a node that reports to the first): it is refused naming the id,
    and the first completes as it was."""
    mq = backend.client(prefix)
    qa, qb, mid = backend.queues_on_distinct_nodes(3, "ts")
    kids = mid  # the sub-flow's leaves beside it (a Cluster here has three masters)
    pid = "JOB-af/dag/fan_out/shared"
    sub = f"{pid}.0" if not given else "JOB-sub-given"

    def tree(n: int) -> list[Child]:
        return [Child(queue=mid, id=sub if given else None, children=[Child(n, queue=kids)])]

    mq.add_flow(qa, tree(1), parent_id=pid)
    with pytest.raises(FlowConflict, match=f"{sub}.* in another queue"):
        mq.add_flow(qb, tree(1), parent_id=pid)
    second = mq.snapshot(qb, pid)  # refused before it held (explicit) or failed naming it
    assert second.outcome == "missing" if given else second.parent_state == "failed", second
    work_off(mq, [qa, mid, kids])
    assert mq.snapshot(qa, pid).parent_state == "completed"
    mq.close()


def test_re_adding_a_parent_with_other_children_of_the_same_count_is_refused(
    backend: Backend, prefix: str
) -> None:
    """The hole: parent B with [b1, b2], then B with [b3, b4] ended processed=4, total=2."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rb")
    first = [Child(1, queue=work, id="JOB-b1"), Child(2, queue=work, id="JOB-b2")]
    mq.add_flow(parents, first, parent_id="JOB-B")
    before = normalised(backend, prefix)
    other = [Child(3, queue=work, id="JOB-b3"), Child(4, queue=work, id="JOB-b4")]
    with pytest.raises(FlowConflict, match="JOB-B exists with 2 other children"):
        mq.add_flow(parents, other, parent_id="JOB-B")
    moved = [Child(1, queue=parents, id="JOB-b1"), Child(2, queue=work, id="JOB-b2")]
    with pytest.raises(FlowConflict, match="other children"):  # same ids, another queue
        mq.add_flow(parents, moved, parent_id="JOB-B")
    with pytest.raises(FlowConflict, match="exists with 2 children, not 3"):
        mq.add_flow(parents, [*first, Child(5, queue=work)], parent_id="JOB-B")
    assert normalised(backend, prefix) == before
    mq.add_flow(parents, first, parent_id="JOB-B")  # the true retry still converges
    work_off(mq, [parents, work])
    snap = mq.snapshot(parents, "JOB-B")
    assert (snap.total, snap.processed, snap.dependencies) == (2, 2, 0)
    assert set(mq.children_values(parents, "JOB-B")) == {"JOB-b1", "JOB-b2"}
    mq.close()


def test_a_nested_re_add_with_another_subtree_is_refused_and_changes_nothing(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "ns")

    def tree(leaves: int) -> list[Child]:
        return [Child("sub", queue=work, children=[Child(i, queue=work) for i in range(leaves)])]

    mq.add_flow(parents, tree(3), parent_id="JOB-n")
    before = normalised(backend, prefix)
    with pytest.raises(FlowConflict, match=r"JOB-n\.0 exists with 3 children, not 4"):
        mq.add_flow(parents, tree(4), parent_id="JOB-n")
    assert normalised(backend, prefix) == before  # the live flow was not failed by a refusal
    work_off(mq, [parents, work])
    assert mq.snapshot(parents, "JOB-n").released
    mq.close()


def test_two_different_adds_racing_on_one_parent_id_leave_exactly_one_flow(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rc")
    for round_ in range(15):
        pid = f"JOB-race{round_}"
        specs = {
            side: [Child(i, queue=work, id=f"{pid}-{side}{i}") for i in range(50)]
            for side in ("a", "b")
        }
        outcome: dict[str, Any] = {}
        gate = threading.Barrier(2)

        def add(
            side: str,
            pid: str = pid,
            specs: dict[str, list[Child]] = specs,
            gate: threading.Barrier = gate,
            outcome: dict[str, Any] = outcome,
        ) -> None:
            client = backend.client(prefix)
            gate.wait()
            try:
                client.add_flow(parents, specs[side], parent_id=pid)
                outcome[side] = "added"
            except FlowConflict as exc:
                outcome[side] = exc
            finally:
                client.close()

        threads = [threading.Thread(target=add, args=(side,)) for side in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [side for side, result in outcome.items() if result == "added"]
        assert len(winners) == 1, outcome
        loser = "b" if winners == ["a"] else "a"
        assert isinstance(outcome[loser], FlowConflict)
        rows = {k for k in keys_of(backend, prefix) if f"{pid}-{loser}" in k}
        assert not rows, f"the loser wrote {sorted(rows)[:3]}"
    work_off(mq, [parents, work])
    for round_ in range(15):
        snap = mq.snapshot(parents, f"JOB-race{round_}")
        assert (snap.total, snap.processed, snap.dependencies, snap.released) == (50, 50, 0, True)
    mq.close()


def test_an_add_that_loses_a_race_for_a_child_id_fails_its_parent_naming_the_id(
    backend: Backend, prefix: str
) -> None:
    """Both adds pass the read that checks explicit ids; the other add lands the id first. The
    loser's land refuses its batch, its parent fails naming the id (nobody waits for ever),
    FlowConflict is raised, and a retry of the loser ends the same way; the winner is intact."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "lr")
    children = [Child(1, queue=work), Child(2, queue=work, id="JOB-contested")]
    root = mq._plan_flow(parents, children, None, "JOB-loser", 3)
    op = add.add_flow(mq.keys, root, sorted(plan.queues_of(root)))
    step = next(op)  # the read of explicit ids: free
    step = op.send(mq.connection.execute(step))
    mq.add_flow(parents, [Child("w", queue=work, id="JOB-contested")], parent_id="JOB-winner")
    step = op.send(mq.connection.execute(step))  # hold the loser's root
    with pytest.raises(FlowConflict, match="JOB-contested is taken by a child of JOB-winner"):
        while True:
            step = op.send(mq.connection.execute(step))
    with pytest.raises(ParentFailed, match="JOB-contested"):
        mq.wait(parents, "JOB-loser", timeout=5)
    with pytest.raises(FlowConflict, match="JOB-contested"):
        mq.add_flow(parents, children, parent_id="JOB-loser")
    work_off(mq, [parents, work])
    assert mq.children_values(parents, "JOB-winner") == {
        "JOB-contested": {"id": "JOB-contested", "payload": "w"}
    }
    assert mq.snapshot(parents, "JOB-winner").released
    assert mq.snapshot(parents, "JOB-loser").parent_state == "failed"
    mq.close()


def test_keep_completed_false_keeps_a_finished_parent_readable_and_its_retry_runs_nothing(
    backend: Backend, prefix: str
) -> None:
    """The hole: the parent's completion deleted its row while its records stayed, so waits
    polled until their timeout and a retry by id re-ran every child."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "kc")
    runs: list[str] = []

    def handle(job: Any) -> Any:
        runs.append(job.id)
        return len(runs)

    spec = [Child(i, queue=work if i % 2 else parents) for i in range(5)]
    mq.add_flow(parents, spec, parent_id="JOB-k")
    mq.queue(parents).add("plain", job_id="JOB-plain")
    options = {"keep_completed": False}
    worker = Worker(mq, {parents: handle, work: handle}, queue_options=options).start()
    pump = Pump(mq, [parents, work]).start()
    try:
        snap = mq.wait(parents, "JOB-k", timeout=30)
        assert snap.released
        eventually(lambda: "JOB-k" in runs, 30, "the parent's run", every=0.05)
        eventually(
            lambda: mq.snapshot(parents, "JOB-k").parent_state == "completed",
            30,
            "the parent's completion",
            every=0.05,
        )
        info = mq.queue(parents).get_job("JOB-k")
        assert (info.state, info.total) == ("completed", 5)
        assert len(mq.children_values(parents, "JOB-k")) == 5
        assert mq.wait(parents, "JOB-k", timeout=1).released  # no poll until a timeout
        # keep_completed=False still deletes a plain job's row
        eventually(
            lambda: mq.queue(parents).stats()["completed"] >= 4, 30, "4 completions", every=0.05
        )
        assert not [k for k in keys_of(backend, prefix) if k.endswith(":job:JOB-plain")]
        ran = len(runs)
        mq.add_flow(parents, spec, parent_id="JOB-k")  # a retry by id of the finished flow
        time.sleep(1.0)
        assert len(runs) == ran, runs[ran:]
        assert mq.queue(work).stats()["pending"] == mq.queue(parents).stats()["pending"] == 0
    finally:
        worker.stop()
        pump.stop()
    mq.close()


def test_a_refused_add_registers_no_queue(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    mq.add_flow("rq-parents", [Child(1)], parent_id="JOB-one")
    with pytest.raises(FlowConflict):
        mq.add_flow("rq-parents", [Child(1, queue="rq-new")], parent_id="JOB-one")
    fresh = backend.client(prefix)  # its own process: it has registered nothing itself
    with pytest.raises(FlowConflict):
        fresh.add_flow("rq-parents", [Child(1, queue="rq-new2")], parent_id="JOB-one")
    assert mq.queues() == ["rq-parents"]
    fresh.close()
    mq.close()


@pytest.mark.onlystandalone
def test_out_of_range_times_and_attempts_are_refused(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    q = mq.queue("lim")
    for call in (
        lambda: q.claim(1, lease=1e300),
        lambda: q.add(1, delay=1e300),
        lambda: q.add(1, timeout=0),
        lambda: q.add(1, timeout=float("nan")),
        lambda: q.add_bulk([JobSpec(1, timeout=10**9)]),
        lambda: mq.queue("lim", lease=1e12),
        lambda: mq.queue("lim", timeout=-1),
        lambda: q.heartbeat([], lease=1e300),
    ):
        with pytest.raises(InvalidArgument):
            call()
    with pytest.raises(InvalidFlow, match="max_attempts"):
        mq.add_flow("lim", [Child(1, max_attempts=10**30)])
    with pytest.raises(InvalidArgument, match="timeout"):
        mq.add_flow("lim", [Child(1, timeout=1e300)])
    with pytest.raises(InvalidArgument, match="max_attempts"):
        mq.add_flow("lim", [Child(1)], max_attempts=10**30)
    assert keys_of(backend, prefix) == {}
    mq.close()


def test_an_add_whose_registry_write_fails_raises_and_its_retry_registers(
    backend: Backend, prefix: str
) -> None:
    """The registry's SADD rides with an add's first step; on a Cluster it goes to a node the
    rest of the add may never touch, so it can fail alone. Such an add must raise (a Pump would
    never find the new queue) and its retry, which converges on the flow, must register it.
    The failure is made deterministic with an ACL user who may do anything but SADD (no script
    sends SADD), on every node."""
    import uuid

    import redis

    user, password = f"nosadd-{uuid.uuid4().hex[:8]}", "pw-" + uuid.uuid4().hex
    admins = [redis.Redis(host=s.host, port=s.port) for s in backend.servers]

    def grant(*commands: str) -> None:
        for admin in admins:
            admin.acl_setuser(
                user, enabled=True, passwords=[f"+{password}"], keys=["*"], channels=["*"],
                commands=list(commands),
            )  # fmt: skip

    grant("+@all", "-sadd")
    url = backend.url.replace("redis://", f"redis://{user}:{password}@")
    limited = EchoMQ(url, cluster=backend.cluster, prefix=prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rg")
    children = [Child(i, queue=work) for i in range(50)] + [Child("own")]
    try:
        with pytest.raises(EchoMQError) as refused:
            limited.add_flow(parents, children, parent_id="JOB-reg", payload="p")
        assert "NOPERM" in str(refused.value) or "permission" in str(refused.value)
        owner = backend.client(prefix)
        assert owner.queues() == []  # what landed is complete for a retry, but unregistered
        grant("+@all")
        limited.add_flow(parents, children, parent_id="JOB-reg", payload="p")  # the retry
        assert owner.queues() == sorted([parents, work])
        clean = backend.client(prefix + "c")
        clean.add_flow(parents, children, parent_id="JOB-reg", payload="p")
        assert normalised(backend, prefix) == normalised(backend, prefix + "c")
        work_off(owner, [parents, work], lambda job: job.payload)
        assert len(owner.children_values(parents, "JOB-reg")) == 51
        clean.close()
        owner.close()
    finally:
        limited.close()
        for admin in admins:
            admin.acl_deluser(user)
            admin.close()
