"""The dashboard in a real browser: headless Chromium (Debian's, fetched by
scripts/fetch-chromium.sh on first use) loads every page of a real ``echomq dashboard``
process (uvicorn) against real flows - held, released, failed, cancelled, nested, dead,
poison - checks what it shows and that no script or policy error was raised, watches a flow
progress without a reload, and with actions on signs in, cancels and repairs a flow by clicking.

Screenshots: each test writes its pages' PNGs to a temporary folder, or to
``$ECHOMQ_SCREENSHOTS``; the documentation's are made by scripts/dashboard-screenshots.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

from echomq_core import EchoMQ, JobSpec, Pump

from ..dashkit import BAD_ROW, TOKEN, Dashboard, Scenario, failing_flow
from .cdp import Browser

#: Page loads slower than this fail the test: the pages are small and read bounded pages.
MAX_LOAD_SECONDS = 5.0


def flow_url(d: Dashboard, queue: str, pid: str) -> str:
    return f"{d.base}/flow/{quote(queue, safe='')}/{quote(pid, safe='')}"


def load(browser: Browser, url: str, timings: dict[str, float], name: str) -> None:
    took = browser.goto(url)
    timings[name] = took
    assert took < MAX_LOAD_SECONDS, f"{name} took {took:.2f}s"
    assert browser.errors() == [], f"{name}: {browser.errors()}"


def test_every_page_in_chromium(
    browser: Browser, scenario: Scenario, readonly: Dashboard, shots: Path
) -> None:
    s, d, timings = scenario, readonly, {}
    load(browser, f"{d.base}/", timings, "queues")
    assert browser.js("document.querySelectorAll('#queues tbody tr').length") == 3
    assert browser.text('[data-k="queues|dk-kids|poison"]') == "1"
    assert browser.text("#mode") == "read-only"
    browser.screenshot(shots / "queues.png")

    load(browser, f"{d.base}/flows?queue=dk-parents", timings, "flows")
    rows = browser.js(
        "[...document.querySelectorAll('#flows tbody tr')].map(r => [r.dataset.flow,"
        " r.querySelector('.state').textContent, r.querySelector('progress').value,"
        " r.querySelector('progress').max])"
    )
    by_id = {pid: (state, value, top) for pid, state, value, top in rows}
    assert by_id[s.held.parent_id] == ("held", 4, 10)
    assert by_id[s.released.parent_id] == ("released", 3, 3)
    assert by_id[s.failed.parent_id][0] == "failed"
    assert by_id[s.cancelled.parent_id][0] == "cancelled"
    browser.screenshot(shots / "flows.png")

    load(browser, flow_url(d, "dk-parents", s.held.parent_id), timings, "flow (held)")
    assert browser.text("#flow-state") == "held"
    assert browser.js("document.querySelector('#flow-progress').value") == 4
    assert browser.js("document.querySelectorAll('#values tbody tr').length") == 4

    load(browser, flow_url(d, "dk-parents", s.failed.parent_id), timings, "flow (failed)")
    assert browser.text("#flow-state") == "failed"
    assert "RuntimeError: disk full on part 0" in browser.text("#failed-children")
    browser.screenshot(shots / "flow-failed.png")

    load(browser, flow_url(d, "dk-parents", s.released.parent_id), timings, "flow (released)")
    assert browser.text("#flow-state") == "released"
    assert "ValueError: bad row 2" in browser.text("#ignored-children")

    load(browser, flow_url(d, "dk-parents", s.cancelled.parent_id), timings, "flow (cancelled)")
    assert browser.text("#flow-state") == "cancelled"
    assert browser.text("#flow-error") == "wrong input file"

    load(browser, flow_url(d, "dk-parents", s.nested.parent_id), timings, "flow (nested)")
    assert browser.js("document.querySelectorAll('#tree li[data-node]').length") == 2
    browser.screenshot(shots / "flow-nested.png")
    browser.click("#tree li a")  # into a sub-flow, and back up through its root link
    browser.wait_for("document.querySelector('#root-link') !== null")
    assert browser.text("#flow-state") == "held"
    browser.click("#root-link")
    browser.wait_for(f"location.pathname.endsWith('{s.nested.parent_id}')")

    load(browser, f"{d.base}/dead/dk-plain", timings, "dead")
    assert "KeyError: 'customer_id'" in browser.text("#dead")
    load(browser, f"{d.base}/poison/dk-kids", timings, "poison")
    assert "malformed signal" in browser.text("#poison")
    browser.goto(flow_url(d, "dk-parents", "JOB-nope"))  # the page itself is a 404
    assert browser.text("h1") == "JobNotFound"
    assert "never added, or expired" in browser.text("#error")
    print("page loads (s):", {k: round(v, 3) for k, v in timings.items()})


def test_a_flow_whose_names_hold_slashes_opens_from_the_list(
    browser: Browser, client: EchoMQ, readonly: Dashboard, shots: Path
) -> None:
    """An Airflow-derived parent id (``JOB-af/<dag>/<task>/<digest>``) in a queue whose name
    holds ``/``: clicked in /flows, its page opens, polls its JSON twin live, and its tree
    links to the sub-flow and back."""
    from echomq_provider.flow_specs import parent_id_for

    from echomq_core import Child

    queue = "team/reports@v2"
    pid = parent_id_for("echomq_fan_out", "manual__2026-01-01T00:00:00+00:00", "fan_out")
    client.add_flow(
        queue,
        [Child(queue="dk-kids", children=[Child(i, queue="dk-kids") for i in range(3)])]
        + [Child(i, queue="dk-kids") for i in range(5)],
        parent_id=pid,
        barrier=True,
    )
    browser.goto(f"{readonly.base}/flows")
    browser.js(
        f"[...document.querySelectorAll('#flows a')].find(a => a.textContent === '{pid}')"
        ".setAttribute('id', 'the-flow')"
    )
    browser.click("#the-flow")
    browser.wait_for("document.querySelector('#flow-state') !== null")
    assert browser.js("decodeURIComponent(location.pathname)") == f"/flow/{queue}/{pid}"
    assert browser.text("h1") == f"Flow {pid} {queue}"
    assert browser.text("#flow-state") == "held"
    browser.wait_for("document.querySelector('#live-status').className === 'ok'")
    browser.screenshot(shots / "flow-slashes.png")
    browser.click("#tree li a")
    browser.wait_for("document.querySelector('#root-link') !== null")
    assert browser.text("h1") == f"Flow {pid}.0 dk-kids"
    browser.click("#root-link")
    browser.wait_for(f"document.querySelector('h1').textContent === 'Flow {pid} {queue}'")
    assert browser.errors() == []


def test_a_dead_childs_traceback_expands_as_text(
    browser: Browser, client: EchoMQ, readonly: Dashboard, shots: Path
) -> None:
    """A failed flow's page and the dead-jobs list: each dead child's traceback collapsed,
    opened by a click, its markup (the bad row is a <script> tag) shown as text."""
    ref = failing_flow(client)
    bad, _ = client.child_failures(ref.queue, ref.parent_id)
    browser.goto(flow_url(readonly, ref.queue, ref.parent_id))
    row = f"document.querySelector('#failed-children tr[data-child=\"{bad.job_id}\"]')"
    assert browser.js(f"{row}.querySelector('details').open") is False
    browser.js(f"{row}.querySelector('summary').setAttribute('id', 'open-trace')")
    browser.click("#open-trace")
    browser.wait_for(f"{row}.querySelector('details').open === true")
    shown = browser.js(f"{row}.querySelector('pre').innerText")
    assert shown.rstrip() == (bad.traceback or "").rstrip()
    assert BAD_ROW in shown and "in _to_int" in shown
    assert browser.js("document.querySelectorAll('main script').length") == 0
    assert browser.js("document.querySelectorAll('#ignored-children details').length") == 1
    browser.screenshot(shots / "flow-traceback.png")
    browser.goto(f"{readonly.base}/dead/tb-kids")
    assert browser.js("document.querySelectorAll('#dead details.traceback').length") == 2
    assert browser.js("document.querySelectorAll('main script').length") == 0
    assert browser.errors() == []


def test_progress_updates_without_a_reload(
    browser: Browser, scenario: Scenario, readonly: Dashboard, client: EchoMQ
) -> None:
    browser.goto(flow_url(readonly, "dk-parents", scenario.held.parent_id))
    browser.js("window.__loadedOnce = 'yes'")  # gone if the page reloads
    assert browser.text("#flow-processed") == "4"
    kids = client.queue("dk-kids")
    rest = [j for j in kids.claim(10) if j.parent and j.parent.id == scenario.held.parent_id]
    assert len(rest) == 6
    pump = Pump(client, ["dk-kids", "dk-parents"])  # cross-queue: the Pump delivers
    kids.complete_many([(job, {"square": 0}) for job in rest[:3]])
    pump.tick()
    browser.wait_for("document.querySelector('#flow-processed').textContent === '7'")
    assert browser.js("document.querySelector('#flow-progress').value") == 7
    kids.complete_many([(job, {"square": 0}) for job in rest[3:]])
    pump.tick()
    browser.wait_for("document.querySelector('#flow-state').textContent === 'released'")
    assert browser.js("window.__loadedOnce") == "yes"
    assert browser.text("#flow-outstanding") == "0"
    assert browser.text("#live-status").startswith("live")
    assert browser.errors() == []


def test_lists_update_without_a_reload(
    browser: Browser, scenario: Scenario, readonly: Dashboard, client: EchoMQ
) -> None:
    """The overview's counts and the flow list's progress bars follow the server live."""
    held = scenario.held.parent_id
    browser.goto(f"{readonly.base}/flows?queue=dk-parents&state=held")
    browser.js("window.__loadedOnce = 'yes'")
    bar = f"document.querySelector('tr[data-flow=\"{held}\"] progress')"
    assert browser.js(f"{bar}.value") == 4
    kids = client.queue("dk-kids")
    mine = [j for j in kids.claim(10) if j.parent and j.parent.id == held]
    kids.complete_many([(job, 0) for job in mine[:2]])
    pump = Pump(client, ["dk-kids", "dk-parents"])
    pump.tick()
    browser.wait_for(f"{bar}.value === 6")
    assert browser.js("window.__loadedOnce") == "yes"

    browser.goto(f"{readonly.base}/")
    browser.js("window.__loadedOnce = 'yes'")
    pending = "document.querySelector('[data-k=\"queues|dk-plain|pending\"]').textContent"
    assert browser.js(pending) == "0"
    client.queue("dk-plain").add_bulk([JobSpec(i) for i in range(1234)])
    browser.wait_for(f"{pending} === '1,234'")
    assert browser.js("window.__loadedOnce") == "yes"
    assert browser.errors() == []
    pump.release_leases()


def test_sign_in_then_cancel_and_repair_by_clicking(
    browser: Browser, scenario: Scenario, actions: Dashboard, client: EchoMQ, shots: Path
) -> None:
    held, failed = scenario.held.parent_id, scenario.failed.parent_id
    browser.goto(flow_url(actions, "dk-parents", held))
    assert browser.js("document.querySelector('#cancel') === null")  # not signed in yet
    browser.goto(f"{actions.base}/login")
    browser.type_into("#token", "not-the-token-at-all")
    browser.click("#login")
    browser.wait_for("document.querySelector('#login-error') !== null")
    browser.type_into("#token", TOKEN)
    browser.click("#login")
    browser.wait_for("document.querySelector('#mode').textContent.includes('actions on')")

    browser.goto(flow_url(actions, "dk-parents", held))
    browser.type_into("#cancel-reason", "clicked in the browser")
    browser.click("#cancel")
    browser.wait_for("document.querySelector('#notice') !== null")
    assert browser.text("#flow-state") == "cancelled"
    assert "children stopped" in browser.text("#notice")
    snap = client.snapshot("dk-parents", held)
    assert (snap.parent_state, snap.error) == ("cancelled", "clicked in the browser")

    browser.goto(flow_url(actions, "dk-parents", failed))
    browser.screenshot(shots / "flow-actions.png")
    browser.click("#retry")
    browser.wait_for("document.querySelector('#notice') !== null")
    assert browser.text("#flow-state") == "held"
    assert "back to work" in browser.text("#notice")
    assert client.snapshot("dk-parents", failed).parent_state == "held"
    pending = client.queue("dk-parents").stats()["pending"]
    assert pending >= 1  # the dead child is back to work

    browser.goto(f"{actions.base}/poison/dk-kids")
    browser.click("#replay")
    browser.wait_for("document.querySelector('#notice') !== null")
    assert client.queue("dk-kids").stats()["poison"] == 0

    browser.goto(f"{actions.base}/dead/dk-plain")
    browser.click(f"tr[data-job='{scenario.dead_job}'] .retry-job")
    browser.wait_for("document.querySelector('#notice') !== null")
    assert "queued again" in browser.text("#notice")
    assert client.queue("dk-plain").get_job(scenario.dead_job).state == "pending"
    assert browser.errors() == []


def test_job_queue_and_children_pages_in_chromium(
    browser: Browser, client: EchoMQ, readonly: Dashboard, shots: Path
) -> None:
    """From a failed flow to why: the flow page's failed child opens its job page (error,
    traceback, payload as text), the children page lists the flow in spec order with a
    filter and find-by-id, and a queue's pending jobs page in claim order with find-by-id."""
    from echomq_core import Child

    ref = failing_flow(client)
    bad, _ = client.child_failures(ref.queue, ref.parent_id)
    browser.goto(flow_url(readonly, ref.queue, ref.parent_id))
    browser.click(f'#failed-children tr[data-child="{bad.job_id}"] a')
    browser.wait_for("document.querySelector('#job-state') !== null")
    assert browser.text("#job-id") == bad.job_id and browser.text("#job-state") == "dead"
    assert BAD_ROW in browser.text("#job-traceback")
    assert json.loads(browser.text("#job-payload")) == {"row": BAD_ROW}  # as text, not a tag
    assert browser.js("document.querySelectorAll('main script').length") == 0
    assert browser.errors() == []
    browser.screenshot(shots / "job.png")
    browser.click("#job-parent")  # back to the flow, then to its children
    browser.wait_for("document.querySelector('#children-link') !== null")
    # the link's target, loaded by URL: a click by coordinates on a live page can land on
    # another link when a refresh moves the layout between the box read and the press
    href = browser.js("document.querySelector('#children-link').href")
    assert href == flow_url(readonly, ref.queue, ref.parent_id) + "/children"
    browser.goto(href)
    browser.wait_for("document.querySelector('#children') !== null")
    rows = browser.js(
        "[...document.querySelectorAll('#children tbody tr')].map(r => r.dataset.child)"
    )
    assert rows == [f"{ref.parent_id}.{i}" for i in range(6)]

    big = client.add_flow("dk-big", [Child(i) for i in range(2_000)], barrier=True)
    q = client.queue("dk-big")
    jobs = q.claim(30)
    q.complete_many([(j, {"square": j.payload**2}) for j in jobs[:25]])
    for j in jobs[25:28]:
        q.fail(j, f"ValueError: row {j.payload} has no customer_id", retry=False)
    q.release(jobs[28:])
    timings: dict[str, float] = {}
    load(browser, flow_url(readonly, "dk-big", big.parent_id) + "/children", timings, "children")
    browser.type_into("#find", f"{big.parent_id}.1234")
    browser.click("#find-go")
    browser.wait_for("document.querySelector('tr.found') !== null")
    assert browser.js("document.querySelector('tr.found').dataset.child") == f"{big.parent_id}.1234"
    load(browser, flow_url(readonly, "dk-big", big.parent_id) + "/children", timings, "children")
    browser.screenshot(shots / "children.png")
    browser.click('#shows a[data-show="failed"]')
    browser.wait_for("location.search.includes('show=failed')")
    assert browser.js("document.querySelectorAll('#children tbody tr').length") == 3
    browser.type_into("#search", "row 27")
    browser.click("#search-go")
    browser.wait_for("document.querySelector('#matches') !== null")
    assert browser.js(
        "[...document.querySelectorAll('#matches tbody tr')].map(r => r.dataset.child)"
    ) == [f"{big.parent_id}.27"]

    plain = client.queue("dk-plain")
    ids = plain.add_bulk([JobSpec({"n": i}) for i in range(60)])
    load(browser, f"{readonly.base}/queue/dk-plain", timings, "queue")
    listed = browser.js("[...document.querySelectorAll('#jobs tbody tr')].map(r => r.dataset.job)")
    assert listed == ids[:50]
    browser.screenshot(shots / "queue.png")
    browser.type_into("#find", ids[42])
    browser.click("#find-go")
    browser.wait_for("document.querySelector('#job-id') !== null")
    assert browser.text("#job-id") == ids[42] and browser.text("#job-state") == "pending"
    assert browser.errors() == []
    print("page loads (s):", {k: round(v, 3) for k, v in timings.items()})


def test_retry_from_the_job_page_by_clicking(
    browser: Browser, scenario: Scenario, actions: Dashboard, client: EchoMQ, shots: Path
) -> None:
    """The job page's Retry: not offered before signing in (and a POST without the session
    and CSRF field is refused), offered and done after."""
    dead = scenario.dead_job
    page = f"{actions.base}/job/dk-plain/{quote(dead, safe='')}"
    browser.goto(page)
    assert browser.js("document.querySelector('#retry') === null")
    assert "Sign in" in browser.text("#actions")
    # a forged POST from the page's own origin, without a session: refused, nothing changes
    status = browser.js(
        f"fetch('{page}/retry', {{method: 'POST', headers: {{'content-type': "
        "'application/x-www-form-urlencoded'}, body: 'csrf=x'}).then(r => r.status)"
    )
    assert status == 403 and client.queue("dk-plain").get_job(dead).state == "dead"
    browser.goto(f"{actions.base}/login")
    browser.type_into("#token", TOKEN)
    browser.click("#login")
    browser.wait_for("document.querySelector('#mode').textContent.includes('actions on')")
    browser.goto(page)
    browser.screenshot(shots / "job-actions.png")
    browser.click("#retry")
    browser.wait_for("document.querySelector('#notice') !== null")
    assert "queued again" in browser.text("#notice")
    assert browser.text("#job-state") == "pending"
    assert client.queue("dk-plain").get_job(dead).state == "pending"
    assert browser.errors() == []


def test_throughput_chart_and_workers_page_in_chromium(
    browser: Browser, client: EchoMQ, readonly: Dashboard, shots: Path
) -> None:
    """A real worker completes and fails jobs: the queue page's chart draws bars whose counts
    add up to them, with the oldest pending job's gauge; the workers page lists the worker
    while it runs (and, after its clean stop, no longer)."""
    import threading

    from echomq_core import Job, Worker

    from ..waiting import eventually

    gate = threading.Event()

    def handle(job: Job) -> int:
        if job.payload.get("hold"):
            gate.wait(30)
        if job.payload.get("fail"):
            raise RuntimeError("asked to fail")
        return 1

    q = client.queue("dk-chart", max_attempts=1)
    q.add_bulk([JobSpec({"n": i, "fail": i % 4 == 0}) for i in range(40)])
    worker = Worker(client, {"dk-chart": handle}, concurrency=3).start()
    timings: dict[str, float] = {}
    try:
        eventually(lambda: q.stats()["completed"] == 30 and q.stats()["dead"] == 10, 30)
        q.add_bulk([JobSpec({"hold": True}) for _ in range(2)])
        eventually(lambda: q.stats()["active"] == 2, 10)
        q.add({"n": "waiting"})  # a third runner takes it, or it waits: either way, measured
        load(browser, f"{readonly.base}/queue/dk-chart", timings, "queue-chart")
        bars = browser.js(
            "[...document.querySelectorAll('#throughput-chart rect')]"
            ".map(r => [r.getAttribute('class'), +r.dataset.n, r.getBBox().height])"
        )
        done = sum(n for kind, n, _ in bars if kind == "done")
        failed = sum(n for kind, n, _ in bars if kind == "failed")
        # the "waiting" job may have completed (a free runner) and been flushed by now
        assert done in (30, 31) and failed == 10
        assert all(h > 0 for _, _, h in bars)
        assert browser.text("#t-completed") in ("30", "31") and browser.text("#t-failed") == "10"
        browser.screenshot(shots / "queue-throughput.png")
        load(browser, f"{readonly.base}/workers", timings, "workers")
        me = worker.presence.entry.id
        assert browser.js(
            "[...document.querySelectorAll('#workers tbody tr')].map(r => r.dataset.worker)"
        ) == [me]
        browser.screenshot(shots / "workers.png")
    finally:
        gate.set()
        worker.stop()
    load(browser, f"{readonly.base}/workers", timings, "workers-after")
    assert browser.js("document.querySelector('#no-workers') !== null")
