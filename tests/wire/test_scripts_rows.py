"""The claim's rows read (claiming.ROW_FIELDS): every row carries, beside the fields every other
reader reads, ``run`` = '<max_attempts> <attempts> <stalls> <timeout | -> [<policy> <gate>
<parent_queue>]' (lua/includes/run.lua), so the read asks four fields of every row (with
``state``: a leaf has none, a released parent's tells its handler it runs as a parent), not
eight. fail.lua, recover.lua, requeue.lua and revive.lua keep the copy in step with the
separate fields, which stay the truth. Every script that writes a row writes ``run`` (add.lua,
land.lua, hold.lua): no row without it is ever claimed."""

from __future__ import annotations

from echomq_core import Child, EchoMQ, Pump
from echomq_core.flows.children import describe
from echomq_core.models import ParentRef, split_done
from echomq_core.queues import claiming
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
    assert claiming.ROW_FIELDS == ("payload", "parent", "run", "state")
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


def test_a_kept_row_keeps_token_and_result_in_one_field(mq: EchoMQ) -> None:
    q = mq.queue("rt-q")
    q.holder = "host-1-abcdef12"  # as a worker's handle: its tokens name it
    one, two = q.add(1), q.add(2)
    jobs = {j.id: j for j in q.claim(5)}
    q.complete_many([(jobs[one], {"v": 1}), (jobs[two], {"v": 2})])
    done = _hget(mq, "rt-q", one, "done")
    assert done is not None and split_done(done) == (jobs[one].token, b'{"v":1}')
    assert _hget(mq, "rt-q", one, "result") is None and _hget(mq, "rt-q", one, "token") is None
    for job_id, value in ((one, {"v": 1}), (two, {"v": 2})):
        info = mq.get_job("rt-q", job_id)
        assert (info.state, info.result) == ("completed", value)
        detail = mq.perform(job_detail(mq.keys, "rt-q", job_id, mq.serializer))
        assert detail is not None and detail.holder == "abcdef12"
        assert detail.started_ms is not None and detail.started_ms > 0
