"""The dashboard over a sharded queue (echomq_core.dashboard.shards): the queue page lists every
shard's jobs under the logical name, merged in the server's order and paged; a job page is
found by the logical name and the id (its shard from the id); the oldest pending age and the
queues table read every shard. The jobs here avoid shard 0 (the logical name's own queue), so
a read of shard 0 alone would show none of them."""

from __future__ import annotations

import html
import json
import re
from urllib.parse import quote

from echomq_core import EchoMQ, JobSpec
from echomq_core.flows.sharding import shard_of
from echomq_core.seeing.urls import job_page, queue_page
from echomq_core.wire.calls import Call

from ..dashkit import Dashboard


def _ids_off_shard_0(names: tuple[str, ...], n: int) -> list[str]:
    tries = (f"JOB-af/dag/t/{i}" for i in range(100_000))
    return [i for i in tries if shard_of(names, i) != names[0]][:n]


def _rows(page: str) -> list[str]:
    return [html.unescape(r) for r in re.findall(r'<tr data-job="([^"]+)">', page)]


def test_the_queue_page_lists_every_shard_in_server_order(mq: EchoMQ, dashboard: Dashboard) -> None:
    names = mq.set_shards("dq", 3)
    ids = _ids_off_shard_0(names, 70)
    q = mq.queue("dq")
    q.add_bulk([JobSpec({"n": i}, id=j) for i, j in enumerate(ids)])
    later = q.add({"n": "later"}, job_id=ids[0] + "x", delay=3600)
    first = dashboard.get(queue_page("", "dq")).body
    assert "pending (70)" in first and "delayed (1)" in first
    page1 = _rows(first)
    assert len(page1) == 50
    (nxt,) = re.findall(r'href="([^"]*)" id="next-page"', first)
    page2 = _rows(dashboard.get(html.unescape(nxt)).body)
    assert sorted(page1 + page2) == sorted(ids)  # every shard's, each once
    # the server's order over the shards: each row's pending score, read on its shard
    scores = mq.connection.execute(
        [Call.cmd("ZSCORE", mq.keys.pending(shard_of(names, j)), j) for j in page1 + page2]
    )
    assert [float(s) for s in scores] == sorted(float(s) for s in scores)
    api = json.loads(dashboard.get("/api" + queue_page("", "dq") + "?offset=60").body)
    assert api["total"] == 70 and [j["id"] for j in api["jobs"]] == (page1 + page2)[60:]
    delayed = dashboard.get(queue_page("", "dq") + "?state=delayed").body
    assert _rows(delayed) == [later]
    deep = dashboard.get("/api" + queue_page("", "dq") + "?offset=20000")
    assert deep.status == 400 and "find a job further down by its id" in deep.body


def test_a_job_page_is_found_by_the_logical_name(mq: EchoMQ, dashboard: Dashboard) -> None:
    names = mq.set_shards("dj", 3)
    (job_id,) = _ids_off_shard_0(names, 1)
    mq.queue("dj").add({"n": 1}, job_id=job_id)
    page = dashboard.get(job_page("", "dj", job_id))
    assert page.status == 200, page.body[:500]
    found = re.search(r'<code id="job-id">(.*?)</code>', page.body)
    assert found is not None and html.unescape(found.group(1)) == job_id
    api = json.loads(dashboard.get("/api" + job_page("", "dj", job_id)).body)
    assert api["id"] == job_id and api["state"] == "pending"
    assert api["queue"] == shard_of(names, job_id)  # the physical queue, for debugging
    # find by id from the queue page lands on it
    got = dashboard.get(queue_page("", "dj") + f"?find={quote(job_id, safe='')}")
    assert got.status == 303 and got.headers["location"] == job_page("", "dj", job_id)


def test_the_oldest_pending_age_reads_every_shard(mq: EchoMQ, dashboard: Dashboard) -> None:
    names = mq.set_shards("do", 3)
    (job_id,) = _ids_off_shard_0(names, 1)
    mq.queue("do").add({"n": 1}, job_id=job_id)
    got = json.loads(dashboard.get("/api/throughput/do").body)
    assert got["oldest_pending_age"] is not None and got["oldest_pending_age"] >= 0
    queues = json.loads(dashboard.get("/api/queues").body)["queues"]
    assert set(queues) == {"do"}  # one row under the logical name
    assert queues["do"]["oldest_pending_age"] is not None
