"""The failure policy (fail the parent / ignore the dependency), poison, nesting, async reads."""

from __future__ import annotations

import asyncio

import pytest

from echomq_core import AsyncEchoMQ, Backoff, Child, EchoMQ, ParentFailed, Pump
from echomq_core.pump.drain import poison_list, poison_replay

from ..conftest import Backend
from ..flowkit import work_off


def _flow(parent_q: str, child_q: str, *, ignore: bool) -> list[Child]:
    return [Child(i, queue=child_q) for i in range(5)] + [
        Child("doomed", queue=child_q, max_attempts=2, ignore_dependency_on_failure=ignore)
    ]


def _dies(job) -> bool:  # type: ignore[no-untyped-def]
    return job.payload == "doomed"


@pytest.mark.parametrize("cross", [False, True], ids=["same-queue", "cross-queue"])
def test_fail_parent_death(backend: Backend, prefix: str, cross: bool) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "fp")
    child_q = work if cross else parents
    ref = mq.add_flow(parents, _flow(parents, child_q, ignore=False))
    doomed = f"{ref.parent_id}.5"
    q = mq.queue(child_q, backoff=Backoff(base_ms=0, cap_ms=0))
    # the first attempt fails and is retried (due at once); the second kills it
    jobs = q.claim(10)
    (first,) = [j for j in jobs if j.payload == "doomed"]
    assert q.fail(first, "attempt 1") is False
    q.complete_many([(j, j.payload) for j in jobs if j is not first])
    assert mq.get_job(child_q, doomed).attempts == 1
    pump = Pump(mq, [parents, work])
    work_off(mq, [child_q], lambda j: j.payload, die=_dies, pump=pump)
    snap = mq.snapshot(parents, ref.parent_id)
    assert snap.parent_state == "failed"
    assert mq.failed_children(parents, ref.parent_id) == {doomed: f"died: {doomed}"}
    assert mq.ignored_failures(parents, ref.parent_id) == {}
    assert doomed not in mq.children_values(parents, ref.parent_id)
    # children that completed are still recorded; the parent never runs
    assert len(mq.children_values(parents, ref.parent_id)) == 5
    assert mq.queue(parents).claim(10) == []
    with pytest.raises(ParentFailed) as exc:
        mq.wait(parents, ref.parent_id, timeout=1)
    assert doomed in str(exc.value) and exc.value.failed == {doomed: f"died: {doomed}"}
    mq.close()


def test_children_completing_after_failure_never_release(mq: EchoMQ) -> None:
    ref = mq.add_flow("p", [Child(1, max_attempts=1), Child(2)])
    q = mq.queue("p")
    jobs = {j.payload: j for j in q.claim(10)}
    q.fail(jobs[1], "dead")
    assert mq.snapshot("p", ref.parent_id).parent_state == "failed"
    q.complete(jobs[2], "late")
    snap = mq.snapshot("p", ref.parent_id)
    assert (snap.parent_state, snap.processed, snap.dependencies) == ("failed", 1, 1)
    assert mq.children_values("p", ref.parent_id) == {f"{ref.parent_id}.1": "late"}
    assert q.claim(10) == []


@pytest.mark.parametrize("cross", [False, True], ids=["same-queue", "cross-queue"])
def test_ignore_dependency_death(backend: Backend, prefix: str, cross: bool) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "id")
    child_q = work if cross else parents
    ref = mq.add_flow(parents, _flow(parents, child_q, ignore=True))
    doomed = f"{ref.parent_id}.5"
    work_off(mq, [child_q], lambda j: j.payload * 2 if j.id != ref.parent_id else "ran", die=_dies)
    snap = mq.snapshot(parents, ref.parent_id)
    # same-queue, work_off also runs the released parent; cross-queue it waits in its queue
    assert (snap.parent_state, snap.dependencies, snap.processed, snap.ignored) == (
        "pending" if cross else "completed",
        0,
        5,
        1,
    )
    assert mq.ignored_failures(parents, ref.parent_id) == {doomed: f"died: {doomed}"}
    assert mq.children_values(parents, ref.parent_id) == {
        f"{ref.parent_id}.{i}": i * 2 for i in range(5)
    }
    assert mq.failed_children(parents, ref.parent_id) == {}
    assert mq.wait(parents, ref.parent_id, timeout=1).released
    mq.close()


def test_both_flags_mean_ignore(mq: EchoMQ) -> None:
    ref = mq.add_flow(
        "p",
        [Child(1, max_attempts=1, fail_parent_on_failure=True, ignore_dependency_on_failure=True)],
    )
    (job,) = mq.queue("p").claim()
    assert job.parent is not None and job.parent.policy == "id"
    mq.queue("p").fail(job, "x")
    assert mq.snapshot("p", ref.parent_id).parent_state == "pending"


def test_failed_parent_settles_its_own_parent(backend: Backend, prefix: str) -> None:
    """A sub-parent that fails climbs the tree by ITS token: fp fails the root, id is ignored."""
    mq = backend.client(prefix)
    root_q, mid_q, leaf_q = backend.queues_on_distinct_nodes(3, "up")
    mq.add_flow(
        root_q,
        [
            Child("strict", queue=mid_q, children=[Child("x", queue=leaf_q, max_attempts=1)]),
            Child(
                "lenient",
                queue=mid_q,
                ignore_dependency_on_failure=True,
                children=[Child("y", queue=leaf_q, max_attempts=1)],
            ),
            Child("fine", queue=leaf_q),
        ],
        parent_id="JOB-root",
    )
    work_off(
        mq, [root_q, mid_q, leaf_q], lambda j: j.payload, die=lambda j: j.payload in ("x", "y")
    )
    assert mq.snapshot(mid_q, "JOB-root.0").parent_state == "failed"
    assert mq.snapshot(mid_q, "JOB-root.1").parent_state == "failed"
    root = mq.snapshot(root_q, "JOB-root")
    assert root.parent_state == "failed"
    assert set(mq.failed_children(root_q, "JOB-root")) == {"JOB-root.0"}
    assert set(mq.ignored_failures(root_q, "JOB-root")) == {"JOB-root.1"}
    assert mq.children_values(root_q, "JOB-root") == {"JOB-root.2": "fine"}
    mq.close()


def test_nested_depth_three_across_three_queues(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    q0, q1, q2 = backend.queues_on_distinct_nodes(3, "nest")
    tree = [
        Child(
            f"L1-{a}",
            queue=q1,
            children=[
                Child(
                    f"L2-{a}{b}",
                    queue=q2,
                    children=[Child(10 * a + b + c, queue=q0) for c in range(3)],
                )
                for b in range(2)
            ],
        )
        for a in range(2)
    ]
    ref = mq.add_flow(q0, tree, parent_id="JOB-n")

    def handle(job):  # type: ignore[no-untyped-def]
        if isinstance(job.payload, int):
            return job.payload
        return sum(mq.children_values(job.queue, job.id).values())  # a parent sums its children

    work_off(mq, [q0, q1, q2], handle)
    info = mq.get_job(q0, ref.parent_id)
    assert info.state == "completed"
    leaves = [10 * a + b + c for a in range(2) for b in range(2) for c in range(3)]
    assert info.result == sum(leaves)
    assert mq.children_values(q0, "JOB-n") == {
        "JOB-n.0": sum(leaves[:6]),
        "JOB-n.1": sum(leaves[6:]),
    }
    assert mq.children_values(q2, "JOB-n.1.0") == {f"JOB-n.1.0.{c}": 10 + c for c in range(3)}
    mq.close()


def test_poison_moves_aside_and_replays(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "po")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(6)])
    r = mq.connection.client
    outbox = mq.keys.outbox(work)
    q = mq.queue(work)
    jobs = q.claim(3)
    q.complete_many([(j, j.payload) for j in jobs])
    r.lpush(outbox, b"c\nJOB-x\n" + parents.encode() + b"\nJOB-gone\n1")  # parent missing
    r.lpush(outbox, b"garbage")  # malformed, at the head
    rest = q.claim(10)
    q.complete_many([(j, j.payload) for j in rest])
    pump = Pump(mq, [work], max_tries=3)
    ticks = [pump.tick() for _ in range(8)]
    assert sum(t.poisoned for t in ticks) == 2
    snap = mq.snapshot(parents, ref.parent_id)
    assert (snap.processed, snap.parent_state) == (6, "pending")  # the rest still delivered
    assert r.llen(outbox) == 0
    poisoned = mq.perform(poison_list(mq.keys, work, 10))
    assert [reason for reason, _ in poisoned] == [
        "malformed signal: expected 5 fields",
        f"parent JOB-gone does not exist in {parents!r}",
    ]
    assert poisoned[0][1] == b"garbage"
    assert mq.perform(poison_replay(mq.keys, work, 10)) == 2
    assert r.llen(outbox) == 2 and r.llen(mq.keys.poison(work)) == 0
    mq.close()


def test_async_client_adds_and_reads(backend: Backend, prefix: str) -> None:
    async def scenario() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        ref = await amq.add_flow(
            "ap", [Child(i, queue="ac") for i in range(50)], parent_id="JOB-async"
        )
        assert await amq.dependencies("ap", ref.parent_id) == 50
        mq = backend.client(prefix)
        work_off(mq, ["ac"], lambda j: j.payload + 1)
        snap = await amq.wait("ap", ref.parent_id, timeout=5, poll=0.01)
        assert snap.processed == 50
        assert await amq.children_values("ap", ref.parent_id) == {
            f"JOB-async.{i}": i + 1 for i in range(50)
        }
        assert await amq.ignored_failures("ap", ref.parent_id) == {}
        assert await amq.failed_children("ap", ref.parent_id) == {}
        mq.close()
        await amq.close()

    asyncio.run(scenario())
