"""The add's generated ids (lua/add.lua, adding.add): a chunk of ids the host generated from one
stem with consecutive indexes sends the stem and the first index, not an id per job; the
script checks the stem once and formats each id. Any other chunk sends its ids. Either way
the server refuses a malformed id, stem or start before it writes anything."""

from __future__ import annotations

from typing import Any

import pytest

from echomq_core import EchoMQ, JobSpec
from echomq_core.errors import InvalidJobId
from echomq_core.queues import adding
from echomq_core.wire.calls import Call


def _sent(mq: EchoMQ, op: Any) -> tuple[list[Call], Any]:
    """Every call ``op`` sends (over its steps), and its result."""
    sent: list[Call] = []
    try:
        calls = next(op)
        while True:
            sent += calls
            calls = op.send(mq.connection.execute(calls))
    except StopIteration as done:
        return sent, done.value


def _argv(call: Call) -> list[Any]:
    return list(call.args[3 + int(call.args[2]) :])


def test_generated_ids_travel_as_a_stem_and_a_start(mq: EchoMQ) -> None:
    q = mq.queue("sa-stem")
    calls, ids = _sent(mq, q.add_bulk_op([{"n": i} for i in range(700)]))
    adds = [c for c in calls if c.script is not None]
    assert len(adds) == 2  # 500 + 200
    stem = ids[0][: ids[0].rindex("-") + 1]
    for call, first in zip(adds, (0, 500), strict=True):
        argv = _argv(call)
        n = int(call.args[2]) - 16  # the queue's keys, a row per job, the fair hash
        assert argv[5:8] == [stem, first, ""]
        assert len(argv) == 8 + n  # the payload only, per job
    assert ids == [f"{stem}{i:x}" for i in range(700)]
    # the ids the script formed are the ids the host returned, claimable in order, rows intact
    claimed = [j for _ in range(2) for j in q.claim(500)]
    assert [j.id for j in claimed] == ids
    assert [j.payload for j in claimed] == [{"n": i} for i in range(700)]
    assert all(mq.get_job("sa-stem", i).state == "active" for i in ids[::97])


def test_ids_given_or_mixed_travel_one_per_job(mq: EchoMQ) -> None:
    q = mq.queue("sa-mixed")
    jobs = [JobSpec(1, id="JOB-given-a/b"), 2, JobSpec(3, priority=5)]
    calls, ids = _sent(mq, q.add_bulk_op(jobs))
    for call in (c for c in calls if c.script is not None):
        argv = _argv(call)
        assert argv[5:8] == ["", "", ""]
        assert argv[8::2] == [i for i in ids if i in argv[8::2]]
    assert ids[0] == "JOB-given-a/b"
    assert sorted(j.payload for j in q.claim(3)) == [1, 2, 3]


def _raw_add(mq: EchoMQ, queue: str, stem: str, start: str, n: int) -> Call:
    ks = mq.keys
    keys = [*ks.queue_keys(queue), *(ks.job(queue, f"JOB-k{i}") for i in range(n)), ks.fair(queue)]
    return Call.lua("add", keys, ["0", 1, 0, 0, "", stem, start, "", *([b"1"] * n)])


@pytest.mark.parametrize(
    ("stem", "start"),
    [
        ("JOB-a b-", "0"),  # a space in the stem
        ("JOB{x}-", "0"),  # not JOB- plus a safe tail
        ("JOB-" + "s" * 187, "0"),  # ids that could grow past the length bound
        ("JOB-ok-", "-1"),
        ("JOB-ok-", "1.5"),
        ("JOB-ok-", "x"),
        ("JOB-ok-", ""),
    ],
)
def test_the_server_refuses_a_bad_stem_or_start_and_writes_nothing(
    mq: EchoMQ, stem: str, start: str
) -> None:
    queue = "sa-bad"
    with pytest.raises(InvalidJobId, match=r"(start|stem) of"):
        mq.connection.execute([_raw_add(mq, queue, stem, start, 3)])
    ks = mq.keys
    reads = [Call.cmd("ZCARD", ks.pending(queue)), Call.cmd("GET", ks.seq(queue))]
    reads += [Call.cmd("EXISTS", ks.job(queue, f"JOB-k{i}")) for i in range(3)]
    assert mq.connection.execute(reads) == [0, None, 0, 0, 0]


def test_a_chunk_with_a_gap_sends_its_ids() -> None:
    from echomq_core.wire.keyspace import Keyspace

    stem = "JOB-0123abcd-"
    jobs = [(f"{stem}{i:x}", b"p", 1, 0, 0, None, None) for i in (0, 1, 3)]
    (call,) = next(adding.add(Keyspace("emq"), "sa-gap", jobs, check=False, stem=stem))
    argv = _argv(call)
    assert argv[5:8] == ["", "", ""] and argv[8::2] == [j[0] for j in jobs]


def test_a_flows_derived_child_ids_travel_as_a_stem_and_a_start(mq: EchoMQ) -> None:
    from echomq_core import Child
    from echomq_core.flows import add, plan

    kids = [Child(i, queue="sa-kids") for i in range(600)]
    kids.insert(3, Child("sub", queue="sa-kids", children=[Child("leaf")]))  # breaks the run
    kids.insert(7, Child("named", id="JOB-sa-named", queue="sa-kids"))
    root = plan.plan(
        "sa-flow",
        "JOB-sa-root",
        b"null",
        kids,
        default_attempts=3,
        dumps=mq.encode,
        max_payload=1 << 20,
    )
    nodes = root.children
    assert add._derived(nodes[0:3]) == ("JOB-sa-root.", 0)
    assert add._derived(nodes[8:508]) == ("JOB-sa-root.", 8)
    assert add._derived(nodes[4:7]) == ("JOB-sa-root.", 4)
    assert add._derived([nodes[2], nodes[4]]) is None  # a gap (the sub-flow)
    assert add._derived(nodes[6:9]) is None  # the named child
    assert add._derived(nodes[3].children) == ("JOB-sa-root.3.", 0)
    # end to end: every child lands under the id the host planned, in order
    ref = mq.add_flow("sa-flow", kids, parent_id="JOB-sa-root")
    q, values = mq.queue("sa-kids"), {}
    while jobs := q.claim(500):
        q.complete_many([(j, j.payload) for j in jobs])
        values.update({j.id: j.payload for j in jobs})
    # the leaves, the sub-flow's leaf, and the sub-flow's parent once released
    planned = [n.id for n in nodes if not n.children] + [nodes[3].children[0].id, nodes[3].id]
    assert sorted(values) == sorted(planned) and len(values) == 603
    assert values["JOB-sa-named"] == "named" and values["JOB-sa-root.601"] == 599
    assert ref.parent_id == "JOB-sa-root"
