"""The claim's rows read (ops.ROW_FIELDS): a child row carries its parent_policy, gate mark and
parent_queue once more, packed in ``up`` (lua/land.lua, lua/hold.lua), so the read asks seven
fields of every row, not nine. Rows written before ``up`` existed (an upgrade in place with
jobs waiting) are read for the three fields instead, and are claimed, completed, failed,
retried and inspected as before."""

from __future__ import annotations

from echomq_core import Child, EchoMQ, ops
from echomq_core.calls import Call
from echomq_core.dashboard import reads
from echomq_core.models import ParentRef


def _hget(mq: EchoMQ, queue: str, job_id: str, field: str) -> bytes | None:
    (value,) = mq.connection.execute([Call.cmd("HGET", mq.keys.job(queue, job_id), field)])
    return value if value is None or isinstance(value, bytes) else str(value).encode()


def test_children_carry_their_parent_fields_packed_and_the_read_asks_seven(mq: EchoMQ) -> None:
    assert len(ops.ROW_FIELDS) == 7
    ref = mq.add_flow(
        "rw-p",
        [
            Child(1, queue="rw-c"),
            Child(2, queue="rw-c", ignore_dependency_on_failure=True),
            Child(3),
            Child(children=[Child(4)], queue="rw-n"),
        ],
    )
    p = ref.parent_id
    kids = [f"{p}.{i}" for i in range(4)]
    assert _hget(mq, "rw-c", kids[0], "up") == b"fp 0 rw-p"
    assert _hget(mq, "rw-c", kids[1], "up") == b"id 0 rw-p"
    assert _hget(mq, "rw-p", kids[2], "up") == b"fp 0 "
    assert _hget(mq, "rw-n", kids[3], "up") == b"fp 0 rw-p"  # a sub-flow's parent (hold.lua)
    capped = mq.add_flow("rw-g", [Child(5), Child(6)], max_running=1)
    assert _hget(mq, "rw-g", f"{capped.parent_id}.0", "up") == b"fp 1 "
    claimed = {j.id: j.parent for j in mq.queue("rw-c").claim(5)}
    assert claimed == {
        kids[0]: ParentRef("rw-p", p, "fp", False),
        kids[1]: ParentRef("rw-p", p, "id", False),
    }
    (gated,) = mq.queue("rw-g").claim(5)
    assert gated.parent == ParentRef("rw-g", capped.parent_id, "fp", True)


def _strip_up(mq: EchoMQ, queue: str, ids: list[str]) -> None:
    """The rows as a client without ``up`` wrote them: today's fields, nothing else."""
    mq.connection.execute([Call.cmd("HDEL", mq.keys.job(queue, i), "up") for i in ids])
    assert all(_hget(mq, queue, i, "up") is None for i in ids)
    assert all(_hget(mq, queue, i, "parent_policy") for i in ids)


def test_rows_written_without_up_are_claimed_settled_retried_and_read_as_before(
    mq: EchoMQ,
) -> None:
    # cross-queue children with both policies, one retried then dying (ignored), and a
    # same-queue capped flow: every parent field the claim reads
    ref = mq.add_flow(
        "ro-p",
        [
            Child("a", queue="ro-c"),
            Child("b", queue="ro-c", ignore_dependency_on_failure=True, max_attempts=2),
            Child("c", queue="ro-c"),
        ],
    )
    capped = mq.add_flow("ro-g", [Child(1), Child(2)], max_running=1)
    p, g = ref.parent_id, capped.parent_id
    kids = [f"{p}.{i}" for i in range(3)]
    _strip_up(mq, "ro-c", kids)
    _strip_up(mq, "ro-g", [f"{g}.0", f"{g}.1"])
    q = mq.queue("ro-c")
    jobs = {j.id: j for j in q.claim(10)}
    assert {i: j.parent for i, j in jobs.items()} == {
        kids[0]: ParentRef("ro-p", p, "fp", False),
        kids[1]: ParentRef("ro-p", p, "id", False),
        kids[2]: ParentRef("ro-p", p, "fp", False),
    }
    assert [jobs[k].payload for k in kids] == ["a", "b", "c"]
    q.complete_many([(jobs[kids[0]], "A"), (jobs[kids[2]], "C")])
    assert q.fail(jobs[kids[1]], "boom once") is False  # retried: attempt 1 of 2
    info = mq.get_job("ro-c", kids[1])
    assert (info.state, info.attempts, info.parent) == (
        "delayed",
        1,
        ParentRef("ro-p", p, "id"),
    )
    # the retry is claimed from the same old-layout row, dies, and is ignored by the parent
    mq.connection.execute([Call.cmd("ZADD", mq.keys.delayed("ro-c"), 0, kids[1])])
    (again,) = q.claim(10)
    assert again.id == kids[1] and again.attempts == 1 and again.parent == jobs[kids[1]].parent
    assert q.fail(again, "boom twice") is True
    from echomq_core import Pump

    pump = Pump(mq, ["ro-c"])
    for _ in range(20):  # bounded: each tick drains what the outbox holds
        pump.tick()
        if mq.dependencies("ro-p", p) == 0:
            break
    assert mq.children_values("ro-p", p) == {kids[0]: "A", kids[2]: "C"}
    assert set(mq.ignored_failures("ro-p", p)) == {kids[1]}
    dead = reads.dead_jobs(mq, "ro-c", 0)
    assert [d.job.id for d in dead.jobs] == [kids[1]]
    assert dead.jobs[0].job.parent == ParentRef("ro-p", p, "id")
    # the capped flow's old rows: the gate mark read, its token returned, the next admitted
    gq = mq.queue("ro-g")
    (first,) = gq.claim(10)
    assert first.parent == ParentRef("ro-g", g, "fp", True)
    gq.complete(first, "x")
    (second,) = gq.claim(10)
    assert second.parent == ParentRef("ro-g", g, "fp", True) and second.id != first.id
    gq.complete(second, "y")
    assert mq.dependencies("ro-g", g) == 0
    assert set(mq.children_values("ro-g", g)) == {f"{g}.0", f"{g}.1"}
