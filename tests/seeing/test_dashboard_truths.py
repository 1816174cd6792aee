"""What the dashboard says is so (issue 48): attempts made on completed and running jobs, a
completed flow child's value, a failed flow's outstanding children without its dead, a capped
flow whose children's queue no worker serves, expired leases flagged, a queue page that opens
on a state holding jobs, and footers free of the storage's internals - each on a real
``echomq dashboard`` process against real flows and workers on a real server, read through
the HTML pages and their JSON twins."""

from __future__ import annotations

import html
import json
import re
import threading
from typing import Any
from urllib.parse import quote

from echomq_core import Child, EchoMQ, Job, Pump, Worker
from echomq_core.wire.calls import Call, Op

from ..dashkit import Dashboard
from ..flowkit import work_off
from ..waiting import eventually

AF_ID = "JOB-af/warehouse_etl/load_orders/scheduled__2026-12-07T00.00.00+00.00/0f3c9a1e"


def sent(mq: EchoMQ, *command: object) -> Any:
    """One command through the client's own connection (routed by its key in a Cluster)."""

    def op() -> Op[Any]:
        (reply,) = yield [Call.cmd(*command)]
        return reply

    return mq.perform(op())


def page(d: Dashboard, path: str) -> str:
    reply = d.get(path)
    assert reply.status == 200, reply.body[:2000]
    return reply.body


def api(d: Dashboard, path: str) -> dict[str, object]:
    got: dict[str, object] = json.loads(page(d, "/api" + path))
    return got


def element(body: str, element_id: str) -> str:
    """The text of the element with ``element_id`` (tags dropped, spaces folded)."""
    found = re.search(rf'id="{re.escape(element_id)}"[^>]*>(.*?)</(span|p|pre|td|div)>', body, re.S)
    assert found, f"no #{element_id} on the page"
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).split())


def job_path(queue: str, job_id: str) -> str:
    return f"/job/{quote(queue, safe='')}/{quote(job_id, safe='/')}"


def flow_path(queue: str, pid: str) -> str:
    return f"/flow/{quote(queue, safe='')}/{quote(pid, safe='')}"


def row_cells(body: str, job_id: str) -> list[str]:
    row = rf'<tr data-job="{re.escape(html.escape(job_id))}"[^>]*>(.*?)</tr>'
    found = re.search(row, body, re.S)
    assert found, f"no row of {job_id}"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", found.group(1), re.S)
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", "", c)).split()) for c in cells]


def test_attempts_count_the_running_and_the_successful_attempt(
    mq: EchoMQ, dashboard: Dashboard
) -> None:
    """A job completed at its first try made 1 attempt (the page said ``0 / 3``), a running one
    is at its first (said ``0 / 3``), a job that failed once and waits for its retry made 1."""
    q = mq.queue("tr-att", max_attempts=3)
    done_id, running_id, retry_id = (q.add({"n": i}, job_id=f"{AF_ID}.{i}") for i in range(3))
    jobs = {j.id: j for j in q.claim(3)}
    q.complete(jobs[done_id], "ok")
    q.fail(jobs[retry_id], "RuntimeError: try 1", retry=True)
    for job_id, state, made in ((done_id, "completed", 1), (running_id, "active", 1)):
        got = api(dashboard, job_path("tr-att", job_id))
        assert got["state"] == state and got["attempts"] == 0  # the row counts failed ones
        assert got["attempts_made"] == made
        assert element(page(dashboard, job_path("tr-att", job_id)), "job-attempts") == "1 of 3"
    retried = page(dashboard, job_path("tr-att", retry_id))
    assert element(retried, "job-attempts") == "1 of 3"
    assert element(retried, "job-failed-attempts") == "(1 failed)"
    for state, job_id in (("completed", done_id), ("active", running_id)):
        listed = page(dashboard, f"/queue/tr-att?state={state}")
        assert row_cells(listed, job_id)[3] == "1 of 3"
        rows = api(dashboard, f"/queue/tr-att?state={state}")["jobs"]
        assert isinstance(rows, list) and [r["attempts_made"] for r in rows] == [1]


def test_a_completed_flow_childs_page_shows_its_value_and_says_what_is_not_recorded(
    mq: EchoMQ, dashboard: Dashboard
) -> None:
    """A flow child's completion writes no row (its value goes into its flow): its page showed
    no result and said nothing of its worker; now the value is read from the flow and the
    page says that the worker and duration are not recorded for a flow's child."""
    ref = mq.add_flow(
        "tr-parents",
        [Child({"n": i}, queue="tr-kids") for i in range(3)],
        parent_id=AF_ID,
        barrier=True,
    )
    worker = Worker(mq, {"tr-kids": lambda job: {"square": job.payload["n"] ** 2}}).start()
    pump = Pump(mq, ["tr-kids", "tr-parents"]).start()
    try:
        eventually(lambda: mq.snapshot(ref.queue, ref.parent_id).released, 30, "the release")
    finally:
        worker.stop()
        pump.stop()
    child = f"{AF_ID}.2"
    got = api(dashboard, job_path("tr-kids", child))
    assert got["state"] == "completed" and got["result"] == {"square": 4}
    assert got["attempts_made"] == 1
    body = page(dashboard, job_path("tr-kids", child))
    assert json.loads(element(body, "job-result")) == {"square": 4}
    assert "not recorded" in element(body, "job-unrecorded")
    assert element(body, "job-finished") != "-"


def test_a_failed_flows_dead_children_are_not_outstanding(mq: EchoMQ, dashboard: Dashboard) -> None:
    """A flow failed by 2 dead children, its third completed: nothing is outstanding (the
    page said ``outstanding 2``: the snapshot's dependencies still count the dead)."""
    ref = mq.add_flow(
        "tr-fail", [Child({"n": i}, max_attempts=1) for i in range(3)], parent_id=AF_ID
    )
    q = mq.queue("tr-fail")
    jobs = sorted((j for j in q.claim(10) if j.parent is not None), key=lambda j: j.id)
    q.fail(jobs[0], "RuntimeError: disk full", retry=False)
    q.fail(jobs[1], "RuntimeError: disk full", retry=False)
    q.complete(jobs[2], 1)
    snap = mq.snapshot("tr-fail", ref.parent_id)
    assert snap.parent_state == "failed" and snap.dependencies == 2 and snap.failed == 2
    body = page(dashboard, flow_path("tr-fail", ref.parent_id))
    assert element(body, "flow-outstanding") == "0"
    live = api(dashboard, flow_path("tr-fail", ref.parent_id))
    assert isinstance(live["flow"], dict) and live["flow"]["outstanding"] == 0
    parent_job = page(dashboard, job_path("tr-fail", ref.parent_id))
    assert "0 outstanding" in " ".join(re.sub(r"<[^>]+>", "", parent_job).split())

    # a min_success death that was tolerated settles: it is not among the outstanding either,
    # and the 3 children still to run are
    held = mq.add_flow(
        "tr-allow", [Child({"n": i}, max_attempts=1) for i in range(4)], min_success=3
    )
    q = mq.queue("tr-allow")
    first = next(j for j in q.claim(10) if j.parent is not None)
    q.fail(first, "RuntimeError: one bad row", retry=False)
    snap = mq.snapshot("tr-allow", held.parent_id)
    assert (snap.parent_state, snap.dependencies, snap.failed) == ("held", 3, 1)
    assert (
        element(page(dashboard, flow_path("tr-allow", held.parent_id)), "flow-outstanding") == "3"
    )


def test_a_capped_flow_whose_queue_no_worker_serves_is_not_said_to_run(
    mq: EchoMQ, dashboard: Dashboard
) -> None:
    """20 children capped at 5 running, in a queue no worker serves: 5 hold a token and sit in
    pending. The page said ``5 / 5 running``; now it says none runs and asks, as wait()'s
    stall reading does, whether a worker serves the queue. Once a worker runs one (held in
    its handler by a gate the test opens), the line says running again."""
    ref = mq.add_flow(
        "tr-cap-parents",
        [Child({"n": i}, queue="tr-cap-kids") for i in range(20)],
        parent_id=AF_ID,
        barrier=True,
        max_running=5,
    )
    path = flow_path("tr-cap-parents", ref.parent_id)
    line = element(page(dashboard, path), "flow-running")
    assert line.startswith("5 / 5 admitted, none running")
    assert "does a worker serve it?" in line and "'tr-cap-kids'" in line
    controls = api(dashboard, path)["controls"]
    assert isinstance(controls, dict) and "none running" in controls["running"]

    started, gate = threading.Event(), threading.Event()

    def held(job: Job) -> int:
        started.set()
        gate.wait(30)
        return 1

    worker = Worker(mq, {"tr-cap-kids": held}, concurrency=1).start()
    try:
        assert started.wait(30)
        line = element(page(dashboard, path), "flow-running")
        assert line.startswith("5 / 5 running") and "worker" not in line
    finally:
        gate.set()
        worker.stop()


def test_an_active_job_whose_lease_expired_is_flagged(mq: EchoMQ, dashboard: Dashboard) -> None:
    """Two leased jobs; one's lease deadline is set 5 minutes back (as a worker killed 5
    minutes ago leaves it when nothing recovers it): the active page, its JSON and the job's
    page flag that one, not the other."""
    q = mq.queue("tr-lease")
    stale_id = q.add({"n": 1}, job_id=AF_ID)
    fresh_id = q.add({"n": 2})
    assert len(q.claim(2, lease=600)) == 2
    now_ms = int(sent(mq, "TIME")[0]) * 1000
    sent(mq, "ZADD", mq.keys.active("tr-lease"), "XX", now_ms - 300_000, stale_id)
    listed = page(dashboard, "/queue/tr-lease?state=active")
    stale_row = re.search(rf'<tr data-job="{re.escape(html.escape(stale_id))}"[^>]*>', listed)
    fresh_row = re.search(rf'<tr data-job="{fresh_id}"[^>]*>', listed)
    assert stale_row and 'data-expired="1"' in stale_row.group(0)
    assert fresh_row and "expired" not in fresh_row.group(0)
    assert re.search(r"expired (4\.9|5\.0|5\.1)m ago", row_cells(listed, stale_id)[2])
    rows = api(dashboard, "/queue/tr-lease?state=active")["jobs"]
    assert isinstance(rows, list)
    assert {r["id"]: r["lease_expired"] for r in rows} == {stale_id: True, fresh_id: False}
    assert "lease expired" in element(
        page(dashboard, job_path("tr-lease", stale_id)), "job-lease-expired"
    )
    assert 'id="job-lease-expired"' not in page(dashboard, job_path("tr-lease", fresh_id))


def test_a_queue_page_opens_on_a_state_that_holds_jobs(mq: EchoMQ, dashboard: Dashboard) -> None:
    """A queue whose jobs all completed opened on its empty pending tab; now on completed.
    A tab asked for by name is shown as asked, empty or not."""
    q = mq.queue("tr-open")
    ids = [q.add({"n": i}) for i in range(3)]
    q.complete_many([(j, j.payload["n"]) for j in q.claim(3)])
    body = page(dashboard, "/queue/tr-open")
    assert 'class="on" data-state="completed"' in body
    assert all(f'data-job="{i}"' in body for i in ids)
    asked = page(dashboard, "/queue/tr-open?state=pending")
    assert 'class="on" data-state="pending"' in asked and "No pending jobs" in asked


#: What the pages' footers said of the storage (now in docs/operations/metrics-dashboard.md).
INTERNALS = (
    "ZRANGE",
    "HMGET",
    "HSCAN",
    "Lua",
    ".lua",
    "lease token",
    "copy them onto the row",
    "lease / 3",
)


def test_page_footers_hold_no_internals(mq: EchoMQ, dashboard: Dashboard) -> None:
    q = mq.queue("tr-foot")
    job_id = q.add({"n": 1})
    q.complete(q.claim(1)[0], 1)
    for path in (
        "/",
        "/queue/tr-foot",
        "/queue/tr-foot?state=active",
        job_path("tr-foot", job_id),
        "/workers",
        "/flows",
    ):
        text = re.sub(r"<[^>]+>", " ", page(dashboard, path))
        said = [word for word in INTERNALS if word in text]
        assert not said, f"{path} says {said}"


def test_a_completed_jobs_earlier_error_is_not_shown_as_its_error(
    mq: EchoMQ, dashboard: Dashboard
) -> None:
    """A job that failed once, then completed: its row keeps the failed attempt's error, which
    the page headed "Error" (with the traceback open) above its result."""
    from echomq_core import Backoff

    q = mq.queue("tr-earlier", max_attempts=3, backoff=Backoff(0, 0))
    job_id = q.add({"n": 1}, job_id=AF_ID)
    q.fail(q.claim(1)[0], "ConnectionError: timed out", retry=True)
    (job,) = eventually(lambda: list(q.claim(1)), 10, "the retry to be claimable")
    q.complete(job, "ok")
    body = page(dashboard, job_path("tr-earlier", job_id))
    assert re.search(r"<h2>Error of an earlier attempt</h2>", body)
    assert "<h2>Error</h2>" not in body
    assert element(body, "job-attempts") == "2 of 3"


def test_the_flows_page_lists_completed_worker_run_flows(mq: EchoMQ, dashboard: Dashboard) -> None:
    """A worker-run root whose parent job completed was on no flow index: the Flows page never
    listed it and ``?state=completed`` was refused (400). It is listed, counted and filtered."""
    done = mq.add_flow("tc-p", [Child(i, queue="tc-k") for i in range(2)], parent_id=AF_ID)
    work_off(mq, ["tc-k", "tc-p"])  # the children, then the released parent runs
    mq.add_flow("tc-p", [Child(9, queue="tc-k")], parent_id="JOB-held")
    listed = api(dashboard, "/flows?queue=tc-p&state=completed")
    assert listed["counts"] == {"tc-p": {**listed["counts"]["tc-p"], "completed": 1}}  # type: ignore[index]
    assert list(listed["flows"]["tc-p"]) == [done.parent_id]  # type: ignore[index]
    assert listed["flows"]["tc-p"][done.parent_id]["state"] == "completed"  # type: ignore[index]
    body = page(dashboard, "/flows?queue=tc-p&state=completed")
    assert html.escape(done.parent_id) in body and "JOB-held" not in body
    assert re.search(r"completed\s*\(1\)", body), "the completed tab counts the flow"
