"""The dashboard's job, queue and children pages on a real ``echomq dashboard`` process: what
each shows, the links to them from every other page, find-by-id, the job page's retry and
cancel behind the token and the CSRF field, the queues page's highlights, and the read cost
of a 200,000-child flow's children page counted by the server (INFO commandstats)."""

from __future__ import annotations

import html
import json
import re
import statistics
import time
from collections.abc import Callable
from urllib.parse import quote

import pytest
import redis

from echomq_core import Child, EchoMQ, JobSpec
from echomq_core.seeing.urls import JOB_PATH, flow_page, job_page, queue_page
from echomq_core.server import EmbeddedServer

from ..dashkit import (
    BAD_ROW,
    TOKEN,
    Dashboard,
    Scenario,
    csrf_of,
    failing_flow,
)

BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def readonly(open_dashboard: Callable[..., Dashboard]) -> Dashboard:
    """The read-only dashboard, flagging a queue whose oldest pending job waited over 60 s."""
    return open_dashboard(extra=("--pending-alert", "60"))


def hrefs(page: str, under: str) -> list[str]:
    found = re.findall(r'(?:href|action)="([^"]*)"', page)
    return [html.unescape(h) for h in found if html.unescape(h).startswith(under)]


def job_heading(page: str) -> str:
    found = re.search(r'<code id="job-id">(.*?)</code>', page)
    assert found, page[:1500]
    return html.unescape(found.group(1))


def test_a_dead_childs_job_page_and_every_link_to_it(client: EchoMQ, readonly: Dashboard) -> None:
    ref = failing_flow(client)  # parent id JOB-af/etl/parse/0f3c: it holds '/'
    bad, ignored = client.child_failures(ref.queue, ref.parent_id)
    page = readonly.get(job_page("", bad.queue, bad.job_id))
    assert page.status == 200 and job_heading(page.body) == bad.job_id
    body = page.body
    assert 'id="job-state">dead<' in body and 'id="job-attempts">1 of 1<' in body
    # the payload, error and traceback hold markup: shown as text, never as a tag
    assert "&lt;script&gt;alert(" in body and "<script>alert" not in body
    assert "in _to_int" in body and 'id="job-traceback"' in body
    (parent,) = re.findall(r'href="([^"]*)" id="job-parent"', body)
    assert html.unescape(parent) == flow_page("", ref.queue, ref.parent_id)
    assert readonly.get(html.unescape(parent)).status == 200
    doc = json.loads(readonly.get("/api" + job_page("", bad.queue, bad.job_id)).body)
    assert (doc["state"], doc["payload"], doc["root"]) == (
        "dead",
        {"row": BAD_ROW},
        [ref.queue, ref.parent_id],
    )
    assert doc["created_ms"] and doc["finished_ms"] and "_to_int" in doc["traceback"]
    # the flow page's failed and ignored tables and the dead page link to both job pages
    flow = readonly.get(flow_page("", ref.queue, ref.parent_id)).body
    for child in (bad, ignored):
        assert job_page("", child.queue, child.job_id) in hrefs(flow, JOB_PATH)
    dead = readonly.get(f"/dead/{quote(bad.queue, safe='')}").body
    assert job_page("", bad.queue, bad.job_id) in hrefs(dead, JOB_PATH)
    # the parent's own job page: its children, linked to the children page
    top = readonly.get(job_page("", ref.queue, ref.parent_id)).body
    assert job_heading(top) == ref.parent_id and 'id="job-children"' in top
    assert flow_page("", ref.queue, ref.parent_id, "children") in hrefs(top, "/flow/")
    missing = readonly.get(job_page("", "tb-kids", "JOB-af/not/there"))
    assert missing.status == 404 and "no job JOB-af/not/there" in missing.body
    assert readonly.get("/job/tb-kids/not-an-id").status == 400


def test_a_queue_by_state_in_server_order_and_find_by_id(
    client: EchoMQ, readonly: Dashboard
) -> None:
    q = client.queue("bq-plain")
    ids = q.add_bulk([JobSpec({"n": i}) for i in range(75)])
    urgent = q.add({"n": "urgent"}, priority=0)  # behind the 75: same priority, later arrival
    later = q.add({"n": "later"}, delay=3600)
    first = readonly.get(queue_page("", "bq-plain")).body
    rows = re.findall(r'<tr data-job="([^"]+)">', first)
    assert rows == ids[:50]  # claim order, page 1
    assert "pending (76)" in first and "delayed (1)" in first and 'id="throughput"' in first
    (nxt,) = re.findall(r'href="([^"]*)" id="next-page"', first)
    second = readonly.get(html.unescape(nxt)).body
    assert re.findall(r'<tr data-job="([^"]+)">', second) == [*ids[50:], urgent]
    delayed = readonly.get(queue_page("", "bq-plain") + "?state=delayed").body
    assert re.findall(r'<tr data-job="([^"]+)">', delayed) == [later]
    found = readonly.get(queue_page("", "bq-plain") + f"?find={quote(later, safe='')}")
    assert found.status == 303 and found.headers["location"] == job_page("", "bq-plain", later)
    api = json.loads(readonly.get("/api" + queue_page("", "bq-plain") + "?offset=70").body)
    assert api["total"] == 76 and [j["id"] for j in api["jobs"]] == [*ids[70:], urgent]
    bad = readonly.get(queue_page("", "bq-plain") + "?state=sleeping")
    assert bad.status == 400 and "InvalidArgument" in bad.body


def test_a_queue_with_groups_shows_them_taking_turns(client: EchoMQ, readonly: Dashboard) -> None:
    q = client.queue("bq-groups")
    big = q.add_bulk([JobSpec({"n": i}, group="big") for i in range(30)])
    small = q.add_bulk([JobSpec({"n": i}, group="small/eu") for i in range(2)])
    page = readonly.get(queue_page("", "bq-groups")).body
    assert 'id="groups"' in page and '<span id="groups-waiting">2</span>' in page
    busiest = re.findall(r'<tr data-group="([^"]+)"><td>[^<]*</td><td>([^<]*)</td>', page)
    assert busiest == [("big", "30"), ("small/eu", "2")]
    rows = re.findall(r'<tr data-job="([^"]+)">', page)  # pending in claim order: by turns
    assert set(rows[:4]) == {*big[:2], *small} and rows[4:] == big[2:]
    shown = re.findall(r'<td class="group">([^<]*)</td>', page)  # each row names its group
    assert shown == ["small/eu" if r in small else "big" for r in rows]
    plain = client.queue("bq-no-groups")
    plain.add(1)
    assert 'id="groups"' not in readonly.get(queue_page("", "bq-no-groups")).body


def test_retry_and_cancel_from_the_job_page_need_the_token(
    scenario: Scenario, actions: Dashboard, client: EchoMQ
) -> None:
    dead = scenario.dead_job
    q = client.queue("dk-plain")
    waiting = q.add({"wait": 1}, delay=3600)
    retry, cancel = (
        job_page("", "dk-plain", dead, "retry"),
        job_page("", "dk-plain", waiting, "cancel"),
    )
    # no token, a wrong one, a session without the CSRF field: refused, nothing changed
    assert actions.post(retry).status == 403
    assert (
        actions.post(retry, headers={"Authorization": "Bearer wrong-token-wrong-tok"}).status == 403
    )
    login = actions.post("/login", {"token": TOKEN})
    session = {"Cookie": login.cookies[0].split(";")[0]}
    assert actions.post(retry, {}, session).status == 403
    assert q.get_job(dead).state == "dead"
    # the page's own form, signed in: retried, redirected back to the job page
    page = actions.get(job_page("", "dk-plain", dead), session).body
    assert retry in hrefs(page, JOB_PATH)
    done = actions.post(retry, {"csrf": csrf_of(page)}, session)
    assert done.status == 303 and done.headers["location"].startswith(
        job_page("", "dk-plain", dead)
    )
    assert q.get_job(dead).state == "pending"
    # cancel by bearer token: the delayed job goes to the morgue with the reason
    gone = actions.post(cancel, {"reason": "not needed"}, BEARER)
    assert gone.status == 200 and json.loads(gone.body)["cancelled"] == 1
    info = q.get_job(waiting)
    assert (info.state, info.error) == ("dead", "cancelled: not needed")
    again = json.loads(actions.post(cancel, {}, BEARER).body)
    assert again["cancelled"] == 0 and "left as it is" in again["done"]
    # a flow's dead child is repaired with its flow: its page offers that, not a retry
    failed = scenario.failed.parent_id
    child = actions.get(job_page("", "dk-parents", f"{failed}.0"), session).body
    assert 'id="repair-form"' in child and 'id="retry-form"' not in child


def test_the_queues_page_highlights_what_needs_a_look(
    scenario: Scenario, readonly: Dashboard, client: EchoMQ, standalone_server: EmbeddedServer
) -> None:
    quiet = client.queue("dk-quiet")
    quiet.add(1)
    old = client.queue("dk-old")
    stale = old.add(1)
    # an hour-old pending job: its row's created (run's fifth word, lua/includes/run.lua) as
    # the server would have stamped it then
    raw = redis.Redis.from_url(standalone_server.url)
    row = client.keys.job("dk-old", stale)
    words = (raw.hget(row, "run") or b"").split(b" ")
    words[4] = str(int(words[4]) - 3_600_000).encode()
    raw.hset(row, "run", b" ".join(words))
    raw.close()
    home = readonly.get("/").body

    def row(queue: str) -> str:
        return home.split(f'data-queue="{queue}"', 1)[1].split("</tr>", 1)[0]

    alerts = {
        q: re.findall(r'data-alert="(\w+)"', row(q))
        for q in ("dk-plain", "dk-kids", "dk-parents", "dk-old", "dk-quiet")
    }
    assert alerts == {
        "dk-plain": ["dead"],
        "dk-kids": ["poison"],
        "dk-parents": ["dead", "failed"],
        "dk-old": ["stale"],
        "dk-quiet": [],
    }
    assert 'class="alarm"' in home.split('data-queue="dk-old"', 1)[1][:30]
    api = json.loads(readonly.get("/api/queues").body)
    assert api["queues"]["dk-old"]["oldest_pending_age"] >= 3600
    assert api["queues"]["dk-quiet"]["oldest_pending_age"] < 60
    assert api["queues"]["dk-plain"]["oldest_pending_age"] is None


def test_a_flows_children_page_with_filters_find_and_search(
    client: EchoMQ, readonly: Dashboard
) -> None:
    pid = "JOB-af/etl/split/abc"
    ref = client.add_flow(
        "bc-q", [Child(i, max_attempts=1) for i in range(60)], parent_id=pid, barrier=True
    )
    q = client.queue("bc-q")
    jobs = sorted(q.claim(60), key=lambda j: j.payload)
    q.complete_many([(j, j.payload * 2) for j in jobs[:12]])
    q.fail(jobs[12], "KeyError: 'customer_id'", retry=False)
    q.fail(jobs[40], "TimeoutError: slow disk", retry=False)
    q.release(jobs[13:40] + jobs[41:])
    base = flow_page("", ref.queue, pid, "children")
    page = readonly.get(base).body
    ids = re.findall(r'<tr data-child="([^"]+)"', page)
    assert ids == [f"{pid}.{i}" for i in range(50)]  # .9 before .10: spec order
    assert hrefs(page, JOB_PATH)[12] == job_page("", "bc-q", f"{pid}.12")
    assert job_heading(readonly.get(hrefs(page, JOB_PATH)[12]).body) == f"{pid}.12"
    failed = readonly.get(base + "?show=failed").body
    assert re.findall(r'<tr data-child="([^"]+)"', failed) == [f"{pid}.12", f"{pid}.40"]
    pending = readonly.get(base + "?show=pending").body
    assert len(re.findall(r"<tr data-child=", pending)) == 46
    found = readonly.get(base + f"?find={quote(pid + '.55', safe='')}").body
    assert f'data-child="{pid}.55" class="found"' in found
    hit = readonly.get(base + "?q=slow+DISK").body
    assert re.findall(r'<tr data-child="([^"]+)"', hit) == [f"{pid}.40"]
    api = json.loads(readonly.get("/api" + base + "?show=completed").body)
    assert [c["value"] for c in api["children"]] == [i * 2 for i in range(12)]
    # every child id on the flow page's values table opens the children page at that child
    flow = readonly.get(flow_page("", ref.queue, pid)).body
    link = next(h for h in hrefs(flow, "/flow/") if "find=" in h)
    assert 'class="found"' in readonly.get(link).body


def test_the_children_page_of_200000_children_reads_one_page(
    client: EchoMQ, readonly: Dashboard, standalone_server: EmbeddedServer
) -> None:
    """Counted by the server (INFO commandstats): a page of a 200,000-child flow costs the same
    commands as a page of a small one, each filter's read is bounded, and no command reads
    the whole flow. Prints the page's median load time over 10 GETs."""
    n = 200_000
    ref = client.add_flow("bc-big", [Child(i) for i in range(n)], barrier=True)
    q = client.queue("bc-big")
    jobs = q.claim(100)
    q.complete_many([(j, j.payload) for j in jobs[:60]])
    for j in jobs[60:63]:
        q.fail(j, f"ValueError: row {j.payload}", retry=False)
    q.release(jobs[63:])
    raw = redis.Redis.from_url(standalone_server.url)
    base = flow_page("", ref.queue, ref.parent_id, "children")

    def counted(path: str) -> dict[str, int]:
        raw.config_resetstat()
        got = readonly.get(path)
        assert got.status == 200, got.body[-400:]
        stats = raw.info("commandstats")
        return {
            k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in stats.items()
            if not k.startswith(("cmdstat_config", "cmdstat_info"))
        }

    # a page far into the flow: ids computed from N, one HMGET per row
    deep = counted(base + "?offset=150000")
    assert deep.pop("hmget") == 1 + 3 + 50  # the row's N, the three records, 50 rows
    assert deep == {"hlen": 4, "hscan": 1, "zmscore": 3}, deep
    # find-by-id: a derived id is a page of the same cost
    find = counted(base + f"?find={quote(ref.parent_id + '.199999', safe='')}")
    assert find.pop("hmget") == 1 + 3 + 50 and find.pop("hget") == 1
    # failed (3 records): the names only, sorted; a walk (pending) looks at at most BUDGET
    assert counted(base + "?show=failed").get("hkeys") == 1
    walk = counted(base + "?show=pending")
    assert walk.pop("evalsha") == 1 and walk.get("hexists", 0) <= 3 * 20_000
    # search: bounded HSCANs of the two death records
    search = counted(base + "?q=row")
    assert search["hscan"] <= 1 + 2 * 20 and "hgetall" not in search and "hkeys" not in search
    raw.close()
    took = []
    for _ in range(10):
        started = time.perf_counter()
        assert readonly.get(base + "?offset=100000").status == 200
        took.append(time.perf_counter() - started)
    print(f"children page of {n:,} children: median {statistics.median(took) * 1000:.1f} ms")
