"""The reads an orchestrator makes of a flow from outside, as methods of the clients
(``EchoMQ`` / ``AsyncEchoMQ``, "for the orchestrators' adapters"): the missing-flow error, a
wait's verdict, repair on re-add, whether parents are barriers, a released flow read and
closed, the first failure, and handles that expire on their own. Standalone and Cluster."""

from __future__ import annotations

import asyncio

import pytest

from echomq_core import AsyncEchoMQ, Child, EchoMQ, FlowRef, FlowWait, InvalidInput, JobNotFound
from echomq_core.integration import MISSING

from ..conftest import Backend
from ..flowkit import work_off


def _aclient(backend: Backend, prefix: str) -> AsyncEchoMQ:
    return AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)


def _released_with_failures(mq: EchoMQ) -> FlowRef:
    """A barrier flow released with one ignored failure and one a threshold tolerated."""
    children = [Child({"n": i}, queue="work", max_attempts=1) for i in range(4)]
    children.append(
        Child({"n": 9}, queue="work", max_attempts=1, ignore_dependency_on_failure=True)
    )
    ref = mq.add_flow("reports", children, barrier=True, min_success=3)
    dies = {f"{ref.parent_id}.3", f"{ref.parent_id}.4"}
    work_off(mq, ["work", "reports"], lambda job: job.payload["n"] * 10, die=lambda j: j.id in dies)
    return ref


def test_read_released_reads_values_failures_and_closes(mq: EchoMQ) -> None:
    ref = _released_with_failures(mq)
    snap = mq.snapshot(ref.queue, ref.parent_id)
    assert snap.outcome == "released" and snap.parent_state == "released"
    read = mq.read_released(snap, values=True, close=True, page=2)
    assert sorted(read.values or []) == [(f"{ref.parent_id}.{i}", i * 10) for i in range(3)]
    assert list(read.ignored) == [f"{ref.parent_id}.4"]
    assert (
        list(read.failed) == [f"{ref.parent_id}.3"] and "died" in read.failed[f"{ref.parent_id}.3"]
    )
    assert read.closed == "closed" and read.snap.parent_state == "closed"
    assert mq.snapshot(ref.queue, ref.parent_id).parent_state == "closed"
    again = mq.read_released(read.snap, close=True)  # closed already: nothing to close
    assert again.values is None and again.closed is None


def test_the_async_client_reads_the_same(backend: Backend, prefix: str, mq: EchoMQ) -> None:
    ref = _released_with_failures(mq)
    snap = mq.snapshot(ref.queue, ref.parent_id)

    async def read() -> tuple[object, ...]:
        amq = _aclient(backend, prefix)
        try:
            got = await amq.read_released(snap, values=True, close=False, failures=1)
            verdict = await amq.verdict(FlowWait(ref.queue, ref.parent_id, poll=0.1))
            missing = await amq.missing_flow_error(ref.queue, "JOB-not-there")
            return got, verdict, missing
        finally:
            await amq.close()

    got, verdict, missing = asyncio.run(read())
    assert len(got.values) == 3 and got.closed is None and len(got.failed) == 1  # type: ignore[attr-defined]
    assert verdict.ready  # type: ignore[attr-defined]
    assert isinstance(missing, JobNotFound) and "'JOB-not-there'" in str(missing)


def test_missing_flow_error_and_a_verdict_on_no_flow(mq: EchoMQ) -> None:
    mq.add_flow("reports", [Child(1, queue="work")], barrier=True)
    error = mq.missing_flow_error("report", "JOB-gone")
    assert isinstance(error, JobNotFound)
    assert "'JOB-gone'" in str(error) and "did you mean 'reports'" in str(error)
    verdict = mq.verdict(FlowWait("reports", "JOB-gone", poll=0.1, missing_ok=False))
    assert verdict.kind == MISSING and verdict.done


def test_worker_run_lists_the_flows_no_reader_can_close(mq: EchoMQ) -> None:
    barrier = mq.add_flow("reports", [Child(1, queue="work")], barrier=True)
    run = mq.add_flow("reports", [Child(1, queue="work")])
    gone = FlowRef("reports", "JOB-never-added")
    assert mq.worker_run([barrier, run, gone]) == [run]
    assert mq.worker_run([]) == []


def test_repair_on_readd_and_the_first_failure(mq: EchoMQ) -> None:
    children = [Child({"n": i}, queue="work", max_attempts=1) for i in range(3)]
    ref = mq.add_flow("reports", children, parent_id="JOB-nightly", barrier=True)
    assert mq.first_failure(ref.queue, ref.parent_id) is None  # nothing died yet
    work_off(mq, ["work", "reports"], die=lambda job: job.id.endswith(".1"))
    first = mq.first_failure(ref.queue, ref.parent_id)
    assert first is not None and first.job_id == "JOB-nightly.1" and "died" in first.error
    left = mq.repair_on_readd(ref.queue, ref.parent_id, repair=False, epoch=3)
    assert left.broken and left.repaired is None
    assert mq.note_epoch(ref.queue, ref.parent_id) == 3
    found = mq.repair_on_readd(ref.queue, ref.parent_id, repair=True)
    assert found.snap.outcome == "failed" and found.repaired is not None
    assert found.repaired.requeued == 1
    work_off(mq, ["work", "reports"])
    assert mq.snapshot(ref.queue, ref.parent_id).outcome == "released"


def test_a_handle_expires_on_its_own_and_reads_back_as_written(mq: EchoMQ) -> None:
    assert mq.load_handle("dagster:none") is None
    mq.save_handle("dagster:a", {"queue": "q", "parent_id": "JOB-x", "empty": True}, expire=60)
    assert mq.load_handle("dagster:a") == {"queue": "q", "parent_id": "JOB-x", "empty": True}
    (ttl,) = mq.connection.execute([_pttl(mq, "dagster:a")])
    assert 0 < ttl <= 60_000
    mq.save_handle("dagster:b", {"queue": "q"}, expire=None)
    (ttl,) = mq.connection.execute([_pttl(mq, "dagster:b")])
    assert ttl == -1
    ref = mq.add_flow("reports", [Child(1, queue="work")], barrier=True)
    mq.save_ref("dagster:c", ref)  # a flow's own reference reads back too
    assert mq.load_handle("dagster:c") == {"queue": ref.queue, "parent_id": ref.parent_id}
    mq.connection.execute([_set(mq, "dagster:d", "not json")])
    with pytest.raises(InvalidInput, match="does not hold JSON"):
        mq.load_handle("dagster:d")


def _pttl(mq: EchoMQ, name: str) -> object:
    from echomq_core.wire.calls import Call

    return Call.cmd("PTTL", mq.keys.ref(name))


def _set(mq: EchoMQ, name: str, value: str) -> object:
    from echomq_core.wire.calls import Call

    return Call.cmd("SET", mq.keys.ref(name), value)
