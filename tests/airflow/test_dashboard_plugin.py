"""The provider's plugin: the EchoMQ dashboard mounted in Airflow's api-server (the real
FastAPI app Airflow builds, served over HTTP by uvicorn), its navigation entry, and the
"EchoMQ flow" extra link computed by a real DAG run."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from echomq_provider.flow_specs import parent_id_for
from echomq_provider.plugins.links import EchoFlowLink, EchoFlowSensorLink

from .helpers import airflow_cli, run_dag

pytestmark = pytest.mark.onlystandalone


def test_airflow_lists_the_plugin(airflow_db: Path) -> None:
    result = airflow_cli("plugins", "-o", "json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"echomq"' in result.stdout
    assert "/echomq" in result.stdout  # its fastapi app's prefix
    assert "echomq/" in result.stdout  # its navigation entry


def test_nav_entry_is_an_external_view(airflow_db: Path) -> None:
    from airflow import plugins_manager

    (info,) = [p for p in plugins_manager.get_plugin_info() if p["name"] == "echomq"]
    (ours,) = [v for v in info["external_views"] if v.get("url_route") == "echomq"]
    assert (ours["name"], ours["href"], ours["destination"]) == ("EchoMQ", "echomq/", "nav")


class _Served:
    """Airflow's own api-server app, served by uvicorn on a free port in a thread."""

    def __init__(self) -> None:
        import uvicorn
        from airflow.api_fastapi.app import create_app

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(create_app(), log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "api-server down"
            time.sleep(0.05)

    def request(self, method: str, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request(method, path, body=b"" if method == "POST" else None)
        r = conn.getresponse()
        out = (r.status, r.read().decode())
        conn.close()
        return out

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


@pytest.fixture
def api_server(
    airflow_db: Path, echomq_conn: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[_Served]:
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "echomq-test-" + "x" * 32)
    # the UI without a login page (the browser test below opens it as an admin)
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True")
    from echomq_provider.plugins.dashboard import EchoMQPlugin

    for mounted in EchoMQPlugin.fastapi_apps:  # built once per process: this test's connection
        mounted["app"].reset()
    served = _Served()
    yield served
    served.stop()


def test_dashboard_is_mounted_in_the_api_server_and_read_only(
    api_server: _Served, echomq_conn: str, prefix: str, standalone_server: Any
) -> None:
    from echomq_core import Child, EchoMQ

    mq = EchoMQ(standalone_server.url, prefix=prefix)
    ref = mq.add_flow("af-parents", [Child(i, queue="af-kids") for i in range(3)], barrier=True)
    status, page = api_server.request("GET", "/echomq/")
    assert status == 200, page
    assert 'data-queue="af-parents"' in page and 'href="/echomq/flows"' in page
    path = f"/echomq/flow/af-parents/{quote(ref.parent_id, safe='')}"
    status, page = api_server.request("GET", path)
    assert status == 200 and 'id="flow-state" data-k="flow|parent_state">held<' in page
    assert api_server.request("GET", "/echomq/static/dashboard.js")[0] == 200
    status, metrics = api_server.request("GET", "/echomq/metrics")
    assert status == 200 and 'echomq_flows{queue="af-parents",state="held"} 1.0' in metrics
    status, refused = api_server.request("POST", path + "/cancel")
    assert status == 403 and "read-only" in refused
    assert mq.snapshot("af-parents", ref.parent_id).parent_state == "held"
    mq.close()


def test_flow_pages_of_derived_ids_open_in_the_api_server(
    api_server: _Served, echomq_conn: str, prefix: str, standalone_server: Any
) -> None:
    """The ids the provider derives hold '/' (``JOB-af/<dag>/<task>/<digest>``), a keyed
    child's ``#`` too: the extra link's URL (``links.flow_url``), the /flows page's links and the
    page's JSON twin open the flow through Airflow's api-server."""
    import html
    import re

    from echomq_provider.flow_specs import keyed_child_id
    from echomq_provider.plugins.links import flow_url

    from echomq_core import Child, EchoMQ

    mq = EchoMQ(standalone_server.url, prefix=prefix)
    parent = parent_id_for("echomq_fan_out", "manual__2026-01-01T00:00:00+00:00", "fan_out", 2)
    keyed = keyed_child_id(parent, "part #3=a+b")
    for queue, pid in (("af-parents", parent), ("af/kids@v2", keyed)):
        mq.add_flow(queue, [Child(0, queue="af-kids")], parent_id=pid, barrier=True)
        link = flow_url(queue, pid)
        assert "/" not in link[len("/echomq/flow/") :].split("/", 1)[1]  # each name quoted
        status, page = api_server.request("GET", link)
        assert status == 200, (link, page[-500:])
        assert f"<h1>Flow <code>{html.escape(pid)}</code>" in page and ">held<" in page
        (live,) = re.findall(r'data-live="([^"]*)"', page)
        status, doc = api_server.request("GET", html.unescape(live))
        assert status == 200 and '"outcome":"waiting"' in doc.replace(" ", "")
    status, flows = api_server.request("GET", "/echomq/flows")
    hrefs = [html.unescape(h) for h in re.findall(r'href="(/echomq/flow/[^"]*)"', flows)]
    assert sorted(hrefs) == sorted([flow_url("af-parents", parent), flow_url("af/kids@v2", keyed)])
    for href in hrefs:
        assert api_server.request("GET", href)[0] == 200, href
    mq.close()


def test_job_children_and_queue_pages_open_in_the_api_server(
    api_server: _Served, echomq_conn: str, prefix: str, standalone_server: Any
) -> None:
    """Under ``/echomq``: a provider-derived flow's children page (linked from its flow page),
    each child's job page (linked from there; the ids hold '/'), the job's link back up, the
    queue's pages by state; every link the pages render stays under the mount."""
    import html
    import re

    from echomq_provider.plugins.links import flow_url

    from echomq_core import Child, EchoMQ

    mq = EchoMQ(standalone_server.url, prefix=prefix)
    parent = parent_id_for("echomq_fan_out", "manual__2026-01-01T00:00:00+00:00", "fan_out", 4)
    mq.add_flow("af-parents", [Child(i, queue="af-kids") for i in range(3)], parent_id=parent)

    def get(path: str) -> str:
        status, page = api_server.request("GET", path)
        assert status == 200, (path, page[-500:])
        assert not re.findall(r'(?:href|action)="/(?!echomq)', page), path  # all under the mount
        return page

    def hrefs(page: str, under: str) -> list[str]:
        found = re.findall(r'(?:href|action)="([^"]*)"', page)
        return [html.unescape(h) for h in found if html.unescape(h).startswith(under)]

    flow = get(flow_url("af-parents", parent))
    (children,) = {h for h in hrefs(flow, "/echomq/flow/") if h.endswith("/children")}
    jobs = hrefs(get(children), "/echomq/job/")
    assert len(jobs) == 3 and all("%2F" in h for h in jobs)
    for i, href in enumerate(jobs):
        page = get(href)
        assert f'<code id="job-id">{html.escape(parent)}.{i}</code>' in page
        (up,) = re.findall(r'href="([^"]*)" id="job-parent"', page)
        assert html.unescape(up) == flow_url("af-parents", parent)
    status, doc = api_server.request("GET", "/echomq/api" + jobs[0][len("/echomq") :])
    assert status == 200 and f'"id":"{parent}.0"' in doc.replace(" ", "")
    pending = get("/echomq/queue/af-kids?state=pending")
    assert hrefs(pending, "/echomq/job/") == jobs
    mq.close()


def test_flow_task_instances_link_to_their_flow_page(
    airflow_db: Path, echomq_conn: str, start_worker: Callable[..., Any], api_server: _Served
) -> None:
    """The extra links as Airflow 3 computes them: in the worker, when the task ends, from
    the classes' ``operator_extra_links`` (the operator and the sensor declare them); the link
    opens the flow's page in the api-server (its derived id holds '/')."""

    def with_links(dag: Any) -> None:
        assert [type(x) for x in dag.get_task("fan_out").operator_extra_links] == [EchoFlowLink]
        wait = dag.get_task("wait")
        assert [type(x) for x in wait.operator_extra_links] == [EchoFlowSensorLink]
        wait.deferrable, wait.mode = False, "poke"

    start_worker()
    run = run_dag(airflow_db, "echomq_fan_out", with_links)
    assert run.state == "success", {k: str(t.state) for k, t in run.tasks.items()}
    parent = parent_id_for("echomq_fan_out", run.run_id, "fan_out")
    expected = f"/echomq/flow/example.reports/{quote(parent, safe='')}"
    assert run.xcom("fan_out", "_link_EchoFlowLink") == expected
    assert run.xcom("wait", "_link_EchoFlowSensorLink") == expected
    status, page = api_server.request("GET", expected)
    assert status == 200 and f"<h1>Flow <code>{parent}</code>" in page, page[-500:]


def test_the_dashboard_inside_airflows_ui_in_chromium(
    api_server: _Served, prefix: str, standalone_server: Any, tmp_path: Path
) -> None:
    """As a person would: Airflow's UI in headless Chromium, Browse -> EchoMQ, the dashboard
    in Airflow's page (an iframe of the same origin), live, with a flow held."""
    import os

    from echomq_core import Child, EchoMQ
    from tests.browser.cdp import Browser

    mq = EchoMQ(standalone_server.url, prefix=prefix)
    mq.add_flow("af-ui", [Child(i, queue="af-ui-kids") for i in range(4)], barrier=True)
    shots = Path(os.environ.get("ECHOMQ_SCREENSHOTS") or tmp_path)
    browser = Browser()
    try:
        browser.goto(f"http://127.0.0.1:{api_server.port}/")
        browser.wait_for("document.body.innerText.includes('Browse')", timeout=30)
        browser.click("button[aria-label='Browse'], [title='Browse']")
        link = "[...document.querySelectorAll('a')].find(a => a.textContent.trim() === 'EchoMQ')"
        browser.wait_for(f"{link} !== undefined")
        browser.js(f"{link}.setAttribute('id', 'echomq-nav')")
        browser.click("#echomq-nav")
        frame = "document.querySelector('iframe')"
        browser.wait_for(f"{frame} && {frame}.src.endsWith('/echomq/')", timeout=30)
        inner = f"{frame}.contentDocument"
        browser.wait_for(inner + "?.querySelector('[data-queue=af-ui]') != null")
        held = inner + ".querySelector(\"[data-k='queues|af-ui|flows|held']\").textContent"
        assert browser.js(held) == "1"
        browser.wait_for(f"{inner}.querySelector('#live-status').className === 'ok'")
        browser.screenshot(shots / "airflow.png")
    finally:
        browser.close()
        mq.close()
