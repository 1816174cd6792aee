"""Every flow the id grammar allows has a page: names holding ``/ @ + = ~ #`` (Airflow's
derived parent ids always hold ``/``; queue names may too), on a real ``echomq dashboard``
process (uvicorn), through every link the dashboard renders and the adapters build.

The path's own rule (quote each name whole, split at the literal slashes; a decoded path at
the id's ``JOB-``) is checked for every name the grammar allows with hypothesis.
"""

from __future__ import annotations

import html
import json
import re
from urllib.parse import quote, unquote, urlsplit

import pytest
from echomq_provider.flow_specs import keyed_child_id, parent_id_for
from hypothesis import given
from hypothesis import strategies as st

from echomq_core import Child, EchoMQ, FlowRef
from echomq_core.seeing.urls import FLOW_PATH, JOB_PATH, flow_page, job_page, split_flow_path
from echomq_core.server import EmbeddedServer
from echomq_core.wire.keyspace import FLOW_INDEXES, JOB_ID_RE, QUEUE_NAME_RE

from ..dashkit import TOKEN, Dashboard

AIRFLOW_ID = parent_id_for("echomq_fan_out", "manual__2026-01-01T00:00:00+00:00", "fan_out")
MAPPED_ID = parent_id_for("etl.daily", "scheduled__2026-01-02T00:00:00+00:00", "split", 7)
#: (queue, parent id): the provider's ids, a keyed child's (``~xx`` escapes, ``#``, ``=``...),
#: ids that end like a path's tails, every character the grammar allows, and queue names
#: holding ``/ @ +`` - one of them with a segment that looks like an id.
FLOWS = [
    ("af-parents", AIRFLOW_ID),
    ("af-parents", MAPPED_ID),
    ("af-kids", keyed_child_id(AIRFLOW_ID, "row #1 = a+b@c/d~e")),
    ("dp-q", "JOB-a/values"),
    ("dp-q", "JOB-b/cancel"),
    ("dp-q", "JOB-x/@+=~#._-y"),
    ("team/etl@v2+x", "JOB-af/dag/task/abc123"),
    ("team/JOB-lookalike", "JOB-af/dag/task/def456"),
]
KIDS = "dp-kids"


@pytest.fixture
def flows(client: EchoMQ) -> list[FlowRef]:
    """Each of :data:`FLOWS` held: a sub-flow (its page linked from the tree) and a leaf."""
    return [
        client.add_flow(
            queue,
            [Child(queue=KIDS, children=[Child(0, queue=KIDS)]), Child(1, queue=KIDS)],
            parent_id=pid,
            barrier=True,
        )
        for queue, pid in FLOWS
    ]


def links(page: str, under: str) -> list[str]:
    """The hrefs (and form actions) of ``page`` that start with ``under``, unescaped."""
    found = re.findall(r'(?:href|action)="([^"]*)"', page)
    return [html.unescape(h) for h in found if html.unescape(h).startswith(under)]


def flow_links(page: str) -> list[str]:
    """The links of ``page`` to flow pages (not to a flow's children page)."""
    return [h for h in links(page, FLOW_PATH) if not urlsplit(h).path.endswith("/children")]


def job_id_of(page: str) -> str:
    found = re.search(r'<code id="job-id">(.*?)</code>', page)
    assert found, page[:2000]
    return html.unescape(found.group(1))


def heading(page: str) -> str:
    found = re.search(r"<h1>Flow <code>(.*?)</code> <span class=\"tag\">(.*?)</span>", page)
    assert found, page[:2000]
    return html.unescape(found.group(2)) + " " + html.unescape(found.group(1))


def opens(d: Dashboard, path: str, queue: str, pid: str) -> str:
    """GET ``path``: the page of flow ``pid`` in ``queue``, or the test fails."""
    got = d.get(path)
    assert got.status == 200, (path, got.status, got.body[-500:])
    assert heading(got.body) == f"{queue} {pid}", path
    return got.body


def test_every_flow_page_opens_whatever_its_names_hold(
    flows: list[FlowRef], readonly: Dashboard
) -> None:
    d = readonly
    for ref in flows:
        queue, pid = ref.queue, ref.parent_id
        page = opens(d, flow_page("", queue, pid), queue, pid)
        # its JSON twin (what the page polls) and the values, from the page's own data-live
        (live,) = re.findall(r'data-live="([^"]*)"', page)
        status = json.loads(d.get(html.unescape(live)).body)
        assert (status["flow"]["total"], status["outcome"]) == (2, "waiting")
        values = d.get(html.unescape(live) + "/values")
        assert values.status == 200 and json.loads(values.body) == {"values": {}, "cursor": 0}
        # every flow link the page renders: the sub-flow in the tree, and back to the root
        (sub,) = flow_links(page)
        sub_page = opens(d, sub, KIDS, f"{pid}.0")
        (root,) = flow_links(sub_page)
        opens(d, root, queue, pid)
        # its children page, and each child's job page from there
        kids = [h for h in links(page, FLOW_PATH) if urlsplit(h).path.endswith("/children")]
        assert kids and all(urlsplit(h).path == flow_page("", queue, pid, "children") for h in kids)
        listed = d.get(kids[0])
        assert listed.status == 200, listed.body[-500:]
        jobs = links(listed.body, JOB_PATH)
        assert jobs == [job_page("", KIDS, f"{pid}.0"), job_page("", KIDS, f"{pid}.1")]
        for href, child in zip(jobs, (f"{pid}.0", f"{pid}.1"), strict=True):
            job = d.get(href)
            assert job.status == 200 and job_id_of(job.body) == child, href
            # and back up: its parent link opens the flow's page
            (up,) = re.findall(r'href="([^"]*)" id="job-parent"', job.body)
            opens(d, html.unescape(up), queue, pid)
        # the parent's own job page, quoted and with its slashes decoded; its JSON twin
        assert job_id_of(d.get(job_page("", queue, pid)).body) == pid
        api = json.loads(d.get("/api" + job_page("", queue, pid)).body)
        assert (api["queue"], api["id"], api["flow"]["total"]) == (queue, pid, 2)
        if "JOB-" not in queue:
            plain = JOB_PATH + quote(queue, safe="/") + "/" + quote(pid, safe="/")
            assert job_id_of(d.get(plain).body) == pid
        # the same path with its slashes decoded (a proxy that normalises, a person typing;
        # '#' still quoted, as any URL needs): the id starts at its JOB-
        if "JOB-" not in queue:
            plain = FLOW_PATH + quote(queue, safe="/") + "/" + quote(pid, safe="/")
            opens(d, plain, queue, pid)
    # the /flows page links every one of them to its page
    listed = flow_links(d.get("/flows").body)
    assert len(listed) == len(flows)
    assert sorted(unquote(h) for h in listed) == sorted(
        unquote(flow_page("", r.queue, r.parent_id)) for r in flows
    )
    for href in listed:
        assert d.get(href).status == 200, href


def test_dead_and_poison_pages_of_queues_holding_a_slash(
    client: EchoMQ, readonly: Dashboard
) -> None:
    queue = "team/etl@v2+x"
    ref = client.add_flow(
        queue, [Child(0, queue=queue, max_attempts=1)], parent_id=AIRFLOW_ID, barrier=True
    )
    q = client.queue(queue)
    (job,) = q.claim(1)
    q.fail(job, "ValueError: row 7", retry=False)
    dead = readonly.get(f"/dead/{quote(queue, safe='')}")
    assert dead.status == 200 and f"Dead jobs of {queue}" in html.unescape(dead.body)
    (repair,) = [h for h in links(dead.body, FLOW_PATH) if not h.endswith("/retry")]
    (job,) = links(dead.body, JOB_PATH)
    assert job_id_of(readonly.get(job).body) == f"{AIRFLOW_ID}.0"
    opens(readonly, repair, queue, ref.parent_id)
    poison = readonly.get(f"/poison/{quote(queue, safe='')}")
    assert poison.status == 200 and f"signals of {queue}" in html.unescape(poison.body)
    # every link of the queue's row on the overview opens a page about that queue
    home = readonly.get("/").body
    row = home.split(f'data-queue="{html.escape(queue)}"', 1)[1].split("</tr>", 1)[0]
    hrefs = links(row, "/")
    # the queue page, flows, pending / active / delayed / completed, dead, poison, each state
    assert len(hrefs) == 8 + len(FLOW_INDEXES), hrefs
    for href in hrefs:
        got = readonly.get(href)
        assert got.status == 200 and queue in html.unescape(got.body), href


def test_actions_on_a_flow_whose_id_holds_a_slash(
    flows: list[FlowRef], actions: Dashboard, client: EchoMQ
) -> None:
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    queue, pid = "team/etl@v2+x", "JOB-af/dag/task/abc123"
    cancelled = actions.post(flow_page("", queue, pid, "cancel"), {"reason": "r"}, bearer)
    assert cancelled.status == 200, cancelled.body
    assert json.loads(cancelled.body)["state"] == "cancelled"
    assert client.snapshot(queue, pid).parent_state == "cancelled"
    # an id ending in /cancel: its page's own form cancels that flow, not "JOB-b"
    signed = actions.post("/login", {"token": TOKEN})
    session = {"Cookie": signed.cookies[0].split(";")[0]}
    page = actions.get(flow_page("", "dp-q", "JOB-b/cancel"), session).body
    (form,) = [h for h in links(page, FLOW_PATH) if h.endswith("/cancel")]
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf is not None
    done = actions.post(form, {"reason": "x", "csrf": csrf.group(1)}, session)
    assert done.status == 303
    back = urlsplit(done.headers["location"])
    assert back.path == flow_page("", "dp-q", "JOB-b/cancel") and "done=" in back.query
    assert client.snapshot("dp-q", "JOB-b/cancel").parent_state == "cancelled"
    assert opens(actions, back.path + "?" + back.query, "dp-q", "JOB-b/cancel")
    repaired = actions.post(flow_page("", queue, pid, "retry"), headers=bearer)
    assert json.loads(repaired.body)["state"] == "held"


def test_dagsters_flow_page_opens(
    flows: list[FlowRef], readonly: Dashboard, standalone_server: EmbeddedServer, prefix: str
) -> None:
    """The link Dagster's metadata carries (``EchoMQResource.flow_page``)."""
    from dagster_echomq import EchoMQResource

    resource = EchoMQResource(url=standalone_server.url, prefix=prefix, dashboard_url=readonly.base)
    for ref in flows:
        url = resource.flow_page(ref.queue, ref.parent_id)
        assert url is not None and url.startswith(readonly.base + FLOW_PATH)
        opens(readonly, url[len(readonly.base) :], ref.queue, ref.parent_id)


def test_a_missing_or_malformed_flow_path_is_a_clear_error(readonly: Dashboard) -> None:
    missing = readonly.get(flow_page("", "dp-q", "JOB-af/none/here"))
    assert missing.status == 404 and "no flow JOB-af/none/here in queue" in missing.body
    not_an_id = readonly.get("/flow/dp-q/af/dag")
    assert not_an_id.status == 400 and "InvalidJobId" in not_an_id.body
    bad_queue = readonly.get("/api/flow/bad%7Bq/JOB-x")
    assert bad_queue.status == 400 and json.loads(bad_queue.body)["type"] == "InvalidQueueName"


TAILS = ("cancel", "retry", "close", "values")


@given(
    queue=st.from_regex(QUEUE_NAME_RE, fullmatch=True),
    pid=st.from_regex(JOB_ID_RE, fullmatch=True),
    tail=st.sampled_from(("", *TAILS)),
)
def test_the_path_splits_back_into_its_names(queue: str, pid: str, tail: str) -> None:
    rest = flow_page("", queue, pid, tail)[len(FLOW_PATH) :]
    assert "#" not in rest and "?" not in rest
    assert split_flow_path(rest, TAILS) == (queue, pid, tail)
    # decoded on the way: still the same names, unless the queue holds a segment like an id
    if not any(part.startswith("JOB-") for part in queue.split("/")[1:]):
        assert split_flow_path(unquote(rest)) == (queue, pid + ("/" + tail if tail else ""), "")


def test_the_job_page_of_a_plain_job_whose_id_ends_like_an_action(
    client: EchoMQ, actions: Dashboard
) -> None:
    """A dead plain job ``JOB-af/x/retry`` in a queue holding ``/``: its page opens, and its
    page's own retry form retries that job (the quoted path is never ambiguous)."""
    queue, job_id = "team/etl@v2+x", "JOB-af/x/retry"
    q = client.queue(queue)
    q.add({"n": 1}, job_id=job_id, max_attempts=1)
    (job,) = q.claim(1)
    q.fail(job, "ValueError: once", retry=False)
    signed = actions.post("/login", {"token": TOKEN})
    session = {"Cookie": signed.cookies[0].split(";")[0]}
    page = actions.get(job_page("", queue, job_id), session)
    assert page.status == 200 and job_id_of(page.body) == job_id
    (form,) = [h for h in links(page.body, JOB_PATH) if h.endswith("/retry")]
    assert form == job_page("", queue, job_id, "retry")
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.body)
    assert csrf is not None
    done = actions.post(form, {"csrf": csrf.group(1)}, session)
    assert done.status == 303 and urlsplit(done.headers["location"]).path == job_page(
        "", queue, job_id
    )
    assert q.get_job(job_id).state == "pending"
