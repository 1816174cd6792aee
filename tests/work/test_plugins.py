"""Plugins: lifecycle hooks fire once per occurrence, from the worker and the Pump; handlers are
discovered; a raising plugin is logged and changes nothing else.

The entry-point test uses the distribution in ``tests/plugin_pkg`` without installing it: a
``*.dist-info`` directory holding its METADATA and entry_points.txt (generated from its
pyproject.toml) is put on the child processes' sys.path, where importlib.metadata finds it
exactly as it finds an installed distribution. Nothing touches the venv, no network needed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from echomq_core import Child, ConfigurationError, EchoMQ, Job, Pump, Worker
from echomq_core.hooks import ENTRY_POINT_GROUP, Hooks, hookimpl, plugin_manager
from echomq_core.server import EmbeddedServer

from ..waiting import eventually

PLUGIN_PKG = Path(__file__).resolve().parent.parent / "plugin_pkg"
CLI = [sys.executable, "-m", "echomq_core.cli"]


def write_dist_info(
    site: Path,
    entry_points: dict[str, str],
    name: str = "echomq-test-plugin",
    version: str = "0.1.0",
) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [f"[{ENTRY_POINT_GROUP}]", *(f"{k} = {v}" for k, v in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture
def plugin_env(tmp_path: Path, proc_env: dict[str, str]) -> dict[str, str]:
    """Child-process environment in which the test plugin distribution is discoverable."""
    meta = tomllib.loads((PLUGIN_PKG / "pyproject.toml").read_text())
    site = tmp_path / "site"
    write_dist_info(
        site,
        meta["project"]["entry-points"][ENTRY_POINT_GROUP],
        meta["project"]["name"],
        meta["project"]["version"],
    )
    env = dict(proc_env)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(PLUGIN_PKG), env["PYTHONPATH"]])
    env["ECHOMQ_TEST_PLUGIN_LOG"] = str(tmp_path / "events.jsonl")
    env.pop("ECHOMQ_URL", None)
    return env


def read_events(env: dict[str, str]) -> list[dict[str, Any]]:
    path = Path(env["ECHOMQ_TEST_PLUGIN_LOG"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def key(event: dict[str, Any]) -> tuple[str, str, str]:
    return (event["event"], event["queue"], event.get("id") or event.get("reason", ""))


def test_entry_point_plugin_receives_each_event_once(
    standalone_server: EmbeddedServer, prefix: str, plugin_env: dict[str, str]
) -> None:
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    # A: cross-queue, released by the Pump; its ignore-dependency child dies.
    a = mq.add_flow(
        "plug-parents",
        [
            *(Child({"n": i}, queue="plug-work") for i in range(4)),
            Child({"fail": True}, queue="plug-work", ignore_dependency_on_failure=True),
        ],
    )
    # B: cross-queue, failed by its fail-parent child.
    b = mq.add_flow(
        "plug-parents",
        [Child({"n": 10}, queue="plug-work"), Child({"fail": True}, queue="plug-work")],
    )
    # C: same-queue, released by the worker itself.
    c = mq.add_flow("plug-work", [Child({"n": 20 + i}) for i in range(3)], payload={"n": 0})
    # A malformed signal at the head of plug-work's outbox: the Pump poisons it.
    mq.connection.client.rpush(mq.keys.outbox("plug-work"), b"not a signal")
    expected = {
        *(("job_completed", "plug-work", f"{a.parent_id}.{i}") for i in range(4)),
        ("job_completed", "plug-parents", a.parent_id),
        ("job_completed", "plug-work", f"{b.parent_id}.0"),
        *(("job_completed", "plug-work", f"{c.parent_id}.{i}") for i in range(3)),
        ("job_completed", "plug-work", c.parent_id),
        ("job_dead", "plug-work", f"{a.parent_id}.4"),
        ("job_dead", "plug-work", f"{b.parent_id}.1"),
        ("flow_released", "plug-parents", a.parent_id),
        ("flow_released", "plug-work", c.parent_id),
        ("flow_failed", "plug-parents", b.parent_id),
        ("signal_poisoned", "plug-work", "malformed signal: expected 5 fields"),
    }
    conn = ["--url", standalone_server.url, "--prefix", prefix]
    # Handlers come from the plugin (no --app): echomq_handlers is discovered too.
    worker = subprocess.Popen(
        [*CLI, "worker", "plug-work", "plug-parents", "--concurrency", "2", "--no-pump", *conn],
        env=plugin_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pump = subprocess.Popen(
        [
            *CLI,
            "pump",
            "plug-work",
            "plug-parents",
            "--max-tries",
            "2",
            "--interval",
            "0.02",
            *conn,
        ],
        env=plugin_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def all_seen() -> bool:
            if not {key(e) for e in read_events(plugin_env)} < expected:
                return True
            assert worker.poll() is None and pump.poll() is None, "a process died"
            return False

        eventually(
            all_seen,
            30,
            lambda: sorted(expected - {key(e) for e in read_events(plugin_env)}),
            every=0.1,
        )
        time.sleep(0.5)  # room for a duplicate to show up
    finally:
        for proc in (worker, pump):
            proc.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=20) for proc in (worker, pump)]
    assert (worker.returncode, pump.returncode) == (0, 0), outputs
    events = read_events(plugin_env)
    counts = Counter(key(e) for e in events)
    assert set(counts) == expected
    assert all(n == 1 for n in counts.values()), [k for k, n in counts.items() if n > 1]
    by_key = {key(e): e for e in events}
    # where each fired: same-queue release in the worker, cross-queue ones in the Pump
    assert by_key[("flow_released", "plug-work", c.parent_id)]["pid"] == worker.pid
    assert by_key[("flow_released", "plug-parents", a.parent_id)]["pid"] == pump.pid
    assert by_key[("flow_failed", "plug-parents", b.parent_id)]["pid"] == pump.pid
    assert by_key[("flow_released", "plug-parents", a.parent_id)]["outstanding"] == 0
    assert by_key[("job_completed", "plug-parents", a.parent_id)]["result"] == 4
    assert by_key[("job_completed", "plug-work", f"{b.parent_id}.0")]["result"] == {"double": 20}
    assert (
        "Unrecoverable: told to fail"
        in by_key[("job_dead", "plug-work", f"{b.parent_id}.1")]["error"]
    )
    # the exploding plugin was loaded, raised, was logged - and broke nothing
    worker_err, pump_err = outputs[0][1], outputs[1][1]
    assert "plugins: exploder, recorder" in worker_err
    assert "'exploder' raised in echomq_job_completed; ignored" in worker_err
    assert "'exploder' raised in echomq_signal_poisoned; ignored" in pump_err
    assert mq.snapshot(b.queue, b.parent_id).parent_state == "failed"
    mq.close()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()

    def add(self, *event: str) -> None:
        with self.lock:
            self.events.append(event)  # type: ignore[arg-type]

    @hookimpl
    def echomq_job_completed(self, job: Job, result: Any) -> None:
        self.add("job_completed", job.id, json.dumps(result))

    @hookimpl
    def echomq_job_dead(self, job: Job, error: str) -> None:
        self.add("job_dead", job.id, error)

    @hookimpl
    def echomq_flow_released(self, queue: str, parent_id: str) -> None:
        self.add("flow_released", queue, parent_id)

    @hookimpl
    def echomq_flow_failed(self, queue: str, parent_id: str) -> None:
        self.add("flow_failed", queue, parent_id)


class Raiser:
    @hookimpl(tryfirst=True)
    def echomq_flow_released(self) -> None:
        raise RuntimeError("raiser")

    @hookimpl(tryfirst=True)
    def echomq_job_completed(self) -> None:
        raise RuntimeError("raiser")


def test_plugins_registered_in_code(mq: EchoMQ, caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    hooks = Hooks(plugin_manager(recorder, Raiser(), entry_points=False), client=mq)
    flow = mq.add_flow("parents", [Child(i, queue="kids") for i in range(20)])
    local = mq.add_flow("kids", [Child(i) for i in range(3)], parent_id="JOB-local")
    handlers = {"kids": lambda job: job.payload, "parents": lambda job: "done"}
    caplog.set_level(logging.ERROR, logger="echomq_core.hooks")
    worker = Worker(mq, handlers, concurrency=2, hooks=hooks).start()
    pump = Pump(mq, ["kids", "parents"], hooks=hooks).start()
    try:
        mq.wait(flow.queue, flow.parent_id, timeout=20, poll=0.05)
        eventually(  # both parents ran: the cross-queue one and the local one
            lambda: all(
                mq.get_job(queue, pid).state == "completed"
                for queue, pid in ((flow.queue, flow.parent_id), (local.queue, local.parent_id))
            ),
            20,
            "both parents' completion",
            every=0.05,
        )
    finally:
        worker.stop()
        pump.stop()
    counts = Counter(recorder.events)
    assert all(n == 1 for n in counts.values())
    kinds = Counter(e[0] for e in recorder.events)
    # 20 + 3 children, the local parent, the cross-queue parent
    assert kinds == {"job_completed": 25, "flow_released": 2}
    assert ("flow_released", "parents", flow.parent_id) in counts
    assert ("flow_released", "kids", local.parent_id) in counts
    assert ("job_completed", flow.parent_id, '"done"') in counts
    assert any("raised in echomq_flow_released" in r.getMessage() for r in caplog.records)
    assert worker.completed == 25


def test_handler_discovery_refuses_conflicts_and_bad_plugins() -> None:
    class One:
        @hookimpl
        def echomq_handlers(self) -> dict[str, Any]:
            return {"q": print}

    class Two:
        @hookimpl
        def echomq_handlers(self) -> dict[str, Any]:
            return {"q": print, "r": print}

    class NotAMapping:
        @hookimpl
        def echomq_handlers(self) -> Any:
            return [print]

    class Typo:
        @hookimpl
        def echomq_job_complete(self) -> None: ...

    assert Hooks(plugin_manager(One(), entry_points=False)).handlers() == {"q": print}
    with pytest.raises(ConfigurationError, match="has handlers from plugins"):
        Hooks(plugin_manager(One(), Two(), entry_points=False)).handlers()
    with pytest.raises(ConfigurationError, match="not a mapping"):
        Hooks(plugin_manager(NotAMapping(), entry_points=False)).handlers()
    with pytest.raises(ConfigurationError, match="echomq_job_complete"):
        plugin_manager(Typo(), entry_points=False)


def test_worker_cli_reports_broken_and_missing_plugins(
    standalone_server: EmbeddedServer, prefix: str, tmp_path: Path, proc_env: dict[str, str]
) -> None:
    site = tmp_path / "broken-site"
    write_dist_info(site, {"broken": "no_such_module_for_echomq"}, name="echomq-broken")
    env = {**proc_env, "PYTHONPATH": os.pathsep.join([str(site), proc_env["PYTHONPATH"]])}
    conn = ["--url", standalone_server.url, "--prefix", prefix]
    procs = [
        subprocess.Popen(
            [*CLI, *args, *conn], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for args in (
            ["worker"],
            ["pump"],
            ["worker", "--no-plugins"],
            ["pump", "--no-plugins", "--plugin", "no_such_plugin_module"],
        )
    ]
    results = [(p.wait(30), p.communicate()[1]) for p in procs]
    for status, err in results[:2]:
        assert status == 2, err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "echomq plugin 'broken' (no_such_module_for_echomq) failed to load" in err
    status, err = results[2]
    assert status == 2 and err.count("\n") == 1
    assert "no handlers" in err
    status, err = results[3]
    assert status == 2 and err.count("\n") == 1
    assert "--plugin 'no_such_plugin_module' cannot be imported" in err


def test_the_pump_reports_the_jobs_it_buries(mq: EchoMQ) -> None:
    """A job whose lease expires more than ``max_stalls`` times dies in the Pump's recovery,
    not in a worker: the Pump fires job_dead for it, with the job as it was (payload, parent)."""
    recorder = Recorder()
    hooks = Hooks(plugin_manager(recorder, entry_points=False), client=mq)
    plain = mq.queue("bury").add({"n": 1})
    flow = mq.add_flow("bury", [Child("kid", ignore_dependency_on_failure=True)])
    q = mq.queue("bury")
    claimed = q.claim(2, lease=0.05)  # and never completed: the worker "died"
    assert {j.id for j in claimed} == {plain, f"{flow.parent_id}.0"}
    time.sleep(0.1)
    seen: dict[str, Job] = {}

    class Jobs:
        def job_dead(self, *, job: Job, error: str) -> None:
            seen[job.id] = job
            hooks.job_dead(job=job, error=error)

    pump = Pump(mq, ["bury"], max_stalls=0, hooks=Jobs())
    stats = pump.tick()
    assert stats.buried == 2 and pump.totals.buried == 2
    assert sorted(recorder.events) == sorted(
        [
            ("job_dead", plain, "lease expired 1 times"),
            ("job_dead", f"{flow.parent_id}.0", "lease expired 1 times"),
        ]
    )
    assert seen[plain].payload == {"n": 1} and seen[plain].token == ""
    kid = seen[f"{flow.parent_id}.0"]
    assert kid.payload == "kid" and kid.parent is not None
    assert (kid.parent.id, kid.parent.policy) == (flow.parent_id, "id")
    pump.tick()  # the ignored child's signal settles the parent: the flow goes on
    assert mq.ignored_failures("bury", flow.parent_id) == {
        f"{flow.parent_id}.0": "lease expired 1 times"
    }
