"""The browsing reads (echomq_core.seeing.browse, echomq_core.flows.children) and a plain job's
cancel, on standalone and a real Cluster: a job with everything known about it, a queue's jobs by
state in server order, a flow's children in spec order with each filter, find-by-id, search by
error."""

from __future__ import annotations

import pytest

from echomq_core import Child, EchoMQ, JobSpec
from echomq_core.errors import InvalidArgument
from echomq_core.flows.children import ChildPage, children_page, search_failed
from echomq_core.seeing.browse import PAGE, job_detail, oldest_pending, queue_page


def test_cancel_a_pending_and_a_delayed_plain_job_then_retry_it(mq: EchoMQ) -> None:
    q = mq.queue("bw-plain")
    leased = q.add({"n": 3})
    (job,) = q.claim(1)
    assert job.id == leased
    now = q.add({"n": 1})
    later = q.add({"n": 2}, delay=3600)
    ref = mq.add_flow("bw-plain", [Child(0)], barrier=True)
    cancelled, left = q.cancel([now, later, leased, f"{ref.parent_id}.0", "JOB-none"], reason="x")
    assert (cancelled, left) == (2, [leased, f"{ref.parent_id}.0", "JOB-none"])
    for job_id in (now, later):
        info = q.get_job(job_id)
        assert (info.state, info.error) == ("dead", "cancelled: x")
    assert q.stats()["pending"] == 1 and q.stats()["delayed"] == 0  # the flow's child stays
    assert q.retry_dead([now]) == (1, [])
    assert q.get_job(now).state == "pending"
    with pytest.raises(InvalidArgument):
        q.cancel(now)  # a string, not a list


def test_a_job_in_detail(mq: EchoMQ) -> None:
    q = mq.queue("bw-detail")
    first = q.add({"a": 1}, priority=5)
    assert q.add({"a": 2}) != first
    d = mq.perform(job_detail(mq.keys, "bw-detail", first, mq.serializer))
    assert d is not None and d.info.state == "pending" and d.priority == 5
    assert d.created_ms is not None and d.lease is None
    (job,) = q.claim(1)  # priority 0 first
    d2 = mq.perform(job_detail(mq.keys, "bw-detail", job.id, mq.serializer))
    assert d2 is not None and d2.info.state == "active" and d2.lease and d2.deadline_ms
    assert mq.perform(job_detail(mq.keys, "bw-detail", "JOB-missing", mq.serializer)) is None
    ages = mq.perform(oldest_pending(mq.keys, ["bw-detail", "bw-empty"]))
    assert ages["bw-empty"] is None
    age = ages["bw-detail"]
    assert age is not None and 0 <= age < 60


def test_a_queue_by_state_in_server_order(mq: EchoMQ) -> None:
    q = mq.queue("bw-list")
    ids = q.add_bulk([JobSpec(i) for i in range(PAGE + 7)])
    page = mq.perform(queue_page(mq.keys, "bw-list", "pending", 0))
    assert page.total == PAGE + 7 and [r.id for r in page.rows] == ids[:PAGE]
    rest = mq.perform(queue_page(mq.keys, "bw-list", "pending", PAGE))
    assert [r.id for r in rest.rows] == ids[PAGE:]
    for job in q.claim(3):
        q.fail(job, f"boom {job.payload}", retry=False)
    dead = mq.perform(queue_page(mq.keys, "bw-list", "dead", 0))
    assert dead.total == 3 and {r.error for r in dead.rows} == {"boom 0", "boom 1", "boom 2"}
    with pytest.raises(InvalidArgument, match="state must be one of"):
        mq.perform(queue_page(mq.keys, "bw-list", "sleeping", 0))


def test_a_flows_children_in_spec_order_with_each_filter(mq: EchoMQ) -> None:
    n = 120
    ref = mq.add_flow("bw-flow", [Child(i, max_attempts=1) for i in range(n)], barrier=True)
    pid, q = ref.parent_id, mq.queue("bw-flow")
    jobs = sorted(q.claim(n), key=lambda j: j.payload)
    q.complete_many([(j, j.payload * 10) for j in jobs if j.payload % 3 == 0])  # 40 done
    for j in jobs:
        if j.payload in (7, 101):
            q.fail(j, f"ValueError: row {j.payload} is bad", retry=False)
    q.release([j for j in jobs if j.payload % 3 and j.payload not in (7, 101)])

    def page(show: str = "all", offset: int = 0, find: str | None = None) -> ChildPage:
        op = children_page(
            mq.keys, "bw-flow", pid, mq.serializer, show=show, offset=offset, find=find
        )
        found = mq.perform(op)
        assert found is not None
        return found

    first = page()
    assert [r.id for r in first.rows] == [f"{pid}.{i}" for i in range(PAGE)]  # .0 .1 ... .10
    assert first.rows[0].status == "completed" and first.rows[0].value == 0
    assert first.rows[1].status == "pending" and first.rows[7].status == "failed"
    assert first.next == PAGE and first.counts["completed"] == 40
    done = page(show="completed")
    assert [r.index for r in done.rows] == list(range(0, n, 3))
    assert done.walked and done.next is None
    failed = page(show="failed")
    assert [r.id for r in failed.rows] == [f"{pid}.7", f"{pid}.101"]
    assert "row 7 is bad" in (failed.rows[0].error or "")
    pending = page(show="pending", offset=100)
    assert [r.index for r in pending.rows] == [i for i in range(100, n) if i % 3 and i != 101]
    found = page(find=f"{pid}.101")
    assert found.offset == 100 and any(r.id == f"{pid}.101" for r in found.rows)
    missing = page(find="JOB-nobody")
    assert missing.rows == [] and "no child" in missing.note
    rows, more = mq.perform(search_failed(mq.keys, "bw-flow", pid, "ROW 101", mq.serializer))
    assert [r.id for r in rows] == [f"{pid}.101"] and more == ""
