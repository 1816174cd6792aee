"""Results as they settle (echomq_core.flows.streaming): a flow added with stream=True is followed
from a cursor, in settle order, while it runs; on standalone and on a real 3-master Cluster."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest

from echomq_core import (
    AsyncEchoMQ,
    Child,
    EchoMQ,
    FlowCancelled,
    FlowConflict,
    FlowTimeout,
    InvalidArgument,
    JobNotFound,
    ParentFailed,
    Pump,
)
from echomq_core.wire.calls import Call

from ..conftest import Backend
from ..flowkit import deliver_without_trim, keys_of, work_off
from ..waiting import eventually
from .test_flow_lifecycle import ALL_ZERO, sweep


def settle_in_order(mq: EchoMQ, queue: str, jobs: dict[str, Any], order: list[str]) -> None:
    """Complete claimed children of ``queue`` (``jobs``: id -> Job) one call each, in ``order``."""
    q = mq.queue(queue)
    for child_id in order:
        assert q.complete_many([(jobs[child_id], {"v": child_id})]) == [True]


def test_results_come_in_settle_order_and_end_at_release(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    (queue,) = backend.queues_on_distinct_nodes(1, "st")
    ref = mq.add_flow(queue, [Child(i) for i in range(30)], barrier=True, stream=True)
    ids = [c for _, c in ref.children]
    order = ids[:]
    random.Random(7).shuffle(order)
    jobs = {j.id: j for j in mq.queue(queue).claim(30)}
    settle_in_order(mq, queue, jobs, order[:10])
    # follow=False: what has settled so far, then stop (the flow is still held)
    got = list(mq.iter_results(queue, ref.parent_id, follow=False))
    assert got == [(c, {"v": c}) for c in order[:10]]
    settle_in_order(mq, queue, jobs, order[10:])
    assert mq.snapshot(queue, ref.parent_id).parent_state == "released"
    # follow=True on a released flow: every result, in settle order, then the end
    got = list(mq.iter_results(queue, ref.parent_id, page=7))
    assert got == [(c, {"v": c}) for c in order]
    mq.close()


def test_a_follower_gets_each_result_while_the_flow_runs(backend: Backend, prefix: str) -> None:
    """Across queues (the Pump's deliver logs too): the follower has result k before child
    k+1 is even completed - the test completes the next child only once the follower reported
    the previous one (a gate it controls, no sleep) - and it ends when the flow is released."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "sx")
    n = 12
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(n)], stream=True)
    seen: list[tuple[str, Any, str | None]] = []
    errors: list[BaseException] = []
    reader = backend.client(prefix)

    def follow() -> None:
        try:
            for child_id, value in reader.iter_results(parents, ref.parent_id, block=0.2):
                seen.append((child_id, value, reader.snapshot(parents, ref.parent_id).parent_state))
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    t = threading.Thread(target=follow)
    t.start()
    pump = Pump(mq, [parents, work])
    q = mq.queue(work)
    jobs = {j.id: j for j in q.claim(n)}
    order = sorted(jobs, reverse=True)
    try:
        for k, child_id in enumerate(order):
            assert q.complete_many([(jobs[child_id], child_id.upper())]) == [True]
            eventually(lambda: pump.tick().delivered, 10, f"delivery of {child_id}")
            eventually(lambda k=k: len(seen) > k or errors, 10, f"result {k} at the follower")
        t.join(10)
    finally:
        pump.release_leases()
    assert not t.is_alive() and not errors, errors
    assert [(c, v) for c, v, _ in seen] == [(c, c.upper()) for c in order]
    # every result but the last reached the follower while the flow was held
    assert [s for _, _, s in seen[:-1]] == ["held"] * (n - 1)
    assert mq.snapshot(parents, ref.parent_id).parent_state == "pending"  # a worker-run parent
    reader.close()
    mq.close()


def test_a_cursor_resumes_with_nothing_skipped_or_repeated(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    (queue,) = backend.queues_on_distinct_nodes(1, "cu")
    kids = [Child(i, ignore_dependency_on_failure=True, max_attempts=1) for i in range(20)]
    ref = mq.add_flow(queue, kids, barrier=True, stream=True)
    dead = {f"{ref.parent_id}.3", f"{ref.parent_id}.11"}
    work_off(mq, [queue], lambda job: job.id, die=lambda job: job.id in dead)
    everything = list(mq.iter_results(queue, ref.parent_id))
    assert len(everything) == 18 and not dead & {c for c, _ in everything}  # deaths: no value
    for cut in (0, 1, 5, 17, 18):
        it = mq.iter_results(queue, ref.parent_id, page=3)
        head = [next(it) for _ in range(cut)]
        rest = list(mq.iter_results(queue, ref.parent_id, cursor=it.cursor, page=4))
        assert head + rest == everything, cut
    mq.close()


def test_a_failed_or_cancelled_flow_raises(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "fx")
    kids = [Child(i, queue=work, max_attempts=1) for i in range(3)]
    ref = mq.add_flow(parents, kids, stream=True)
    work_off(mq, [parents, work], die=lambda job: job.payload == 1)
    with pytest.raises(ParentFailed) as failed:
        list(mq.iter_results(parents, ref.parent_id))
    assert f"{ref.parent_id}.1" in failed.value.failed

    # a follower blocked on a flow that is then cancelled returns within its block bound
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(3)], stream=True)
    outcome: list[BaseException] = []
    reader = backend.client(prefix)

    def follow() -> None:
        try:
            list(reader.iter_results(parents, ref.parent_id, block=0.2))
        except BaseException as exc:  # asserted below
            outcome.append(exc)

    t = threading.Thread(target=follow)
    t.start()
    mq.cancel_flow(parents, ref.parent_id, reason="no longer needed")
    t.join(10)
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], FlowCancelled), outcome
    assert outcome[0].reason == "no longer needed"
    reader.close()
    mq.close()


def test_bad_input_is_refused_by_name(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    (queue,) = backend.queues_on_distinct_nodes(1, "bx")
    one = mq.add_flow(queue, [Child(1), Child(2)], barrier=True, stream=True)
    two = mq.add_flow(queue, [Child(1)], barrier=True, stream=True)
    plain = mq.add_flow(queue, [Child(1)], barrier=True)
    work_off(mq, [queue])
    it = mq.iter_results(queue, one.parent_id)
    next(it)
    with pytest.raises(InvalidArgument, match="another flow"):
        mq.iter_results(queue, two.parent_id, cursor=it.cursor)
    for bad in ("0-0", "zz:1-1", 12, "abcdef01:1-1;"):
        with pytest.raises(InvalidArgument, match="cursor"):
            mq.iter_results(queue, one.parent_id, cursor=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="stream=True"):
        list(mq.iter_results(queue, plain.parent_id))
    with pytest.raises(JobNotFound):
        list(mq.iter_results(queue, "JOB-never-added"))
    with pytest.raises(InvalidArgument, match="block"):
        mq.iter_results(queue, one.parent_id, block=0)
    with pytest.raises(InvalidArgument, match="stream"):
        mq.add_flow(queue, [Child(1)], stream="yes")  # type: ignore[arg-type]
    # a re-add with the other setting is another flow: refused, not merged
    with pytest.raises(FlowConflict, match="settle log"):
        mq.add_flow(queue, [Child(1)], parent_id=plain.parent_id, barrier=True, stream=True)
    with pytest.raises(FlowConflict, match="settle log"):
        mq.add_flow(queue, [Child(1)], parent_id=two.parent_id, barrier=True)
    assert mq.add_flow(queue, [Child(1)], parent_id=two.parent_id, barrier=True, stream=True)
    mq.close()


def test_the_log_is_written_only_when_asked_and_goes_with_the_flow(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "lx")
    logged = mq.add_flow(parents, [Child(i, queue=q) for i, q in enumerate([work, parents] * 3)],
                         barrier=True, stream=True)  # fmt: skip
    plain = mq.add_flow(parents, [Child(i, queue=work) for i in range(3)], barrier=True)
    work_off(mq, [parents, work])
    keys = keys_of(backend, prefix)
    log = mq.keys.settle_log(parents, logged.parent_id)
    assert keys[log][0] == "stream"
    assert mq.keys.settle_log(parents, plain.parent_id) not in keys
    assert len(list(mq.iter_results(parents, logged.parent_id))) == 6
    for queue in (parents, work):
        mq.set_retention(queue, **{**ALL_ZERO, "unclosed_age": 3600})
    mq.close_flow(parents, logged.parent_id)
    sweep(mq, [parents, work])
    assert log not in keys_of(backend, prefix)
    with pytest.raises(JobNotFound):
        list(mq.iter_results(parents, logged.parent_id))
    mq.close()


def test_the_async_client_follows_too(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "ax")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(5)], stream=True)

    async def follow() -> list[tuple[str, Any]]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            it = await amq.iter_results(parents, ref.parent_id, block=0.2)
            return [item async for item in it]
        finally:
            await amq.close()

    def settle() -> None:
        work_off(mq, [parents, work], lambda job: (job.payload or 0) * 10)

    t = threading.Thread(target=settle)
    t.start()
    got = asyncio.run(follow())
    t.join(30)
    assert sorted(got) == sorted((f"{ref.parent_id}.{i}", i * 10) for i in range(5))
    mq.close()


def _get(key: str) -> Any:
    (value,) = yield [Call.cmd("GET", key)]
    return value


def test_redelivered_signals_log_nothing_twice(backend: Backend, prefix: str) -> None:
    """A Pump that dies before it trims redelivers: the log, like the counter, counts once."""
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rd")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(6)], barrier=True, stream=True)
    q = mq.queue(work)
    jobs = q.claim(6)
    assert all(q.complete_many([(j, j.payload) for j in jobs[:4]]))
    # two Pumps that die before they trim, each after the other's 1 ms outbox lease lapsed
    lease = mq.keys.outbox_lease(work)
    for pump_id in ("pump-a", "pump-b"):
        eventually(lambda: not mq.perform(_get(lease)), 5, "a free outbox lease")
        deliver_without_trim(mq, [work], pump_id, lease_ms=1)
        assert mq.snapshot(parents, ref.parent_id).processed == 4  # delivered (again)
    assert all(q.complete_many([(j, j.payload) for j in jobs[4:]]))
    work_off(mq, [parents, work])
    got = list(mq.iter_results(parents, ref.parent_id))
    assert got == [(j.id, j.payload) for j in jobs]
    log = mq.keys.settle_log(parents, ref.parent_id)
    assert len(keys_of(backend, prefix)[log][1]) == 6  # one entry per child, no more
    mq.close()


def test_ids_of_their_own_and_derived_ids_both_come_back_whole(
    backend: Backend, prefix: str
) -> None:
    """The log keeps a derived id as '.<i>' (the parent's id is most of it): the reader gives
    it back whole, and an explicit id, kept whole, too."""
    mq = backend.client(prefix)
    (queue,) = backend.queues_on_distinct_nodes(1, "ix")
    kids = [Child(0), Child(1, id="JOB-own/with.slash"), Child(2, id="JOB-x.1")]
    ref = mq.add_flow(queue, kids, parent_id="JOB-af/dag/task/abc", barrier=True, stream=True)
    work_off(mq, [queue], lambda job: job.payload)
    got = dict(mq.iter_results(queue, ref.parent_id))
    assert got == {"JOB-af/dag/task/abc.0": 0, "JOB-own/with.slash": 1, "JOB-x.1": 2}
    mq.close()


def test_check_makes_the_first_read_up_front_and_consumes_nothing(
    backend: Backend, prefix: str
) -> None:
    """``check()`` (what the adapters call before handing the iterator on): a flow that cannot
    be followed raises there, not at the first item; a followable one yields everything after."""
    mq = backend.client(prefix)
    (queue,) = backend.queues_on_distinct_nodes(1, "kx")
    plain = mq.add_flow(queue, [Child(1)], barrier=True)
    with pytest.raises(InvalidArgument, match="keeps no settle log"):
        mq.iter_results(queue, plain.parent_id).check()
    with pytest.raises(JobNotFound):
        mq.iter_results(queue, "JOB-nothing-here").check()
    ref = mq.add_flow(queue, [Child(i) for i in range(3)], barrier=True, stream=True)
    work_off(mq, [queue], lambda job: job.payload)
    it = mq.iter_results(queue, ref.parent_id, page=2).check()
    assert it.check() is it  # again: the page read is kept, nothing is read or lost
    assert sorted(it) == [(f"{ref.parent_id}.{i}", i) for i in range(3)]

    async def follow() -> list[tuple[str, Any]]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            with pytest.raises(InvalidArgument, match="keeps no settle log"):
                await (await amq.iter_results(queue, plain.parent_id)).check()
            it = await (await amq.iter_results(queue, ref.parent_id)).check()
            return [item async for item in it]
        finally:
            await amq.close()

    assert sorted(asyncio.run(follow())) == [(f"{ref.parent_id}.{i}", i) for i in range(3)]
    mq.close()


def test_a_follow_with_a_timeout_hands_out_what_settled_then_raises(
    backend: Backend, prefix: str
) -> None:
    """``timeout``: the follow waits at most that long for the release in all, then raises
    FlowTimeout once every result settled by then is handed out; its cursor resumes there
    (sync and asyncio; bad values refused by name)."""
    mq = backend.client(prefix)
    (queue,) = backend.queues_on_distinct_nodes(1, "sto")
    ref = mq.add_flow(queue, [Child(i) for i in range(3)], barrier=True, stream=True)
    ids = [c for _, c in ref.children]
    jobs = {j.id: j for j in mq.queue(queue).claim(3)}
    settle_in_order(mq, queue, jobs, ids[:1])  # nothing settles the other two meanwhile
    it = mq.iter_results(queue, ref.parent_id, timeout=0.3, block=0.1)
    assert next(it) == (ids[0], {"v": ids[0]})
    with pytest.raises(FlowTimeout, match=r"not released within timeout=0\.3s"):
        next(it)
    for bad in (-1, float("nan"), "5", True):
        with pytest.raises(InvalidArgument, match="timeout"):
            mq.iter_results(queue, ref.parent_id, timeout=bad)  # type: ignore[arg-type]

    async def follow_async() -> list[Any]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        got: list[Any] = []
        try:
            with pytest.raises(FlowTimeout):
                async for item in await amq.iter_results(queue, ref.parent_id, timeout=0.2):
                    got.append(item)
        finally:
            await amq.close()
        return got

    assert asyncio.run(follow_async()) == [(ids[0], {"v": ids[0]})]
    settle_in_order(mq, queue, jobs, ids[1:])  # released: the rest comes, then the end
    rest = list(mq.iter_results(queue, ref.parent_id, cursor=it.cursor, timeout=0.3))
    assert rest == [(c, {"v": c}) for c in ids[1:]]
    mq.close()
