#!/usr/bin/env python
"""Make the dashboard's screenshots in docs/dashboard/ (listed in
docs/operations/metrics-dashboard.md) from realistic data: Airflow-derived parent ids that hold
``/``, a queue of 20,000 pending jobs, real workers whose handlers fail with real tracebacks,
a flow capped at 5 running whose queue no worker serves, a worker killed with a job leased
(its lease expired minutes ago), a day of throughput.

Usage (from the repository's root; Debian's chromium, or scripts/fetch-chromium.sh's)::

    PYTHONPATH=. python scripts/dashboard-screenshots.py [DEST]    # default: docs/dashboard

It starts its own Valkey (``echomq_core.server``), its own ``echomq dashboard`` processes (one
read-only, one with actions, signed in) and a headless Chromium at 1400 x 1000 - the helpers of
the browser tests (``tests/browser/cdp.py``, ``tests/dashkit.py``). Two things are set by hand,
and said so on the pages they show: a day of minute tallies is written as the workers' tally
script writes them (a day cannot be waited for), and the killed worker's lease deadline is put
7 minutes back (its expiry cannot be waited for either). airflow.png comes from the Airflow
plugin's test (tests/airflow/test_dashboard_plugin.py), not from here.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echomq_core import Backoff, Child, EchoMQ, Job, JobSpec, Pump, Worker  # noqa: E402
from echomq_core.queues.throughput import DAY  # noqa: E402
from echomq_core.seeing.browse import JobRow, queue_page  # noqa: E402
from echomq_core.server import EmbeddedServer  # noqa: E402
from echomq_core.wire.calls import Op  # noqa: E402
from tests.browser.cdp import Browser  # noqa: E402
from tests.dashkit import TOKEN, Dashboard, env_for  # noqa: E402
from tests.waiting import eventually  # noqa: E402

PREFIX = "shots"
#: Parent ids as the Airflow provider derives them: dag / task / run, then a digest.
AF = "JOB-af/warehouse_etl/{task}/scheduled__2026-12-07T02.00.00+00.00/{digest}"


def af_id(task: str, digest: str) -> str:
    return AF.format(task=task, digest=digest)


def parse_amount(job: Job) -> dict[str, object]:
    row = job.payload
    if "region" in row:  # a sub-flow's parent: runs once its rows are parsed
        return {"region": row["region"], "rows": 4}
    if row["n"] % 97 == 13:
        raise ValueError(f"order {row['order']}: amount {row['amount']!r} is not a number")
    return {"order": row["order"], "cents": round(float(row["amount"]) * 100)}


TRIES: dict[str, int] = {}


def flaky_export(job: Job) -> str:
    TRIES[job.id] = TRIES.get(job.id, 0) + 1
    if TRIES[job.id] < 3:
        raise ConnectionError("s3://warehouse-exports: read timed out after 30 s")
    return "s3://warehouse-exports/2026-12-07/orders.parquet"


def build(mq: EchoMQ, url: str) -> dict[str, str]:
    """The data; the ids of what the pages show."""
    got: dict[str, str] = {}
    raw = redis.Redis.from_url(url)
    # 20,000 orders waiting (priorities 0 and 5), a day of throughput behind them
    orders = mq.queue("warehouse-orders", max_attempts=3)
    orders.add_bulk(
        [
            JobSpec({"order": f"ORD-{i:07d}", "amount": "12.50"}, priority=5 * (i % 7 == 0))
            for i in range(20_000)
        ]
    )
    minute = int(raw.time()[0]) // 60
    day: dict[Any, Any] = {}  # redis-py's mapping type is invariant in its key union
    for m in range(minute - DAY + 1, minute):
        hour = (m // 60) % 24
        done = 900 + 2_400 * (7 <= hour <= 19) + (m * 37) % 211
        failed = (m * 11) % 17 + (160 if hour == 15 else 0)
        day[str(m % DAY)] = f"{m} {done} {failed} {failed // 6}"
    raw.hset(mq.keys.minutes("warehouse-orders"), mapping=day)

    # an Airflow flow of 300 rows parsed by a real worker: 3 rows die (fail-the-parent)
    failed_pid = af_id("parse_orders", "9d2e41c0b7a35f18")
    mq.add_flow(
        "af-parents",
        [
            Child(
                {"n": i, "order": f"ORD-{i:07d}", "amount": "n/a" if i % 97 == 13 else "9.99"},
                queue="af-rows",
                max_attempts=1,
            )
            for i in range(300)
        ],
        parent_id=failed_pid,
        barrier=True,
    )
    # a released one: 200 rows, all parsed (their values are on the flow)
    done_pid = af_id("load_orders", "51be07d3aa9c2e64")
    mq.add_flow(
        "af-parents",
        [
            Child({"n": i, "order": f"ORD-{i:07d}", "amount": "4.20"}, queue="af-rows")
            for i in range(200)
            if i % 97 != 13
        ],
        parent_id=done_pid,
        barrier=True,
    )
    # a nested one: 3 regions, each a sub-flow of 4 rows
    nested_pid = af_id("by_region", "c04a9f7e21d8b3a6")
    mq.add_flow(
        "af-parents",
        [
            Child(
                {"region": r},
                queue="af-rows",
                children=[
                    Child(
                        {"n": 1000 + 10 * k + i, "order": f"ORD-R{k}{i}", "amount": "1"},
                        queue="af-rows",
                    )
                    for i in range(4)
                ],
            )
            for k, r in enumerate(("eu-west", "us-east", "ap-south"))
        ],
        parent_id=nested_pid,
        barrier=True,
    )
    worker = Worker(mq, {"af-rows": parse_amount, "af-export": flaky_export}, concurrency=4).start()
    pump = Pump(mq, ["af-rows", "af-parents", "af-export"]).start()
    # an export that timed out twice, then succeeded (its attempts on its page)
    exports = mq.queue("af-export", max_attempts=4, backoff=Backoff(0, 0))
    got["retried"] = exports.add({"table": "orders"}, job_id=af_id("export", "77e1c5d09ab34f2e"))
    try:
        eventually(lambda: mq.snapshot("af-parents", done_pid).released, 60, "the load flow")
        eventually(
            lambda: (
                mq.snapshot("af-parents", failed_pid).parent_state == "failed"
                and mq.queue("af-rows").stats()["active"] == 0
            ),
            60,
            "the parse flow to fail",
        )
        eventually(lambda: exports.stats()["completed"] == 1, 60, "the export")
    finally:
        worker.stop()
        pump.stop()
    got.update(failed=failed_pid, done=done_pid, nested=nested_pid)
    got["dead"] = mq.child_failures("af-parents", failed_pid)[0].job_id
    got["child"] = f"{done_pid}.7"

    # a flow capped at 5 running whose queue no worker serves
    capped_pid = af_id("geocode_addresses", "e3f9a0b4c6d21785")
    mq.add_flow(
        "af-parents",
        [Child({"n": i}, queue="geocode") for i in range(500)],
        parent_id=capped_pid,
        barrier=True,
        max_running=5,
    )
    got["capped"] = capped_pid

    # a plain job that died, to retry from its page
    plain = mq.queue("billing", max_attempts=1)
    got["plain"] = plain.add(
        {"invoice": "INV-2026-004211"}, job_id="JOB-billing/invoice/INV-2026-004211"
    )
    (job,) = plain.claim(1)
    plain.fail(job, "KeyError: 'customer_id'", retry=False)

    # a killed worker's job: leased, its deadline 7 minutes ago, nothing recovered it yet
    (stale,) = orders.claim(1, lease=60)
    raw.zadd(mq.keys.active("warehouse-orders"), {stale.id: minute * 60_000 - 420_000}, xx=True)
    got["stale"] = stale.id
    raw.close()
    return got


def main() -> None:
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "dashboard").resolve()
    server = EmbeddedServer().start()
    mq = EchoMQ(server.url, prefix=PREFIX)
    env = env_for({**os.environ, "PYTHONPATH": str(ROOT)})
    readonly = Dashboard(server.url, PREFIX, env, poll=2.0)
    actions = Dashboard(server.url, PREFIX, env, poll=2.0, actions=True)
    browser = Browser(width=1400, height=1000)
    release = threading.Event()
    busy = None
    try:
        ids = build(mq, server.url)
        # a live worker with 4 reports running (held until the screenshots are taken)
        reports = mq.queue("reports")
        reports.add_bulk([JobSpec({"report": f"daily-{r}"}) for r in ("eu", "us", "ap", "sa")])
        busy = Worker(mq, {"reports": lambda job: release.wait(600)}, concurrency=4).start()
        eventually(lambda: reports.stats()["active"] == 4, 30, "4 reports running")
        running = [r.id for r in mq.perform(_active(mq, "reports"))]

        def shot(name: str, url: str, ready: str = "true") -> None:
            browser.goto(url)
            browser.wait_for(ready)
            time.sleep(0.2)  # fonts and layout settle; nothing is asserted after it
            browser.screenshot(dest / name)
            print(f"{name}: {(dest / name).stat().st_size:,} bytes")

        ro = readonly.base
        q = _q
        shot("queues.png", f"{ro}/")
        shot("queue.png", f"{ro}/queue/warehouse-orders")
        shot("queue-throughput.png", f"{ro}/queue/warehouse-orders?state=active")
        shot("queue-24h.png", f"{ro}/queue/warehouse-orders?state=active&minutes=1440")
        shot("workers.png", f"{ro}/workers")
        shot("flows.png", f"{ro}/flows")
        shot("flow-failed.png", f"{ro}/flow/af-parents/{q(ids['failed'])}")
        shot("flow-nested.png", f"{ro}/flow/af-parents/{q(ids['nested'])}")
        shot("flow-capped.png", f"{ro}/flow/af-parents/{q(ids['capped'])}")
        shot("children.png", f"{ro}/flow/af-parents/{q(ids['failed'])}/children?show=failed")
        shot("job.png", f"{ro}/job/af-rows/{q(ids['dead'])}")
        shot("job-attempts.png", f"{ro}/job/af-export/{q(ids['retried'])}")
        shot("job-active.png", f"{ro}/job/reports/{q(running[0])}")
        shot("job-child.png", f"{ro}/job/af-rows/{q(ids['child'])}")
        shot("job-expired.png", f"{ro}/job/warehouse-orders/{q(ids['stale'])}")
        browser.goto(f"{actions.base}/login")
        browser.type_into("#token", TOKEN)
        browser.click("#login")
        browser.wait_for("document.querySelector('#mode').textContent.includes('actions on')")
        shot("flow-actions.png", f"{actions.base}/flow/af-parents/{q(ids['failed'])}")
        shot("job-actions.png", f"{actions.base}/job/billing/{q(ids['plain'])}")
    finally:
        release.set()
        if busy is not None:
            busy.stop()
        browser.close()
        readonly.stop()
        actions.stop()
        mq.close()
        server.stop()


def _q(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


def _active(mq: EchoMQ, queue: str) -> Op[list[JobRow]]:
    page = yield from queue_page(mq.keys, queue, "active")
    return page.rows


if __name__ == "__main__":
    main()
