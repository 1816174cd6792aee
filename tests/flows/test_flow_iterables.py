"""Every add takes any iterable of ``Child`` (issue 48, item 7): ``add_flow`` (sync and
asyncio) given a generator, a sub-flow whose ``children`` is a generator, a replacing add that
plans twice from generators; what is not an iterable of ``Child`` is refused by type, naming
it. Standalone and Cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from echomq_core import AsyncEchoMQ, Child, InvalidFlow
from echomq_core.flows import plan as flows

from ..conftest import Backend
from ..flowkit import invariant, keys_of, work_off


def leaves(n: int, queue: str, read: list[int] | None = None) -> Iterator[Child]:
    """``n`` leaves, counting in ``read`` how many were taken from the generator."""
    for i in range(n):
        if read is not None:
            read[0] += 1
        yield Child({"n": i}, queue=queue)


def test_add_flow_takes_a_generator_and_reads_it_once(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "gi")
    read = [0]
    ref = mq.add_flow(parents, leaves(50, work, read), barrier=True)
    assert read == [50]
    assert len(ref.children) == 50
    # the same flow from a list: the same ids, converging (a re-add of one flow)
    again = mq.add_flow(parents, list(leaves(50, work)), parent_id=ref.parent_id, barrier=True)
    assert again == ref
    work_off(mq, [parents, work], lambda job: job.payload["n"])
    assert sorted(mq.children_values(parents, ref.parent_id).values()) == list(range(50))
    invariant(mq, parents, ref.parent_id)
    mq.close()


def test_a_sub_flows_generator_and_a_replacing_add_that_plans_twice(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "gs")

    def tree(width: int) -> Iterator[Child]:
        yield Child("a", queue=work, children=leaves(width, work))
        yield Child("b", queue=work)

    first = mq.add_flow(parents, tree(3), parent_id="JOB-gs", barrier=True)
    assert len(first.children) == 2
    sub_id = first.children[0][1]
    assert mq.snapshot(work, sub_id).total == 3
    # another tree under the same id: replaced, planned again (a new generation) from
    # the generators, which were read once
    second = mq.add_flow(parents, tree(4), parent_id="JOB-gs", barrier=True, replace=True)
    assert second.children[0][1].startswith("JOB-gs.g1.")
    assert mq.snapshot(work, second.children[0][1]).total == 4
    work_off(mq, [parents, work], lambda job: job.payload)
    snap = invariant(mq, parents, "JOB-gs")
    assert (snap.parent_state, snap.total, snap.processed) == ("released", 2, 2)
    mq.close()


def test_the_asyncio_add_takes_a_generator(backend: Backend, prefix: str) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "ga")

    async def main() -> Any:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        try:
            return await amq.add_flow(
                parents,
                (Child(i, queue=work, children=leaves(2, work)) for i in range(3)),
                barrier=True,
            )
        finally:
            await amq.close()

    ref = asyncio.run(main())
    assert len(ref.children) == 3
    assert [mq.snapshot(work, cid).total for _, cid in ref.children] == [2, 2, 2]
    mq.close()


def test_what_is_not_an_iterable_of_children_is_refused_by_type(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix)
    before = keys_of(backend, prefix)
    bad: list[tuple[Any, str]] = [
        (Child(1), "children must be an iterable of echomq_core.Child .*got Child"),
        ("abc", "got str"),
        ({"a": Child(1)}, "got dict"),
        (42, "got int"),
        (iter(()), "has no children"),
        ((x for x in [1]), "child 0 of .* is a int, not echomq_core.Child"),
    ]
    for children, message in bad:
        with pytest.raises(InvalidFlow, match=message):
            mq.add_flow("gr", children)
    with pytest.raises(InvalidFlow, match=r"child 0 of JOB-gr: children must be .*got str"):
        mq.add_flow("gr", [Child(1, children="xy")], parent_id="JOB-gr")  # type: ignore[arg-type]
    assert keys_of(backend, prefix) == before
    mq.close()


def _dumps(value: Any) -> bytes:
    return repr(value).encode()


def test_plan_keeps_a_list_as_it_is_and_a_sub_flows_generator_as_the_list_read() -> None:
    specs = [Child(i) for i in range(3)]
    assert flows.child_list(specs, "x") is specs  # no copy of a list
    sub = Child("s", children=(Child(i) for i in range(2)))
    root = flows.plan("q", "JOB-p", b"", [sub], default_attempts=1, dumps=_dumps, max_payload=99)
    assert [c.id for c in root.children[0].children] == ["JOB-p.0.0", "JOB-p.0.1"]
    assert isinstance(sub.children, list) and len(sub.children) == 2  # kept for a re-plan
    again = flows.plan("q", "JOB-p", b"", [sub], default_attempts=1, dumps=_dumps, max_payload=99)
    assert len(again.children[0].children) == 2
    flows.unlink([root, again])
