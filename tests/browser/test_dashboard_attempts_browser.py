"""The job page's attempts and lease holder, and the queue page's chart range and live refresh,
in headless Chromium against a real ``echomq dashboard`` process and real workers.

Screenshots as in test_dashboard_browser.py (``ECHOMQ_SCREENSHOTS=docs/dashboard``):
job-attempts.png, job-active.png, queue-24h.png.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import redis

from echomq_core import Backoff, EchoMQ, Job, JobSpec, Worker
from echomq_core.queues.throughput import DAY
from echomq_core.server import EmbeddedServer

from ..dashkit import Dashboard
from ..waiting import eventually
from .cdp import Browser

AF_ID = "JOB-af/etl/parse/0f3c"


def fresh(browser: Browser) -> None:
    """A blank page first, its late events dropped: the page a previous test left polls a
    dashboard that has stopped, and those refused requests are not this test's."""
    browser.goto("about:blank")
    browser.errors()
    browser.events.clear()


def rows(browser: Browser, selector: str) -> list[list[str]]:
    return list(
        browser.js(
            f"[...document.querySelectorAll({selector!r})]"
            ".map(r => [...r.cells].map(c => c.textContent.trim()))"
        )
    )


def test_a_retried_job_and_an_active_job_in_chromium(
    standalone_server: EmbeddedServer,
    browser: Browser,
    client: EchoMQ,
    readonly: Dashboard,
    shots: Path,
) -> None:
    """A job that failed twice then completed shows three attempts with their times and its
    worker; a job held by a handler (until the test sets a gate key) shows the worker that
    holds its lease, linked to that worker's row on the workers page."""
    fresh(browser)
    raw = redis.Redis.from_url(standalone_server.url)
    gate = f"ab-gate-{uuid.uuid4().hex}"
    q = client.queue("ab-jobs", max_attempts=4, backoff=Backoff(0, 0))
    q.add({"step": "parse", "file": "2026-12-01.csv"}, job_id=AF_ID)
    tries: list[int] = []

    def handle(job: Job) -> object:
        if job.payload.get("hold"):
            eventually(lambda: raw.exists(gate), 60, "the gate key", every=0.01)
            return "released"
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError(f"upstream refused the read (try {len(tries)})")
        return {"rows": 1204}

    worker = Worker(client, {"ab-jobs": handle}, concurrency=2).start()
    me = worker.presence.entry
    try:
        eventually(lambda: q.stats()["completed"] == 1, 30)
        browser.goto(f"{readonly.base}/job/ab-jobs/{AF_ID}")
        assert browser.errors() == []
        log = rows(browser, "#job-attempt-log tbody tr")
        assert [r[5] for r in log] == ["retry", "retry", "completed"]
        assert [r[0] for r in log] == ["1", "2", "3"]
        assert all(r[1].startswith("20") and r[2].startswith("20") for r in log)
        assert all(r[4].endswith(me.id.rsplit("-", 1)[-1]) for r in log)
        assert "try 2" in log[1][6]
        assert browser.text("#job-started").startswith("20")
        assert f"{me.host} pid {me.pid}" in browser.text("#job-worker")
        browser.screenshot(shots / "job-attempts.png")

        held = q.add({"hold": True, "step": "load"})
        eventually(lambda: q.stats()["active"] == 1, 30)
        browser.goto(f"{readonly.base}/job/ab-jobs/{held}")
        assert browser.text("#job-state") == "active"
        assert browser.text("#job-worker") == f"{me.host} pid {me.pid}"
        assert browser.text("#job-started").startswith("20")
        assert rows(browser, "#job-attempt-log tbody tr")[0][2] == "running"
        browser.screenshot(shots / "job-active.png")
        browser.click("#job-worker")
        browser.wait_for("location.pathname.endsWith('/workers')")
        browser.wait_for("document.readyState === 'complete'")
        assert browser.js("location.hash") == f"#worker-{me.id}"
        assert browser.js(f"document.getElementById('worker-{me.id}') !== null")
        # the active browse page names the same worker on the job's row
        browser.goto(f"{readonly.base}/queue/ab-jobs?state=active")
        holder = browser.text(f'tr[data-job="{held}"] td.holder')
        assert holder.startswith(f"{me.host} pid {me.pid}")
        assert browser.errors() == []
    finally:
        raw.set(gate, 1)
        worker.stop()
        raw.close()


def test_chart_range_and_live_refresh_in_chromium(
    standalone_server: EmbeddedServer,
    browser: Browser,
    client: EchoMQ,
    readonly: Dashboard,
    shots: Path,
) -> None:
    """A day of minute tallies (as tally.lua writes them) drawn at 24 h after a click on the
    range selector; then jobs completed and failed meanwhile appear in the chart and the totals
    without a reload."""
    fresh(browser)
    raw = redis.Redis.from_url(standalone_server.url)
    minute = int(raw.time()[0]) // 60
    key = client.keys.minutes("ab-chart")
    day = {}
    # the day but its first minutes (the window may move on while the test runs) and this one
    for m in range(minute - DAY + 10, minute):
        hour = (m // 60) % 24
        done = 40 + 30 * (8 <= hour <= 18) + (m * 7) % 13
        failed = (m * 5) % 7 if hour != 14 else 25
        day[str(m % DAY)] = f"{m} {done} {failed} {failed // 5}"
    raw.hset(key, mapping=day)
    total_done = sum(int(v.split()[1]) for v in day.values())
    q = client.queue("ab-chart", max_attempts=1)
    browser.goto(f"{readonly.base}/queue/ab-chart")
    assert browser.js("document.querySelector('#ranges a.on').dataset.range") == "60"
    browser.click('#ranges a[data-range="1440"]')
    browser.wait_for("location.search.includes('minutes=1440')")
    browser.wait_for("document.querySelector('#throughput-chart') !== null")
    assert browser.text("#throughput h2").startswith("Last 24 hours")
    assert browser.js("document.querySelector('#ranges a.on').dataset.range") == "1440"
    assert browser.js("+document.querySelector('#throughput-chart').dataset.per") == 4
    assert browser.js("+document.querySelector('#throughput-chart').dataset.bars") == 360

    def drawn(kind: str) -> int:
        return int(
            browser.js(
                f"[...document.querySelectorAll('#throughput-chart rect.{kind}')]"
                ".reduce((s, r) => s + +r.dataset.n, 0)"
            )
        )

    assert drawn("done") == total_done
    assert browser.text("#t-completed") == f"{total_done:,}"
    browser.screenshot(shots / "queue-24h.png")
    # now, while the page stays open: 5 completed, 2 died
    browser.js("window.emqNoReload = true")
    q.add_bulk([JobSpec(i) for i in range(7)])
    jobs = q.claim(7)
    assert all(q.complete_many([(j, 1) for j in jobs[:5]]))
    assert q.fail_many([(j, "boom", True) for j in jobs[5:]]) == [2, 2]
    browser.wait_for(f"document.querySelector('#t-completed').textContent === '{total_done + 5:,}'")
    eventually(lambda: drawn("done") == total_done + 5, 10, "the chart to be redrawn")
    failed_before = sum(int(v.split()[2]) for v in day.values())
    assert drawn("failed") == failed_before + 2
    assert drawn("deaths") == sum(int(v.split()[3]) for v in day.values()) + 2
    assert browser.js("window.emqNoReload") is True  # the same page: no reload happened
    assert browser.js("location.search.includes('minutes=1440')")
    assert browser.errors() == []
    raw.close()
