"""The claim's rows read (ops.ROW_FIELDS): every row carries, beside the fields every other
reader reads, ``run`` = '<max_attempts> <attempts> <stalls> <timeout | -> [<policy> <gate>
<parent_queue>]' (lua/includes/run.lua), so the read asks four fields of every row (with
``state``: a leaf has none, a released parent's tells its handler it runs as a parent), not
eight. fail.lua, recover.lua, requeue.lua and revive.lua keep the copy in step with the
separate fields, which stay the truth. Rows written before ``run`` existed - today's plain
rows, children with row30's ``up``, children with only the separate fields (an upgrade in
place with jobs waiting) - are read for their separate fields instead, and are claimed,
completed, failed, retried, recovered, revived and inspected as before."""

from __future__ import annotations

import pytest

from echomq_core import Child, EchoMQ, Pump
from echomq_core.dashboard import reads
from echomq_core.flows.children import describe
from echomq_core.models import ParentRef, split_done
from echomq_core.queues import ops
from echomq_core.seeing.browse import job_detail, oldest_pending, queue_page
from echomq_core.wire.calls import Call


def _hget(mq: EchoMQ, queue: str, job_id: str, field: str) -> bytes | None:
    (value,) = mq.connection.execute([Call.cmd("HGET", mq.keys.job(queue, job_id), field)])
    return value if value is None or isinstance(value, bytes) else str(value).encode()


def _run(mq: EchoMQ, queue: str, job_id: str) -> str:
    """The row's ``run``, its created word (a server ms) checked and shown as ``T``."""
    value = _hget(mq, queue, job_id, "run")
    assert value is not None
    words = value.decode().split(" ")
    assert words[4].isdigit() and int(words[4]) > 1_700_000_000_000
    words[4] = "T"
    return " ".join(words)


def _expire_lease(mq: EchoMQ, queue: str, job_id: str) -> None:
    """The lease's deadline moved into the past: the Pump's next recover takes it back."""
    mq.connection.execute([Call.cmd("ZADD", mq.keys.active(queue), "XX", 0, job_id)])


def _due(mq: EchoMQ, queue: str, job_id: str) -> None:
    """A retry waiting in delayed made due now (the claim promotes it)."""
    mq.connection.execute([Call.cmd("ZADD", mq.keys.delayed(queue), "XX", 0, job_id)])


def test_rows_carry_run_and_the_read_asks_four_fields(mq: EchoMQ) -> None:
    assert ops.ROW_FIELDS == ("payload", "parent", "run", "state")
    q = mq.queue("rw-q", max_attempts=4)
    plain = q.add("a")
    limited = q.add("b", timeout=2.5)
    assert _run(mq, "rw-q", plain) == "4 0 0 - T"
    assert _run(mq, "rw-q", limited) == "4 0 0 2500 T"
    ref = mq.add_flow(
        "rw-p",
        [
            Child(1, queue="rw-c"),
            Child(2, queue="rw-c", ignore_dependency_on_failure=True, max_attempts=2),
            Child(3),
            Child(children=[Child(4)], queue="rw-n"),
        ],
    )
    p = ref.parent_id
    kids = [f"{p}.{i}" for i in range(4)]
    assert _run(mq, "rw-c", kids[0]) == "3 0 0 - T fp 0 rw-p"
    assert _run(mq, "rw-c", kids[1]) == "2 0 0 - T id 0 rw-p"
    assert _run(mq, "rw-p", kids[2]) == "3 0 0 - T fp 0 "
    assert _run(mq, "rw-n", kids[3]) == "3 0 0 - T fp 0 rw-p"  # a sub-flow's parent
    assert _run(mq, "rw-p", p) == "3 0 0 - T"  # a worker-run root (hold.lua)
    assert all(_hget(mq, "rw-c", k, "up") is None for k in kids[:2])
    capped = mq.add_flow("rw-g", [Child(5), Child(6)], max_running=1)
    assert _run(mq, "rw-g", f"{capped.parent_id}.0") == "3 0 0 - T fp 1 "
    # max_attempts and created live only in run on a leaf's row; a parent keeps its own
    assert _hget(mq, "rw-q", plain, "max_attempts") is None
    assert _hget(mq, "rw-c", kids[0], "created") is None
    assert _hget(mq, "rw-p", p, "max_attempts") == b"3"
    # a leaf's policy field only when it is not the default (every reader takes absent as fp)
    assert _hget(mq, "rw-c", kids[0], "parent_policy") is None
    assert _hget(mq, "rw-c", kids[1], "parent_policy") == b"id"
    assert _hget(mq, "rw-p", kids[2], "parent_policy") is None
    jobs = {j.id: j for j in q.claim(5)}
    assert (jobs[plain].max_attempts, jobs[plain].timeout_ms) == (4, None)
    assert (jobs[limited].payload, jobs[limited].timeout_ms) == ("b", 2500)
    claimed = {j.id: (j.parent, j.max_attempts) for j in mq.queue("rw-c").claim(5)}
    assert claimed == {
        kids[0]: (ParentRef("rw-p", p, "fp", False), 3),
        kids[1]: (ParentRef("rw-p", p, "id", False), 2),
    }
    (gated,) = mq.queue("rw-g").claim(5)
    assert gated.parent == ParentRef("rw-g", capped.parent_id, "fp", True)


def test_the_packed_copy_follows_fails_stalls_revives_and_repairs(mq: EchoMQ) -> None:
    q = mq.queue("rf-q", max_attempts=3)
    job_id = q.add("x", timeout=1.0)
    (job,) = q.claim()
    assert q.fail(job, "boom") is False
    assert _run(mq, "rf-q", job_id) == "3 1 0 1000 T"
    _due(mq, "rf-q", job_id)
    (job,) = q.claim()
    assert (job.attempts, job.stalls, job.timeout_ms) == (1, 0, 1000)
    _expire_lease(mq, "rf-q", job_id)
    assert Pump(mq, ["rf-q"], maintain_every=0).tick().recovered == 1
    assert _run(mq, "rf-q", job_id) == "3 1 1 1000 T"
    (job,) = q.claim()
    assert (job.attempts, job.stalls) == (1, 1)
    assert q.fail(job, "boom", retry=False) is True
    assert _run(mq, "rf-q", job_id) == "3 2 1 1000 T"
    assert q.retry_dead([job_id]) == (1, [])
    assert _run(mq, "rf-q", job_id) == "3 0 0 1000 T"
    (job,) = q.claim()
    assert (job.attempts, job.stalls, job.max_attempts) == (0, 0, 3)
    # a flow's dead child repaired (requeue.lua): fresh attempts in the copy too
    # (same-queue: the death fails the parent in the failing step)
    ref = mq.add_flow("rf-p", [Child("c", max_attempts=1)])
    cq = mq.queue("rf-p")
    (child,) = cq.claim()
    assert cq.fail(child, "dies") is True
    assert _run(mq, "rf-p", child.id) == "1 1 0 - T fp 0 "
    mq.retry_flow("rf-p", ref.parent_id)
    assert _run(mq, "rf-p", child.id) == "1 0 0 - T fp 0 "
    (again,) = cq.claim()
    assert (again.id, again.attempts, again.parent) == (
        child.id,
        0,
        ParentRef("rf-p", ref.parent_id, "fp", False),
    )


def test_a_stale_copy_never_lets_a_job_run_past_its_attempts(mq: EchoMQ) -> None:
    # an older client's fail.lua counts the attempt without touching 'run': the claim then
    # reports too few attempts, but the death is decided on the separate field
    q = mq.queue("rs-q", max_attempts=2)
    job_id = q.add("x")
    row = mq.keys.job("rs-q", job_id)
    mq.connection.execute([Call.cmd("HINCRBY", row, "attempts", 1)])
    (job,) = q.claim()
    assert job.attempts == 0  # the stale copy
    assert q.fail(job, "boom") is True  # attempt 2 of 2: dead, as the row's count says
    assert _run(mq, "rs-q", job_id) == "2 2 0 - T"  # mended by the fail
    assert mq.get_job("rs-q", job_id).attempts == 2


def test_rows_with_run_are_read_by_get_job_the_dashboard_and_the_children_list(
    mq: EchoMQ,
) -> None:
    q = mq.queue("rd-q", max_attempts=5)
    a = q.add("a")
    b = q.add("b")
    info = mq.get_job("rd-q", a)
    assert (info.state, info.attempts, info.max_attempts) == ("pending", 0, 5)
    page = mq.perform(queue_page(mq.keys, "rd-q", "pending"))
    created = int((_hget(mq, "rd-q", a, "run") or b"").split()[4])
    assert [(r.id, r.max_attempts, r.created_ms) for r in page.rows[:1]] == [(a, 5, created)]
    detail = mq.perform(job_detail(mq.keys, "rd-q", b, mq.serializer))
    assert detail is not None and detail.created_ms is not None and detail.created_ms >= created
    (age,) = mq.perform(oldest_pending(mq.keys, ["rd-q"])).values()
    assert age is not None and 0 <= age < 600
    ref = mq.add_flow("rd-p", [Child("x", queue="rd-c", max_attempts=4)])
    (row,) = mq.perform(
        describe(mq.keys, "rd-p", ref.parent_id, [f"{ref.parent_id}.0"], ["rd-c"], mq.serializer)
    )
    assert (row.status, row.attempts, row.max_attempts) == ("pending", 0, 4)


def _as_written_before(mq: EchoMQ, queue: str, ids: list[str], layout: str) -> None:
    """The rows as today's code (``layout='up'``, row30's packed parent fields) or the code
    before it (``'separate'``) wrote them: max_attempts and created as fields of their own,
    no ``run``, a child's ``parent_policy`` spelt out also when it is the default ``fp`` (land.lua
    writes it only for ``id`` since cpu30)."""
    calls = []
    for i in ids:
        row = mq.keys.job(queue, i)
        run = (_hget(mq, queue, i, "run") or b"").split(b" ")
        calls.append(Call.cmd("HSET", row, "max_attempts", run[0], "created", run[4]))
        calls.append(Call.cmd("HDEL", row, "run"))
        if _hget(mq, queue, i, "parent") is not None and not _hget(mq, queue, i, "parent_policy"):
            calls.append(Call.cmd("HSET", row, "parent_policy", "fp"))
        if layout == "up" and _hget(mq, queue, i, "parent") is not None:
            policy = _hget(mq, queue, i, "parent_policy") or b"fp"
            gate = b"1" if _hget(mq, queue, i, "gate") else b"0"
            up = policy + b" " + gate + b" " + (_hget(mq, queue, i, "parent_queue") or b"")
            calls.append(Call.cmd("HSET", row, "up", up))
    mq.connection.execute(calls)
    assert all(_hget(mq, queue, i, "run") is None for i in ids)


@pytest.mark.parametrize("layout", ["up", "separate"])
def test_plain_rows_written_before_run_are_claimed_failed_recovered_and_read(
    mq: EchoMQ, layout: str
) -> None:
    q = mq.queue("ro-q", max_attempts=3)
    a, b, c = q.add("a", timeout=2.0), q.add("b"), q.add("c")
    _as_written_before(mq, "ro-q", [a, b, c], layout)
    jobs = {j.id: j for j in q.claim(10)}
    assert [jobs[i].payload for i in (a, b, c)] == ["a", "b", "c"]
    assert (jobs[a].timeout_ms, jobs[a].max_attempts, jobs[a].attempts) == (2000, 3, 0)
    q.complete(jobs[c], "C")
    assert q.fail(jobs[a], "once") is False  # retried, the old layout kept
    assert _hget(mq, "ro-q", a, "run") is None
    _due(mq, "ro-q", a)
    _expire_lease(mq, "ro-q", b)
    pump = Pump(mq, ["ro-q"], max_stalls=1, maintain_every=0)
    assert pump.tick().recovered == 1
    got = {j.id: j for j in q.claim(10)}
    assert (got[a].attempts, got[a].timeout_ms) == (1, 2000)
    assert (got[b].attempts, got[b].stalls) == (0, 1)
    _expire_lease(mq, "ro-q", b)  # a second stall: past max_stalls, buried
    pump.tick()
    assert q.fail(got[a], "twice", retry=False) is True
    info = mq.get_job("ro-q", b)
    assert (info.state, info.stalls, info.error) == ("dead", 2, "lease expired 2 times")
    info = mq.get_job("ro-q", a)
    assert (info.state, info.attempts, info.max_attempts) == ("dead", 2, 3)
    assert mq.get_job("ro-q", c).result == "C"
    page = mq.perform(queue_page(mq.keys, "ro-q", "dead"))
    assert {(r.id, r.attempts, r.max_attempts) for r in page.rows} == {(a, 2, 3), (b, 0, 3)}
    detail = mq.perform(job_detail(mq.keys, "ro-q", a, mq.serializer))
    assert detail is not None and detail.info.attempts == 2
    assert q.retry_dead([a]) == (1, [])
    (fresh,) = q.claim(10)
    assert (fresh.id, fresh.attempts, fresh.timeout_ms) == (a, 0, 2000)


@pytest.mark.parametrize("layout", ["up", "separate"])
def test_child_rows_written_before_run_are_claimed_settled_retried_and_read(
    mq: EchoMQ, layout: str
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
    _as_written_before(mq, "ro-c", kids, layout)
    _as_written_before(mq, "ro-g", [f"{g}.0", f"{g}.1"], layout)
    q = mq.queue("ro-c")
    jobs = {j.id: j for j in q.claim(10)}
    assert {i: j.parent for i, j in jobs.items()} == {
        kids[0]: ParentRef("ro-p", p, "fp", False),
        kids[1]: ParentRef("ro-p", p, "id", False),
        kids[2]: ParentRef("ro-p", p, "fp", False),
    }
    assert [jobs[k].payload for k in kids] == ["a", "b", "c"]
    assert jobs[kids[1]].max_attempts == 2
    listed = mq.perform(describe(mq.keys, "ro-p", p, kids, ["ro-c"], mq.serializer))
    assert [(r.status, r.max_attempts) for r in listed] == [
        ("active", 3),
        ("active", 2),
        ("active", 3),
    ]
    q.complete_many([(jobs[kids[0]], "A"), (jobs[kids[2]], "C")])
    assert q.fail(jobs[kids[1]], "boom once") is False  # retried: attempt 1 of 2
    info = mq.get_job("ro-c", kids[1])
    assert (info.state, info.attempts, info.parent) == (
        "delayed",
        1,
        ParentRef("ro-p", p, "id"),
    )
    # the retry is claimed from the same old-layout row, dies, and is ignored by the parent
    _due(mq, "ro-c", kids[1])
    (again,) = q.claim(10)
    assert again.id == kids[1] and again.attempts == 1 and again.parent == jobs[kids[1]].parent
    assert q.fail(again, "boom twice") is True
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


def test_a_kept_row_keeps_token_and_result_in_one_field_and_older_ones_still_read(
    mq: EchoMQ,
) -> None:
    q = mq.queue("rt-q")
    q.holder = "host-1-abcdef12"  # as a worker's handle: its tokens name it
    new, old = q.add(1), q.add(2)
    jobs = {j.id: j for j in q.claim(5)}
    q.complete_many([(jobs[new], {"v": 1}), (jobs[old], {"v": 2})])
    done = _hget(mq, "rt-q", new, "done")
    assert done is not None and split_done(done) == (jobs[new].token, b'{"v":1}')
    assert _hget(mq, "rt-q", new, "result") is None and _hget(mq, "rt-q", new, "token") is None
    # the other row as today's complete.lua wrote it: 'result' and 'token' of their own
    row = mq.keys.job("rt-q", old)
    mq.connection.execute(
        [
            Call.cmd("HDEL", row, "done"),
            Call.cmd("HSET", row, "result", b'{"v":2}', "token", jobs[old].token),
        ]
    )
    for job_id, value in ((new, {"v": 1}), (old, {"v": 2})):
        info = mq.get_job("rt-q", job_id)
        assert (info.state, info.result) == ("completed", value)
        detail = mq.perform(job_detail(mq.keys, "rt-q", job_id, mq.serializer))
        assert detail is not None and detail.holder == "abcdef12"
        assert detail.started_ms is not None and detail.started_ms > 0
