"""The dashboard as a real ``echomq dashboard`` process (uvicorn) against a real server: every
page on real flows, the JSON twins, /metrics, bad input, and the security rules - binds
127.0.0.1, read-only by default, actions only with a token, POSTs refused without the token or
without the CSRF field."""

from __future__ import annotations

import html
import json
import subprocess
from urllib.parse import quote

import psutil
import pytest

from echomq_core import EchoMQ
from echomq_core.dashboard import create_app
from echomq_core.errors import ConfigurationError
from echomq_core.server import EmbeddedServer

from ..conftest import Backend
from ..dashkit import (
    BAD_ROW,
    CLI,
    TOKEN,
    Dashboard,
    Scenario,
    csrf_of,
    env_for,
    failing_flow,
)


def flow_path(queue: str, pid: str) -> str:
    return f"/flow/{quote(queue, safe='')}/{quote(pid, safe='')}"


def test_it_binds_127_0_0_1_by_default(readonly: Dashboard) -> None:
    assert readonly.host == "127.0.0.1"
    listening = [
        c.laddr
        for c in psutil.Process(readonly.proc.pid).net_connections("inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening


def test_every_page_shows_the_real_flows(scenario: Scenario, readonly: Dashboard) -> None:
    s = scenario
    home = readonly.get("/")
    assert home.status == 200
    for queue in ("dk-parents", "dk-kids", "dk-plain"):
        assert f'data-queue="{queue}"' in home.body
    assert 'data-k="queues|dk-kids|poison">1<' in home.body
    assert 'data-k="queues|dk-plain|dead">1<' in home.body
    assert "read-only" in home.body

    flows = readonly.get("/flows?queue=dk-parents")
    assert flows.status == 200
    for ref in (s.held, s.released, s.failed, s.cancelled, s.nested):
        assert f'data-flow="{ref.parent_id}"' in flows.body
    assert f'value="4" data-v="flows|dk-parents|{s.held.parent_id}|settled"' in flows.body
    held_only = readonly.get("/flows?queue=dk-parents&state=held").body
    assert s.held.parent_id in held_only and s.failed.parent_id not in held_only

    held = readonly.get(flow_path("dk-parents", s.held.parent_id))
    assert held.status == 200 and 'id="flow-state" data-k="flow|parent_state">held<' in held.body
    assert 'id="flow-processed">4<' in held.body and 'id="flow-outstanding">6<' in held.body
    assert html.escape('{"square": 0}') in held.body or "square" in held.body

    failed = readonly.get(flow_path("dk-parents", s.failed.parent_id)).body
    assert "RuntimeError: disk full on part 0" in failed and 'id="failed-children"' in failed

    released = readonly.get(flow_path("dk-parents", s.released.parent_id)).body
    assert ">released<" in released and "ValueError: bad row 2" in released
    assert 'id="ignored-children"' in released

    cancelled = readonly.get(flow_path("dk-parents", s.cancelled.parent_id)).body
    assert ">cancelled<" in cancelled and "wrong input file" in cancelled

    nested = readonly.get(flow_path("dk-parents", s.nested.parent_id)).body
    assert nested.count("data-node=") == 2  # the two sub-flows, as a tree
    sub = readonly.get(flow_path("dk-kids", f"{s.nested.parent_id}.0")).body
    assert 'id="root-link"' in sub

    dead = readonly.get("/dead/dk-plain").body
    assert s.dead_job in dead and "KeyError: &#39;customer_id&#39;" in dead
    dead_children = readonly.get("/dead/dk-parents").body
    assert s.failed.parent_id in dead_children  # a dead child links the flow to repair

    poison = readonly.get("/poison/dk-kids").body
    assert "garbage that is no signal" in poison and 'id="poison-total">1<' in poison


def test_json_twins_and_metrics(scenario: Scenario, readonly: Dashboard) -> None:
    held = "/api" + flow_path("dk-parents", scenario.held.parent_id)
    doc = json.loads(readonly.get(held).body)
    assert (doc["flow"]["total"], doc["settled"], doc["outcome"]) == (10, 4, "waiting")
    values = json.loads(readonly.get(held + "/values").body)
    assert sorted(v["square"] for v in values["values"].values()) == [0, 1, 4, 9]
    assert values["cursor"] == 0
    queues = json.loads(readonly.get("/api/queues").body)["queues"]
    assert queues["dk-parents"]["flows"]["cancelled"] == 1
    flows = json.loads(readonly.get("/api/flows?queue=dk-parents&state=failed").body)
    assert list(flows["flows"]["dk-parents"]) == [scenario.failed.parent_id]
    metrics = readonly.get("/metrics")
    assert metrics.status == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert "echomq_up 1.0" in metrics.body
    assert 'echomq_flows{queue="dk-parents",state="failed"} 1.0' in metrics.body
    assert 'echomq_poison_signals{queue="dk-kids"} 1.0' in metrics.body


def test_values_are_paged(client: EchoMQ, readonly: Dashboard) -> None:
    from echomq_core import Child

    ref = client.add_flow("dk-big", [Child(i) for i in range(700)], barrier=True)
    q = client.queue("dk-big")
    q.complete_many([(job, job.payload) for job in q.claim(700)])
    seen: set[str] = set()
    cursor, pages = 0, 0
    while True:
        doc = json.loads(
            readonly.get(f"/api{flow_path('dk-big', ref.parent_id)}/values?cursor={cursor}").body
        )
        seen.update(doc["values"])
        pages += 1
        cursor = doc["cursor"]
        if cursor == 0:
            break
        assert pages < 20
    assert len(seen) == 700 and pages >= 2  # small hashes come whole (listpack)


@pytest.mark.parametrize("size", [10, 10_000])
def test_a_live_poll_costs_one_command_whatever_the_flow(
    size: int, client: EchoMQ, readonly: Dashboard, standalone_server: EmbeddedServer
) -> None:
    """What an open flow page polls every few seconds: the snapshot, one script call (whose
    own O(1) reads INFO commandstats counts too) - the same at 10 and 10,000 children."""
    import redis

    from echomq_core import Child

    ref = client.add_flow("dk-poll", [Child(i, queue="dk-poll-kids") for i in range(size)])
    raw = redis.Redis.from_url(standalone_server.url)
    readonly.get("/api" + flow_path("dk-poll", ref.parent_id))  # the first reads the shards
    raw.config_resetstat()
    doc = json.loads(readonly.get("/api" + flow_path("dk-poll", ref.parent_id)).body)
    stats = raw.info("commandstats")
    raw.close()
    calls = {
        k: int(v["calls"])
        for k, v in stats.items()
        if not k.startswith(("cmdstat_config", "cmdstat_info"))
    }
    assert doc["flow"]["total"] == size
    assert calls.pop("cmdstat_evalsha") == 1, calls
    # inside the script, O(1) reads only: 3 HLEN, GET, HMGET, ZSCORE
    assert calls == {"cmdstat_hlen": 3, "cmdstat_get": 1, "cmdstat_hmget": 1, "cmdstat_zscore": 1}


def test_bad_input_is_a_clear_error(readonly: Dashboard) -> None:
    missing = readonly.get(flow_path("dk-parents", "JOB-nope"))
    assert missing.status == 404 and "JobNotFound" in missing.body
    bad_queue = readonly.get("/flow/bad%7Bq/JOB-x")
    assert bad_queue.status == 400 and "InvalidQueueName" in bad_queue.body
    bad_id = readonly.get(flow_path("dk-parents", "not-a-job"))
    assert bad_id.status == 400 and "InvalidJobId" in bad_id.body
    bad_offset = readonly.get("/flows?offset=-3")
    assert bad_offset.status == 400 and "InvalidArgument" in bad_offset.body
    bad_state = json.loads(readonly.get("/api/flows?state=sleeping").body)
    assert bad_state["type"] == "InvalidArgument"


def test_every_response_carries_the_security_headers(readonly: Dashboard) -> None:
    for path in ("/", "/flows", "/metrics", "/static/dashboard.js"):
        headers = readonly.get(path).headers
        assert "frame-ancestors 'self'" in headers["content-security-policy"], path
        assert headers["x-content-type-options"] == "nosniff"


def test_read_only_refuses_every_post(
    scenario: Scenario, readonly: Dashboard, client: EchoMQ
) -> None:
    pid = scenario.held.parent_id
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for path in (
        f"{flow_path('dk-parents', pid)}/cancel",
        f"{flow_path('dk-parents', pid)}/retry",
        "/poison/dk-kids/replay",
        "/dead/dk-plain/retry",
    ):
        refused = readonly.post(path, headers=bearer)
        assert refused.status == 403 and "read-only" in refused.body
    assert readonly.post("/login", {"token": TOKEN}).status == 403
    assert "cancel-form" not in readonly.get(flow_path("dk-parents", pid)).body
    assert client.snapshot("dk-parents", pid).parent_state == "held"
    assert client.queue("dk-kids").stats()["poison"] == 1


def test_actions_without_a_token_do_not_start(
    client: EchoMQ, standalone_server: EmbeddedServer, prefix: str, proc_env: dict[str, str]
) -> None:
    with pytest.raises(ConfigurationError, match="need a token"):
        create_app(client, actions=True)
    with pytest.raises(ConfigurationError, match="at least 16"):
        create_app(client, actions=True, token="short")
    done = subprocess.run(
        [*CLI, "dashboard", "--actions", "--url", standalone_server.url, "--prefix", prefix],
        env=env_for(proc_env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--actions needs a token" in done.stderr


def test_posts_need_the_token_and_the_csrf_field(
    scenario: Scenario, actions: Dashboard, client: EchoMQ
) -> None:
    pid = scenario.held.parent_id
    cancel = f"{flow_path('dk-parents', pid)}/cancel"
    # nothing, a wrong bearer token, a wrong login
    assert actions.post(cancel, {"reason": "x"}).status == 403
    assert (
        actions.post(cancel, headers={"Authorization": "Bearer wrong-token-wrong-token"}).status
        == 403
    )
    assert actions.post("/login", {"token": "wrong-token-wrong-token"}).status == 403
    # signed in, but without the CSRF field, with a wrong one, or from another site
    login = actions.post("/login", {"token": TOKEN})
    assert login.status == 303
    (cookie,) = login.cookies
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    session = {"Cookie": cookie.split(";")[0]}
    page = actions.get(flow_path("dk-parents", pid), headers=session).body
    token = csrf_of(page)
    assert actions.post(cancel, {"reason": "x"}, headers=session).status == 403
    assert actions.post(cancel, {"reason": "x", "csrf": "0" * 64}, headers=session).status == 403
    evil = {**session, "Origin": "http://evil.example"}
    assert actions.post(cancel, {"reason": "x", "csrf": token}, headers=evil).status == 403
    assert client.snapshot("dk-parents", pid).parent_state == "held"  # nothing changed
    # the form as the page sent it: accepted, redirected back with a notice
    same = {**session, "Origin": f"http://{actions.host}:{actions.port}"}
    done = actions.post(cancel, {"reason": "stop it", "csrf": token}, headers=same)
    assert done.status == 303 and done.headers["location"].startswith(flow_path("dk-parents", pid))
    snap = client.snapshot("dk-parents", pid)
    assert (snap.parent_state, snap.error) == ("cancelled", "stop it")


def test_bearer_token_repairs_closes_and_replays(
    scenario: Scenario, actions: Dashboard, client: EchoMQ
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    failed = scenario.failed.parent_id
    repaired = actions.post(f"{flow_path('dk-parents', failed)}/retry", headers=bearer)
    assert repaired.status == 200 and json.loads(repaired.body)["requeued"] == 1
    assert client.snapshot("dk-parents", failed).parent_state == "held"
    closed = actions.post(
        f"{flow_path('dk-parents', scenario.released.parent_id)}/close", headers=bearer
    )
    assert json.loads(closed.body)["state"] == "closed"
    replayed = actions.post("/poison/dk-kids/replay", headers=bearer)
    assert json.loads(replayed.body)["replayed"] == 1
    assert client.queue("dk-kids").stats()["poison"] == 0
    # a dead plain job is retried on its own; a bad id is a 400 naming the error class
    dead = scenario.dead_job
    assert 'class="retry-job"' not in actions.get("/dead/dk-plain").body  # not signed in
    revived = actions.post("/dead/dk-plain/retry", {"job_id": dead}, headers=bearer)
    assert revived.status == 200 and json.loads(revived.body)["revived"] == 1
    assert client.queue("dk-plain").get_job(dead).state == "pending"
    again = actions.post("/dead/dk-plain/retry", {"job_id": dead}, headers=bearer)
    assert json.loads(again.body) == {"revived": 0, "left": [dead], "done": f"{dead} left as it is"}
    bad = actions.post("/dead/dk-plain/retry", {"job_id": "not-an-id"}, headers=bearer)
    assert bad.status == 400 and "InvalidJobId" in bad.body


@pytest.mark.onlycluster
def test_pages_on_a_cluster(
    backend: Backend, mq: EchoMQ, prefix: str, proc_env: dict[str, str]
) -> None:
    """The same reads on a 3-master Cluster: a nested flow whose queues live on three nodes."""
    from echomq_core import Child

    top, mid, leaf = backend.queues_on_distinct_nodes(3, stem="dkc")
    ref = mq.add_flow(
        top,
        [
            Child({"p": p}, queue=mid, children=[Child(i, queue=leaf) for i in range(4)])
            for p in range(2)
        ],
        barrier=True,
    )
    leaves = mq.queue(leaf)
    leaves.complete_many([(job, job.payload) for job in leaves.claim(3)])
    url = backend.url.replace("redis://", "redis+cluster://", 1)  # what the CLI takes
    d = Dashboard(url, prefix, env_for(proc_env))
    try:
        page = d.get(flow_path(top, ref.parent_id)).body
        assert page.count("data-node=") == 2 and ">held<" in page
        home = d.get("/").body
        assert all(f'data-queue="{q}"' in home for q in (top, mid, leaf))
        metrics = d.get("/metrics").body
        assert f'echomq_queue_jobs{{queue="{leaf}",state="completed"}} 3.0' in metrics
        assert f'echomq_flows{{queue="{top}",state="held"}} 1.0' in metrics
    finally:
        d.stop()


def test_failed_and_dead_children_show_their_tracebacks_escaped(
    client: EchoMQ, readonly: Dashboard
) -> None:
    """The flow's failed and ignored children and the dead-jobs list each carry the last
    attempt's traceback (the worker's), collapsed in a <details>, its markup shown as text."""
    ref = failing_flow(client)
    bad, ignored = client.child_failures(ref.queue, ref.parent_id)
    assert bad.traceback is not None and ignored.traceback is not None
    page = readonly.get(flow_path(ref.queue, ref.parent_id)).body
    assert BAD_ROW not in page  # never as markup
    for table, child in (("failed-children", bad), ("ignored-children", ignored)):
        section = page.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0]
        row = section.split(f'data-child="{html.escape(child.job_id)}"', 1)[1].split("</tr>")[0]
        assert '<details class="traceback"><summary>traceback</summary><pre>' in row
        assert child.traceback in html.unescape(row)
        assert "in _to_int" in row and "in parse_row" in row
    assert bad.error in html.unescape(page) and "ValueError: invalid literal" in bad.error
    dead = readonly.get("/dead/tb-kids").body
    assert BAD_ROW not in dead
    assert dead.count('<details class="traceback">') == 2
    assert bad.traceback in html.unescape(dead) and ignored.traceback in html.unescape(dead)


def test_a_flow_page_shows_its_cap_and_threshold(client: EchoMQ, readonly: Dashboard) -> None:
    """max_running and min_success on the flow's page and in its live JSON: the running
    count read from the child queue's gate, the failures so far against the allowance."""
    from echomq_core import Child

    ref = client.add_flow(
        "dk-ctl",
        [Child(i, max_attempts=1) for i in range(10)],
        max_running=3,
        min_success=8,
        barrier=True,
    )
    q = client.queue("dk-ctl")
    (job,) = q.claim(1)
    q.fail(job, "bad input", retry=False)  # tolerated: 1 of 2 allowed; its token goes to the next
    doc = json.loads(readonly.get("/api" + flow_path("dk-ctl", ref.parent_id)).body)
    assert doc["flow"]["cap"] == 3 and doc["flow"]["allowed"] == 2
    # 3 hold a token, pending: no worker serves dk-ctl, so none runs (issue 48)
    running = (
        "3 / 3 admitted, none running: 'dk-ctl' has 3 pending job(s) and none running: "
        "does a worker serve it?; 6 waiting for a token"
    )
    assert doc["controls"] == {"running": running, "threshold": "1 failed / 2 allowed"}
    page = readonly.get(flow_path("dk-ctl", ref.parent_id)).body
    assert running in html.unescape(page)
    assert "1 failed / 2 allowed" in page
