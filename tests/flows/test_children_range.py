"""A slice of a flow's results by position (``children_values_range``): what each of many
readers (Airflow mapped tasks) reads of one flow; on standalone and on the Cluster."""

from __future__ import annotations

import pytest

from echomq_core import Child, EchoMQ, InvalidArgument, JobNotFound

from ..conftest import Backend
from ..flowkit import work_off


def test_each_slice_reads_its_positions_in_order_leaving_out_what_did_not_complete(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cr")
    pid = "JOB-af/etl/fan_out/0123abcd"
    children = [Child({"n": i}, queue=work, ignore_dependency_on_failure=True) for i in range(25)]
    mq.add_flow(parents, children, parent_id=pid, barrier=True)
    work_off(
        mq,
        [parents, work],
        lambda job: job.payload["n"] ** 2,
        die=lambda job: job.payload["n"] % 7 == 3,
    )
    read = [
        pair
        for start in range(0, 25, 10)
        for pair in mq.children_values_range(parents, pid, start, start + 10)
    ]
    assert read == [(i, i * i) for i in range(25) if i % 7 != 3]
    assert mq.children_values_range(parents, pid, 20, 1000) == [
        (i, i * i) for i in range(20, 25) if i % 7 != 3
    ]
    assert mq.children_values_range(parents, pid, 30, 40) == []
    mq.close()


def test_a_replaced_flows_generation_is_read_by_its_own_positions(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "cg")
    pid = "JOB-af/etl/fan_out/replaced"
    mq.add_flow(
        parents, [Child({"n": i}, queue=work) for i in range(3)], parent_id=pid, barrier=True
    )
    mq.add_flow(
        parents,
        [Child({"n": 10 + i}, queue=work) for i in range(4)],
        parent_id=pid,
        barrier=True,
        replace=True,
    )
    work_off(mq, [parents, work], lambda job: job.payload["n"])
    assert mq.children_values_range(parents, pid, 0, 10) == [(i, 10 + i) for i in range(4)]
    mq.close()


def test_explicit_ids_and_bad_ranges_are_refused(mq: EchoMQ) -> None:
    ref = mq.add_flow("ce", [Child(1, id="JOB-mine-1"), Child(2)], barrier=True)
    with pytest.raises(InvalidArgument, match="ids of their own"):
        mq.children_values_range("ce", ref.parent_id, 0, 2)
    plain = mq.add_flow("ce", [Child(1)], barrier=True)
    for start, stop in ((-1, 2), (3, 2)):
        with pytest.raises(InvalidArgument, match="start <= stop"):
            mq.children_values_range("ce", plain.parent_id, start, stop)
    with pytest.raises(InvalidArgument, match="at most 100000"):
        mq.children_values_range("ce", plain.parent_id, 0, 100_001)
    with pytest.raises(JobNotFound):
        mq.children_values_range("ce", "JOB-none", 0, 1)
