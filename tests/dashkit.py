"""Helpers for the dashboard tests: the dashboard as a real process (``echomq dashboard`` on
uvicorn), plain HTTP against it, a keyspace of real flows in every state, and the fixtures the
dashboard tests share (``tests/seeing/conftest.py`` and ``tests/browser/conftest.py`` bring
them in): ``client``, ``scenario``, ``open_dashboard``, ``readonly``, ``actions`` on the
standalone server, and ``dashboard`` on the test's backend."""

from __future__ import annotations

import http.client
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import pytest
import redis

from echomq_core import Child, EchoMQ, FlowRef, Pump
from echomq_core.server import EmbeddedServer

from .waiting import eventually

if TYPE_CHECKING:
    from .conftest import Backend

CLI = [sys.executable, "-m", "echomq_core.cli"]
TOKEN = "browser-test-token-0123456789"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: str
    cookies: list[str] = field(default_factory=list)


class Dashboard:
    """``echomq dashboard --port 0`` in a subprocess, stopped by :meth:`stop`."""

    def __init__(
        self,
        url: str,
        prefix: str,
        env: dict[str, str],
        *,
        actions: bool = False,
        poll: float = 0.3,
        extra: tuple[str, ...] = (),
    ) -> None:
        args = [
            *CLI,
            "dashboard",
            "--port",
            "0",
            "--url",
            url,
            "--prefix",
            prefix,
            "--poll",
            str(poll),
            *extra,
        ]
        env = dict(env)
        if actions:
            args.append("--actions")
            env["ECHOMQ_DASHBOARD_TOKEN"] = TOKEN
        self.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"the dashboard did not start: {line!r} {err}")
        self.base = line.rstrip("/")
        parts = urlsplit(self.base)
        self.host, self.port = parts.hostname or "", parts.port or 0

        def answers() -> bool:  # uvicorn serves a moment after the socket is bound
            try:
                return self.get("/api/queues").status == 200
            except OSError:
                return False

        try:
            eventually(answers, 15, "the dashboard to answer", every=0.05)
        except AssertionError:
            self.stop()  # never leave the process behind a failed start
            raise

    def request(
        self,
        method: str,
        path: str,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        body = urlencode(form) if form is not None else None
        sent = dict(headers or {})
        if body is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        conn.request(method, path, body=body, headers=sent)
        r = conn.getresponse()
        reply = Reply(
            r.status,
            {k.lower(): v for k, v in r.getheaders()},
            r.read().decode(),
            r.msg.get_all("set-cookie") or [],
        )
        conn.close()
        return reply

    def get(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        return self.request("GET", path, headers=headers)

    def post(
        self, path: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> Reply:
        return self.request("POST", path, form if form is not None else {}, headers)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate(timeout=5)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


@dataclass
class Scenario:
    """Flows in every state, in queues ``dk-parents`` / ``dk-kids``, plus a dead plain job and
    a poisoned signal."""

    held: FlowRef
    released: FlowRef
    failed: FlowRef
    cancelled: FlowRef
    nested: FlowRef
    dead_job: str


def build_scenario(mq: EchoMQ, url: str) -> Scenario:
    kids = mq.queue("dk-kids")
    # held: 10 children across queues, 4 of them done (values to show), the rest pending
    held = mq.add_flow(
        "dk-parents", [Child({"n": i}, queue="dk-kids") for i in range(10)], barrier=True
    )
    jobs = kids.claim(4)
    kids.complete_many([(job, {"square": job.payload["n"] ** 2}) for job in jobs])
    # released: 3 children, one of them an ignored failure
    released = mq.add_flow(
        "dk-parents",
        [
            Child({"n": 0}, queue="dk-parents"),
            Child({"n": 1}, queue="dk-parents"),
            Child({"n": 2}, queue="dk-parents", ignore_dependency_on_failure=True, max_attempts=1),
        ],
        barrier=True,
    )
    # failed: a fail-the-parent child dies with a readable error
    failed = mq.add_flow(
        "dk-parents",
        [Child({"n": 0}, queue="dk-parents", max_attempts=1), Child({"n": 1}, queue="dk-parents")],
        barrier=True,
    )
    parents = mq.queue("dk-parents")
    for job in parents.claim(10):
        if job.parent is not None and job.parent.id == released.parent_id:
            if job.payload["n"] == 2:
                parents.fail(job, "ValueError: bad row 2", retry=False)
            else:
                parents.complete(job, job.payload["n"])
        elif job.parent is not None and job.parent.id == failed.parent_id:
            if job.payload["n"] == 0:
                parents.fail(job, "RuntimeError: disk full on part 0", retry=False)
            else:
                parents.release([job])
        else:
            parents.release([job])
    cancelled = mq.add_flow(
        "dk-parents", [Child(i, queue="dk-kids") for i in range(3)], barrier=True
    )
    mq.cancel_flow("dk-parents", cancelled.parent_id, reason="wrong input file")
    nested = mq.add_flow(
        "dk-parents",
        [
            Child(
                {"part": p},
                queue="dk-kids",
                children=[Child({"leaf": i}, queue="dk-kids") for i in range(3)],
            )
            for p in range(2)
        ],
        barrier=True,
    )
    # a dead plain job and a poisoned signal
    plain = mq.queue("dk-plain")
    dead_id = plain.add({"x": 1}, max_attempts=1)
    (job,) = plain.claim(1)
    plain.fail(job, "KeyError: 'customer_id'", retry=False)
    raw = redis.Redis.from_url(url)
    raw.rpush(mq.keys.outbox("dk-kids"), b"garbage that is no signal")
    raw.close()
    pump = Pump(mq, ["dk-kids"], max_tries=1, maintain_every=3600)
    pump.tick()
    pump.release_leases()  # so the tests' own Pumps drain at once
    assert mq.snapshot("dk-parents", released.parent_id).released
    assert mq.snapshot("dk-parents", failed.parent_id).parent_state == "failed"
    assert mq.queue("dk-kids").stats()["poison"] == 1
    return Scenario(held, released, failed, cancelled, nested, dead_id)


def env_for(proc_env: dict[str, str]) -> dict[str, str]:
    env = dict(proc_env)
    for name in ("ECHOMQ_URL", "ECHOMQ_PREFIX", "ECHOMQ_DASHBOARD_TOKEN"):
        env.pop(name, None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def parse_row(payload: dict[str, str]) -> int:
    return _to_int(payload["row"])


def _to_int(text: str) -> int:
    return int(text)  # ValueError for a bad row, two frames below the handler


#: The bad row of :func:`failing_flow`: its ValueError's message (and so its traceback) holds
#: markup, which every page must show as text.
BAD_ROW = '<script>alert("row")</script>'


def failing_flow(mq: EchoMQ, parent_id: str = "JOB-af/etl/parse/0f3c") -> FlowRef:
    """A flow of 6 rows in ``tb-kids`` whose parent in ``tb-parents`` failed: row 4 (the markup
    of :data:`BAD_ROW`) killed it, row 2 ("two") died under ignore-on-failure - both run by a
    real Worker (their tracebacks are the worker's), delivered by a Pump."""
    from echomq_core import Worker

    rows: list[Child] = [Child({"row": str(i)}, queue="tb-kids") for i in range(6)]
    rows[2] = Child({"row": "two"}, queue="tb-kids", ignore_dependency_on_failure=True)
    rows[4] = Child({"row": BAD_ROW}, queue="tb-kids")
    ref = mq.add_flow("tb-parents", rows, parent_id=parent_id, barrier=True, max_attempts=1)
    worker = Worker(mq, {"tb-kids": lambda job: parse_row(job.payload)}, concurrency=1).start()
    pump = Pump(mq, ["tb-kids", "tb-parents"]).start()
    try:
        eventually(
            lambda: len(mq.child_failures(ref.queue, ref.parent_id)) >= 2, 30, "the two rows to die"
        )
    finally:
        worker.stop()
        pump.stop()
    assert mq.snapshot(ref.queue, ref.parent_id).parent_state == "failed"
    return ref


# -- the fixtures ------------------------------------------------------------------------------


@pytest.fixture
def client(standalone_server: EmbeddedServer, prefix: str) -> Iterator[EchoMQ]:
    """A client of the standalone server, on the test's prefix."""
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    yield mq
    mq.close()


@pytest.fixture
def scenario(client: EchoMQ, standalone_server: EmbeddedServer) -> Scenario:
    return build_scenario(client, standalone_server.url)


@pytest.fixture
def open_dashboard(
    standalone_server: EmbeddedServer, prefix: str, proc_env: dict[str, str]
) -> Iterator[Callable[..., Dashboard]]:
    """Starts a dashboard process on the standalone server and the test's prefix (keyword
    arguments: :class:`Dashboard`'s); each one started is stopped after the test."""
    started: list[Dashboard] = []

    def start(**options: Any) -> Dashboard:
        started.append(Dashboard(standalone_server.url, prefix, env_for(proc_env), **options))
        return started[-1]

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def readonly(open_dashboard: Callable[..., Dashboard]) -> Dashboard:
    """The dashboard without actions (the default)."""
    return open_dashboard()


@pytest.fixture
def actions(open_dashboard: Callable[..., Dashboard]) -> Dashboard:
    """The dashboard with actions on, behind :data:`TOKEN`."""
    return open_dashboard(actions=True)


@pytest.fixture
def dashboard(backend: Backend, mq: EchoMQ, proc_env: dict[str, str]) -> Iterator[Dashboard]:
    """The dashboard process on the test's server: standalone, or the 3-master Cluster."""
    url = backend.url.replace("redis://", "redis+cluster://") if backend.cluster else backend.url
    d = Dashboard(url, mq.keys.prefix, env_for(proc_env))
    yield d
    d.stop()
