"""Reading a flow that is not there: every read raises :class:`JobNotFound` at once, naming the
queue and the id, with the closest registered queue when the queue name is wrong (issue 48,
item 5). Sync and asyncio clients, standalone and Cluster."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from echomq_core import AsyncEchoMQ, Child, EchoMQ, JobNotFound
from echomq_core.flows import reads as flows

from ..conftest import Backend
from ..flowkit import work_off
from .test_flow_lifecycle import sweep

PID = "JOB-reports-2026"


def _flow(mq: EchoMQ, queue: str = "reports") -> None:
    children = [Child({"n": i}, queue="work") for i in range(3)]
    mq.add_flow(queue, children, parent_id=PID, barrier=True, stream=True)


def _reads(mq: EchoMQ, queue: str, pid: str) -> dict[str, Any]:
    """Each read of a flow, as a thunk."""
    return {
        "children_values": lambda: mq.children_values(queue, pid),
        "iter_children_values": lambda: mq.iter_children_values(queue, pid),
        "iter_results": lambda: mq.iter_results(queue, pid, follow=False),
        "iter_results_follow": lambda: mq.iter_results(queue, pid, follow=True),
        "children_values_range": lambda: mq.children_values_range(queue, pid, 0, 3),
        "dependencies": lambda: mq.dependencies(queue, pid),
        "failed_children": lambda: mq.failed_children(queue, pid),
        "ignored_failures": lambda: mq.ignored_failures(queue, pid),
        "child_failures": lambda: mq.child_failures(queue, pid),
        "wait": lambda: mq.wait(queue, pid, timeout=30),
    }


def test_every_read_of_a_typod_id_raises_at_once_naming_queue_and_id(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    _flow(mq)
    for name, read in _reads(mq, "reports", "JOB-reports-2062").items():
        started = time.monotonic()
        with pytest.raises(JobNotFound) as caught:
            read()
        text = str(caught.value)
        assert "'JOB-reports-2062'" in text and "'reports'" in text, (name, text)
        assert "did you mean" not in text, (name, text)  # the queue is right: the id is not
        assert time.monotonic() - started < 5, name  # wait(timeout=30) did not run its clock
    mq.close()


def test_a_typod_queue_suggests_the_closest_registered_one(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    _flow(mq)
    for name, read in _reads(mq, "reprots", PID).items():
        with pytest.raises(JobNotFound) as caught:
            read()
        text = str(caught.value)
        assert f"'{PID}'" in text and "'reprots'" in text, (name, text)
        assert "did you mean 'reports'?" in text, (name, text)
    other = backend.client(prefix + "x")  # a wrong prefix: no queue at all there
    with pytest.raises(JobNotFound, match="no queues under prefix"):
        other.children_values("reports", PID)
    other.close()
    mq.close()


def test_reads_of_a_flow_that_is_there_are_unchanged(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    _flow(mq)
    # held, nothing settled yet: empty reads, not errors
    assert mq.children_values("reports", PID) == {}
    assert list(mq.iter_children_values("reports", PID)) == []
    assert list(mq.iter_results("reports", PID, follow=False)) == []
    assert mq.dependencies("reports", PID) == 3
    assert mq.failed_children("reports", PID) == {}
    assert mq.child_failures("reports", PID) == []
    work_off(mq, ["reports", "work"], lambda job: job.payload["n"] * 10)
    assert mq.wait("reports", PID, timeout=30).released
    assert sorted(mq.children_values("reports", PID).values()) == [0, 10, 20]
    assert sorted(v for _, v in mq.iter_children_values("reports", PID, page=1)) == [0, 10, 20]
    assert mq.children_values_range("reports", PID, 0, 3) == [(0, 0), (1, 10), (2, 20)]
    assert sorted(v for _, v in mq.iter_results("reports", PID)) == [0, 10, 20]
    mq.close()


def _round_trips(mq: EchoMQ, op: Any) -> int:
    """How many round trips ``op`` takes (each step is one pipeline), driven by hand."""
    trips, step = 0, next(op)
    while True:
        trips += 1
        try:
            step = op.send(mq.connection.execute(step))
        except StopIteration:
            return trips


def test_reads_of_a_flow_that_is_there_take_no_more_round_trips(
    backend: Backend, prefix: str
) -> None:
    """The existence check rides in the read's own pipeline: one round trip, as before."""
    mq = backend.client(prefix)
    _flow(mq)
    ks, q = mq.keys, "reports"
    reads = [
        flows.children_values(ks, q, PID, mq.serializer),
        flows.dependencies(ks, q, PID),
        flows.failed_children(ks, q, PID),
        flows.ignored_failures(ks, q, PID),
        flows.first_page(ks, q, PID, 10),
    ]
    assert [_round_trips(mq, flows.explained(ks, q, PID, op)) for op in reads] == [1] * 5
    mq.close()


def test_a_flow_gone_with_its_retention_raises_the_same(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    _flow(mq)
    work_off(mq, ["reports", "work"], lambda job: job.payload["n"])
    mq.wait("reports", PID, timeout=30)
    mq.set_retention("reports", closed_age=0)
    mq.close_flow("reports", PID)
    sweep(mq, ["reports", "work"])
    assert mq.snapshot("reports", PID).outcome == "missing"
    with pytest.raises(JobNotFound, match="expired with its retention"):
        mq.children_values("reports", PID)
    with pytest.raises(JobNotFound, match="expired with its retention"):
        mq.wait("reports", PID, timeout=30)
    mq.close()


def test_the_asyncio_client_raises_the_same(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    _flow(mq)
    mq.close()

    async def main() -> list[str]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        reads = {
            "children_values": lambda: amq.children_values("reprots", PID),
            "iter_results": lambda: amq.iter_results("reprots", PID),
            "dependencies": lambda: amq.dependencies("reprots", PID),
            "failed_children": lambda: amq.failed_children("reprots", PID),
            "ignored_failures": lambda: amq.ignored_failures("reprots", PID),
            "child_failures": lambda: amq.child_failures("reprots", PID),
            "wait": lambda: amq.wait("reprots", PID, timeout=30),
        }
        texts = []
        try:
            for name, read in reads.items():
                with pytest.raises(JobNotFound) as caught:
                    await read()
                texts.append(f"{name}: {caught.value}")
            assert await amq.children_values("reports", PID) == {}
        finally:
            await amq.close()
        return texts

    started = time.monotonic()
    texts = asyncio.run(main())
    assert time.monotonic() - started < 10
    for text in texts:
        assert f"'{PID}'" in text and "did you mean 'reports'?" in text, text
