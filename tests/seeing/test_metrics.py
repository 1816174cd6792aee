"""Prometheus metrics (echomq_core.seeing.metrics, .process_metrics) against real servers: the
server-side collector's values and its cost per scrape, a worker's and a Pump's own counters,
and ``--metrics-port``."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from echomq_core import Backoff, Child, EchoMQ, Job, JobSpec, Pump, Unrecoverable, Worker
from echomq_core.seeing.metrics import COMMANDS_PER_QUEUE, QueueCollector
from echomq_core.seeing.process_metrics import ProcessMetrics
from echomq_core.server import EmbeddedServer

from ..conftest import Backend
from ..waiting import eventually

CLI = [sys.executable, "-m", "echomq_core.cli"]


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, as {(name, sorted labels): value} - parsed back from the text
    format, so what Prometheus would read is what is checked."""
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def test_collector_reports_jobs_flows_outbox_and_poison(backend: Backend, mq: EchoMQ) -> None:
    q = mq.queue("mx-work", max_attempts=1)
    q.add_bulk([JobSpec({"n": i}) for i in range(7)])
    q.add({"later": True}, delay=3600)
    # a held flow whose children live in another queue, and one that fails
    held = mq.add_flow("mx-parents", [Child(i, queue="mx-kids") for i in range(3)])
    doomed = mq.add_flow("mx-parents", [Child("x", queue="mx-parents", max_attempts=1)])
    kids = mq.queue("mx-kids")
    done = kids.claim(2)
    kids.complete_many([(job, 1) for job in done])  # two cross-queue signals in the outbox
    (job,) = mq.queue("mx-parents").claim(1)
    assert job.parent is not None and job.parent.id == doomed.parent_id
    mq.queue("mx-parents").fail(job, "boom", retry=False)
    (dead,) = q.claim(1)
    q.fail(dead, "no more", retry=False)

    registry = CollectorRegistry()
    registry.register(QueueCollector(mq))
    found = samples(registry)
    assert value(found, "echomq_up") == 1
    assert value(found, "echomq_queue_jobs", queue="mx-work", state="pending") == 6
    assert value(found, "echomq_queue_jobs", queue="mx-work", state="delayed") == 1
    assert value(found, "echomq_queue_jobs", queue="mx-work", state="dead") == 1
    assert value(found, "echomq_queue_jobs", queue="mx-kids", state="pending") == 1
    assert value(found, "echomq_queue_jobs", queue="mx-kids", state="completed") == 2
    assert value(found, "echomq_outbox_signals", queue="mx-kids") == 2
    assert value(found, "echomq_poison_signals", queue="mx-kids") == 0
    assert value(found, "echomq_flows", queue="mx-parents", state="held") == 1
    assert value(found, "echomq_flows", queue="mx-parents", state="failed") == 1
    assert value(found, "echomq_flows", queue="mx-parents", state="released") == 0
    assert held.parent_id != doomed.parent_id


def test_a_rate_limited_queue_reports_its_limit_and_booking(backend: Backend, mq: EchoMQ) -> None:
    """The limit in starts per second and how far ahead the starts are booked (TAT - now), read
    from the server; a queue without a limit has neither sample."""
    q = mq.queue("mx-rated")
    q.add_bulk([JobSpec(i) for i in range(5)])
    mq.queue("mx-free").add(1)
    mq.set_rate_limit("mx-rated", "8640/d", burst=5)  # one start per 10 s, 5 at once
    assert len(q.claim(3)) == 3
    registry = CollectorRegistry()
    registry.register(QueueCollector(mq, ["mx-rated", "mx-free"]))
    found = samples(registry)
    assert value(found, "echomq_queue_rate_limit_per_second", queue="mx-rated") == 0.1
    assert 29 < value(found, "echomq_queue_rate_booked_seconds", queue="mx-rated") <= 30
    names = {(name, labels) for name, labels in found}
    assert ("echomq_queue_rate_limit_per_second", (("queue", "mx-free"),)) not in names
    (reading,) = QueueCollector(mq, ["mx-rated"]).read()
    assert reading.to_dict()["rate"] == "8640/d burst 5, 2 ready"


def test_flow_controls_of_held_flows_are_gauges(backend: Backend, mq: EchoMQ) -> None:
    """A capped flow's running children and cap, a threshold flow's failures and allowance,
    per held root flow; a flow with neither has no flow gauge."""
    capped = mq.add_flow(
        "mx-ctl",
        [Child(i, queue="mx-ctl-kids", max_attempts=1) for i in range(6)],
        max_running=2,
        min_success=0.5,
    )
    plain = mq.add_flow("mx-ctl", [Child(1)])
    kids = mq.queue("mx-ctl-kids")
    (job,) = kids.claim(1)
    kids.fail(job, "bad row", retry=False)  # a cross-queue death: the Pump settles it
    Pump(mq, ["mx-ctl-kids"]).tick()
    registry = CollectorRegistry()
    registry.register(QueueCollector(mq, ["mx-ctl", "mx-ctl-kids"]))
    found = samples(registry)
    flow = {"queue": "mx-ctl", "flow": capped.parent_id}
    assert value(found, "echomq_flow_max_running", **flow) == 2
    assert value(found, "echomq_flow_running", **flow) == 2  # the dead child's token moved on
    assert value(found, "echomq_flow_failed_children", **flow) == 1
    assert value(found, "echomq_flow_allowed_failures", **flow) == 3
    assert not [k for k in found if ("flow", plain.parent_id) in k[1]]


@pytest.mark.onlystandalone
def test_a_scrape_costs_the_same_for_10_and_10000_jobs(
    standalone_server: EmbeddedServer, prefix: str
) -> None:
    """The bound in the module doc, measured with INFO commandstats: COMMANDS_PER_QUEUE per
    queue plus one SMEMBERS, for flow controls one ZRANGE and one HMGET per held flow
    (at most FLOW_GAUGES), for the oldest pending age one ZRANGE and one HGET per queue and
    one TIME, for the workers one ZRANGE (plus one HMGET per live worker: none here), and
    for the fairness groups one script and its HGET, whatever the number of jobs (and
    children) a queue holds."""
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    raw = redis.Redis.from_url(standalone_server.url)
    costs = {}
    list(QueueCollector(mq, ["mx-warm"]).collect())  # the scripts load once per server: now
    for n in (10, 10_000):
        queue = f"mx-size{n}"
        mq.queue(queue).add_bulk([JobSpec(i) for i in range(n)])
        mq.add_flow(queue, [Child(i) for i in range(n)])  # a flow of n children too
        collector = QueueCollector(mq, [queue])
        raw.config_resetstat()
        list(collector.collect())
        stats = {
            k: int(v["calls"])
            for k, v in raw.info("commandstats").items()
            if not k.startswith(("cmdstat_config", "cmdstat_info"))
        }
        costs[n] = sum(stats.values())
        assert stats.keys() <= {
            "cmdstat_zcard",
            "cmdstat_llen",
            "cmdstat_lindex",
            "cmdstat_hget",
            "cmdstat_zrange",  # the newest held flows (their flow controls) ...
            "cmdstat_hmget",  # ... one row read each: this flow has none
            "cmdstat_time",  # the oldest pending job's age is the server's clock minus ...
            "cmdstat_evalsha",  # the rate script (its HGET of the limit: none here)
        }
    # with every registered queue (the default): one SMEMBERS more, per scrape
    raw.config_resetstat()
    list(QueueCollector(mq).collect())
    everything = raw.info("commandstats")
    assert int(everything["cmdstat_smembers"]["calls"]) == 1
    print(f"commands per scrape per queue: 10 jobs {costs[10]}, 10,000 jobs {costs[10_000]}")
    # + 2 flow controls, + 2 oldest pending (ZRANGE, HGET), + TIME, + the workers' ZRANGE,
    # + the groups' script and its HGET (no groups here: nothing to scan)
    assert costs[10] == costs[10_000] == COMMANDS_PER_QUEUE + 2 + 2 + 2 + 2 == 23
    raw.close()
    mq.close()


def test_lag_is_how_long_the_outbox_head_has_not_moved(backend: Backend, mq: EchoMQ) -> None:
    now = [1000.0]
    collector = QueueCollector(mq, ["mx-lag-kids", "mx-lag-parents"], clock=lambda: now[0])
    ref = mq.add_flow("mx-lag-parents", [Child(i, queue="mx-lag-kids") for i in range(2)])
    kids = mq.queue("mx-lag-kids")
    first = kids.claim(1)
    kids.complete_many([(job, "v") for job in first])

    def lag() -> float:
        return {r.queue: r.head_age for r in collector.read()}["mx-lag-kids"]

    assert lag() == 0.0  # first seen now
    now[0] += 12.5
    assert lag() == 12.5  # the same head, not delivered: the Pump is behind
    rest = kids.claim(1)
    kids.complete_many([(job, "v") for job in rest])  # a second signal queues behind it
    now[0] += 1
    assert lag() == 13.5
    Pump(mq, ["mx-lag-kids", "mx-lag-parents"]).tick()  # delivers both
    now[0] += 1
    assert lag() == 0.0
    assert mq.snapshot("mx-lag-parents", ref.parent_id).released


def test_an_unreachable_server_scrapes_as_down() -> None:
    with _closed_port() as port:
        mq = EchoMQ(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.5)
        registry = CollectorRegistry()
        registry.register(QueueCollector(mq, ["q"]))
        found = samples(registry)
        mq.close()
    assert value(found, "echomq_up") == 0
    assert not any(name == "echomq_queue_jobs" for name, _ in found)


class _closed_port:
    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_worker_metrics_count_what_the_worker_did(backend: Backend, mq: EchoMQ) -> None:
    metrics = ProcessMetrics()
    seen: list[str] = []

    class Inner:  # a plugin's hooks still get every event
        def job_dead(self, *, job: Any, error: str) -> None:
            seen.append(job.id)

    def handle(job: Any) -> Any:
        kind = job.payload["kind"]
        if kind == "flaky" and job.attempts == 0:
            raise RuntimeError("first try fails")
        if kind == "bad":
            raise Unrecoverable("never")
        if kind == "slow":
            time.sleep(0.05)
        return kind

    q = mq.queue("mx-w", max_attempts=2)
    q.add_bulk([JobSpec({"kind": "ok"}) for _ in range(20)])
    q.add_bulk([JobSpec({"kind": k}) for k in ("flaky", "bad", "slow")])
    worker = Worker(
        mq,
        metrics.wrap_handlers({"mx-w": handle}),
        hooks=metrics.hooks(Inner()),
        queue_options={"backoff": Backoff(base_ms=20, cap_ms=50)},
        concurrency=2,
        poll=0.01,
        max_poll=0.05,
    )
    metrics.watch_worker(worker)
    worker.start()
    try:
        eventually(
            lambda: q.stats()["completed"] >= 22 and q.stats()["dead"] >= 1,
            30,
            lambda: f"22 completions and a death: {q.stats()}",
            every=0.05,
        )
    finally:
        worker.stop()
    found = samples(metrics.registry)
    assert value(found, "echomq_jobs_completed_total", queue="mx-w") == 22
    assert value(found, "echomq_job_attempts_failed_total", queue="mx-w") == 2
    assert value(found, "echomq_jobs_retried_total", queue="mx-w") == 1  # flaky, not bad
    assert value(found, "echomq_jobs_dead_total", queue="mx-w") == 1
    assert len(seen) == 1
    assert value(found, "echomq_handler_duration_seconds_count", queue="mx-w") == 24
    assert value(found, "echomq_handler_duration_seconds_sum", queue="mx-w") >= 0.05
    assert value(found, "echomq_handler_duration_seconds_bucket", queue="mx-w", le="0.01") < 24
    # every job run was claimed once, in batches: the batch sizes add up to the claims
    assert value(found, "echomq_claim_batch_size_sum", queue="mx-w") == 24
    assert 1 <= value(found, "echomq_claim_batch_size_count", queue="mx-w") < 24


def test_async_handlers_are_timed_and_counted_when_awaited(backend: Backend, mq: EchoMQ) -> None:
    import asyncio

    metrics = ProcessMetrics()

    async def handle(job: Any) -> Any:
        await asyncio.sleep(0.03)
        if job.payload == "bad":
            raise ValueError("async failure")
        return job.payload

    q = mq.queue("mx-async", max_attempts=1)
    q.add_bulk([JobSpec("ok"), JobSpec("bad")])
    worker = Worker(
        mq,
        metrics.wrap_handlers({"mx-async": handle}),
        hooks=metrics.hooks(),
        poll=0.01,
        max_poll=0.05,
    )
    worker.start()
    try:
        eventually(
            lambda: q.stats()["completed"] >= 1 and q.stats()["dead"] >= 1,
            20,
            lambda: f"a completion and a death: {q.stats()}",
            every=0.05,
        )
    finally:
        worker.stop()
    found = samples(metrics.registry)
    assert value(found, "echomq_handler_duration_seconds_count", queue="mx-async") == 2
    assert value(found, "echomq_handler_duration_seconds_sum", queue="mx-async") >= 0.06
    assert value(found, "echomq_job_attempts_failed_total", queue="mx-async") == 1
    assert value(found, "echomq_jobs_retried_total", queue="mx-async") == 0
    assert value(found, "echomq_jobs_completed_total", queue="mx-async") == 1


def test_pump_metrics_count_deliveries_and_releases(backend: Backend, mq: EchoMQ) -> None:
    metrics = ProcessMetrics()
    ref = mq.add_flow("mx-p-parents", [Child(i, queue="mx-p-kids") for i in range(5)])
    kids = mq.queue("mx-p-kids")
    kids.complete_many([(job, 1) for job in kids.claim(5)])
    pump = metrics.watch_pump(
        Pump(mq, ["mx-p-kids", "mx-p-parents"], hooks=metrics.hooks(), maintain_every=0)
    )
    pump.tick()
    found = samples(metrics.registry)
    assert value(found, "echomq_pump_events_total", event="delivered") == 5
    assert value(found, "echomq_flows_released_total", queue="mx-p-parents") == 1
    assert value(found, "echomq_pump_tick_duration_seconds_count") == 1
    assert mq.snapshot("mx-p-parents", ref.parent_id).released


APP = """
def handle(job):
    return job.payload * 2

HANDLERS = {"mx-cli": handle}
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "mx_app.py").write_text(textwrap.dedent(APP))
    return tmp_path


def _metrics_url(proc: subprocess.Popen[str]) -> Iterator[str]:
    assert proc.stderr is not None
    for line in proc.stderr:
        found = re.search(r"echomq metrics: (http://\S+)", line)
        if found:
            yield found.group(1)
            return
    raise AssertionError("the process never printed its metrics URL")


def _healthz(metrics_url: str) -> tuple[int, str]:
    """The status and body of the ``/healthz`` beside ``metrics_url`` (a 503 names what is
    wrong in its body)."""
    try:
        probe = urllib.request.urlopen(metrics_url.replace("/metrics", "/healthz"), timeout=5)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    return probe.status, probe.read().decode()


def test_worker_and_pump_serve_metrics_on_metrics_port(
    standalone_server: EmbeddedServer, prefix: str, app_dir: Path, proc_env: dict[str, str]
) -> None:
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    ref = mq.add_flow("mx-cli-parents", [Child(i, queue="mx-cli") for i in range(10)])
    conn = ["--url", standalone_server.url, "--prefix", prefix, "--metrics-port", "0"]
    procs = [
        subprocess.Popen(
            [*CLI, *args, *conn],
            cwd=app_dir,
            env=proc_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # the worker leaves the outbox to the Pump, whose deliveries this test scrapes
        for args in (["worker", "mx-cli", "--app", "mx_app:HANDLERS", "--no-pump"], ["pump"])
    ]
    try:
        worker_url, pump_url = (next(_metrics_url(p)) for p in procs)
        assert "127.0.0.1" in worker_url and "127.0.0.1" in pump_url
        mq.wait("mx-cli-parents", ref.parent_id, timeout=30)
        last: list[str] = []

        def scraped() -> tuple[str, str] | None:
            """The worker's completions and the Pump's deliveries, as scraped."""
            worker_text = urllib.request.urlopen(worker_url, timeout=5).read().decode()
            pump_text = urllib.request.urlopen(pump_url, timeout=5).read().decode()
            last[:] = [worker_text, pump_text]
            if (
                'echomq_jobs_completed_total{queue="mx-cli"} 10.0' in worker_text
                and 'echomq_pump_events_total{event="delivered"} 10.0' in pump_text
            ):
                return worker_text, pump_text
            return None

        worker_text, pump_text = eventually(scraped, 10, lambda: tuple(last), every=0.1)
        assert 'echomq_claim_batch_size_count{queue="mx-cli"}' in worker_text
        assert 'echomq_flows_released_total{queue="mx-cli-parents"} 1.0' in pump_text
        # the Pump also exports the server-side gauges of the queues it serves
        assert 'echomq_outbox_head_age_seconds{queue="mx-cli"}' in pump_text
        # and each answers its liveness probe beside the metrics
        for url in (worker_url, pump_url):
            assert _healthz(url) == (200, "ok\n")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.communicate(timeout=30)
        mq.close()
    assert [p.returncode for p in procs] == [0, 0]


def test_workers_without_metrics_do_not_need_prometheus_client(
    standalone_server: EmbeddedServer, prefix: str, app_dir: Path, proc_env: dict[str, str]
) -> None:
    """prometheus-client is the metrics extra's: the core and the CLI import without it, and
    --metrics-port without it is refused in one line naming what to install."""
    blocked = (
        "import sys; sys.modules['prometheus_client'] = None; "
        "import echomq_core, echomq_core.cli, echomq_core.work.worker, echomq_core.pump.pump; "
        "from echomq_core.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    conn = ["--url", standalone_server.url, "--prefix", prefix]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            blocked,
            "worker",
            "mx-cli",
            "--app",
            "mx_app:HANDLERS",
            "--metrics-port",
            "0",
            *conn,
        ],
        cwd=app_dir,
        env=proc_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "pip install 'echomq[metrics]'" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_build_info_oldest_pending_age_and_workers_per_queue(backend: Backend, mq: EchoMQ) -> None:
    from echomq_core import __version__

    q = mq.queue("mx-lat")
    q.add(1)
    mq.queue("mx-idle")  # registered by add below, served by nobody
    mq.queue("mx-idle").add(2)
    registry = CollectorRegistry()
    registry.register(QueueCollector(mq))
    first = samples(registry)
    assert value(first, "echomq_build_info", version=__version__) == 1
    age = value(first, "echomq_queue_oldest_pending_age_seconds", queue="mx-lat")
    assert 0 <= age < 60
    assert value(first, "echomq_workers", queue="mx-lat") == 0
    gate = threading.Event()

    def held(job: Job) -> int:
        gate.wait(30)
        return 1

    w1 = Worker(mq, {"mx-lat": held}).start()
    w2 = Worker(mq, {"mx-lat": held, "mx-other": held}).start()
    try:
        # the head is claimed: nothing pending, age 0
        eventually(lambda: q.stats()["pending"] == 0, 10)
        found = samples(registry)
        assert value(found, "echomq_workers", queue="mx-lat") == 2
        assert value(found, "echomq_workers", queue="mx-other") == 1
        assert value(found, "echomq_workers", queue="mx-idle") == 0
        assert value(found, "echomq_queue_oldest_pending_age_seconds", queue="mx-lat") == 0
        assert value(found, "echomq_queue_oldest_pending_age_seconds", queue="mx-idle") >= 0
    finally:
        gate.set()
        w1.stop()
        w2.stop()
    assert value(samples(registry), "echomq_workers", queue="mx-lat") == 0


ROOT = Path(__file__).resolve().parent.parent.parent
METRIC_RE = re.compile(r"\b(echomq_[a-z_]+)\b")


def shipped_queries() -> dict[str, list[str]]:
    """Every PromQL expression of the shipped Grafana dashboard and alert rules, parsed (a
    file that does not parse fails here)."""
    import json

    import yaml

    dash = json.loads((ROOT / "deploy" / "grafana" / "echomq.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    alerts = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert all(r.get("alert") and r.get("for") for g in rules["groups"] for r in g["rules"])
    return {"grafana": exprs, "alerts": alerts}


def test_every_metric_the_dashboard_and_alerts_query_is_in_a_real_scrape(
    backend: Backend, mq: EchoMQ
) -> None:
    """A real server with real workers, a Pump, a capped threshold flow, a rate-limited queue:
    the collector's scrape and a worker's and a Pump's own registries hold every metric name
    the shipped deploy/ files query (a renamed metric, or a query of one that was never made,
    fails here)."""
    queries = shipped_queries()
    titles = " ".join(queries["grafana"])
    for need in ("echomq_workers", "echomq_outbox_head_age_seconds", "oldest_pending"):
        assert need in titles
    wanted = {n for exprs in queries.values() for e in exprs for n in METRIC_RE.findall(e)}
    metrics = ProcessMetrics()

    def handle(job: Job) -> Any:
        if job.payload == "bad":
            raise Unrecoverable("never")
        return 1

    q = mq.queue("mx-dep", max_attempts=1)
    q.add_bulk([JobSpec(p) for p in ("ok", "ok", "bad")])
    mq.set_rate_limit("mx-dep", "100/s")
    mq.add_flow(
        "mx-dep-parents",
        [Child(i, queue="mx-dep-kids", max_attempts=1) for i in range(4)],
        max_running=2,
        min_success=0.5,
    )
    worker = Worker(mq, metrics.wrap_handlers({"mx-dep": handle}), hooks=metrics.hooks())
    metrics.watch_worker(worker)
    pump = metrics.watch_pump(Pump(mq, ["mx-dep-kids"], hooks=metrics.hooks()))
    worker.start()
    try:
        eventually(lambda: q.stats()["completed"] == 2 and q.stats()["dead"] == 1, 30)
        kids = mq.queue("mx-dep-kids")
        kids.complete_many([(job, 1) for job in kids.claim(1)])  # a signal for the Pump
        assert pump.tick().delivered == 1
        registry = CollectorRegistry()
        registry.register(QueueCollector(mq))
        scraped = {name for name, _ in samples(registry)} | {
            name for name, _ in samples(metrics.registry)
        }
    finally:
        worker.stop()
    missing = sorted(wanted - scraped)
    assert not missing, f"queried by deploy/ but in no scrape: {missing}"
    assert len(wanted) >= 20


def test_batch_calls_are_timed_once_and_their_failed_jobs_counted_each(
    backend: Backend, mq: EchoMQ
) -> None:
    """A batch handler (``Worker(batch=...)``, ``echomq worker --batch``) wrapped for metrics:
    one duration per call, a failed attempt per exception in its list and per job of a call
    that raised."""
    metrics = ProcessMetrics()
    calls: list[int] = []

    def handle(jobs: list[Any]) -> list[Any]:
        calls.append(len(jobs))
        if any(job.payload == "boom" for job in jobs):
            raise RuntimeError("the whole call fails")
        return [ValueError("bad one") if job.payload == "bad" else job.payload for job in jobs]

    q = mq.queue("mx-b", max_attempts=1)
    q.add_bulk([JobSpec("ok") for _ in range(10)] + [JobSpec("bad"), JobSpec("bad")])
    worker = Worker(
        mq, metrics.wrap_handlers({"mx-b": handle}), hooks=metrics.hooks(), batch=8, poll=0.01
    )
    worker.start()
    try:
        eventually(lambda: q.stats()["completed"] + q.stats()["dead"] >= 12, 30, every=0.05)
        q.add_bulk([JobSpec("boom")])  # alone or with others: that call's jobs all fail
        eventually(lambda: q.stats()["dead"] >= 3, 30, every=0.05)
    finally:
        worker.stop()
    found = samples(metrics.registry)
    dead = q.stats()["dead"]
    assert q.stats()["completed"] + dead == 13
    assert value(found, "echomq_handler_duration_seconds_count", queue="mx-b") == len(calls)
    assert len(calls) < 13  # calls of several jobs happened
    assert value(found, "echomq_job_attempts_failed_total", queue="mx-b") == dead
    assert value(found, "echomq_jobs_dead_total", queue="mx-b") == dead


def test_a_queue_with_groups_reports_two_series_however_many_groups(
    backend: Backend, mq: EchoMQ
) -> None:
    """How many groups have work queued and the busiest one's jobs queued, per queue (a sharded
    queue's shards read under its name); no series per group, none for a queue without."""
    mq.set_shards("mx-groups", 2)
    q = mq.queue("mx-groups")
    q.add_bulk([JobSpec(i, group=f"tenant-{i % 40}") for i in range(400)])
    q.add_bulk([JobSpec(i, group="whale") for i in range(90)])
    mq.queue("mx-plain").add(1)
    registry = CollectorRegistry()
    registry.register(QueueCollector(mq, ["mx-groups", "mx-plain"]))
    found = samples(registry)
    assert value(found, "echomq_queue_groups_waiting", queue="mx-groups") >= 41  # per shard
    whale = value(found, "echomq_queue_group_busiest_queued", queue="mx-groups")
    assert 0 < whale <= 90 and whale > 10  # the whale's share of one shard, not a tenant's 10
    names = {name for name, _ in found}
    per_group = [n for n, labels in found if dict(labels).get("group")]
    assert not per_group and "echomq_queue_groups_waiting" in names
    assert ("echomq_queue_groups_waiting", (("queue", "mx-plain"),)) not in set(found)
