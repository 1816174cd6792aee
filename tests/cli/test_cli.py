"""The ``echomq`` command, run as a subprocess against real servers.

Independent invocations run concurrently (each pays ~0.5 s of interpreter start-up), which
keeps this file well under a minute.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from echomq_core import Child, EchoMQ, Pump
from echomq_core.server import EmbeddedServer
from echomq_core.wire.keyspace import FLOW_INDEXES

from ..waiting import eventually

CLI = [sys.executable, "-m", "echomq_core.cli"]


@pytest.fixture
def env(proc_env: dict[str, str]) -> dict[str, str]:
    clean = dict(proc_env)
    for name in ("ECHOMQ_URL", "ECHOMQ_PREFIX"):
        clean.pop(name, None)
    return clean


def run_many(
    commands: Sequence[Sequence[str]],
    env: dict[str, str],
    *,
    cwd: Path | None = None,
    timeout: float = 60,
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``echomq`` command lines concurrently; their results in order."""
    procs = [
        subprocess.Popen(
            [*CLI, *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    out = []
    for args, proc in zip(commands, procs, strict=True):
        stdout, stderr = proc.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(list(args), proc.returncode, stdout, stderr))
    return out


def run(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return run_many([args], env, cwd=cwd, timeout=timeout)[0]


def assert_one_line_error(result: subprocess.CompletedProcess[str], status: int) -> None:
    assert result.returncode == status, (result.args, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[")]  # progress
    assert len(lines) == 1, (result.args, result.stderr)
    assert lines[0].startswith("echomq") and "error: " in lines[0], lines
    assert "Traceback" not in result.stderr


COMMANDS = [
    [],
    ["demo"],
    ["server"],
    ["worker"],
    ["pump"],
    ["flow", "show"],
    ["flow", "ls"],
    ["flow", "close"],
    ["queue", "stats"],
    ["queue", "config"],
    ["queue", "retry-dead"],
    ["poison", "list"],
    ["poison", "replay"],
]


def test_help_for_every_command(env: dict[str, str]) -> None:
    results = run_many([[*c, "--help"] for c in COMMANDS], env)
    for command, result in zip(COMMANDS, results, strict=True):
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: {' '.join(['echomq', *command])}")
        assert result.stderr == ""


def test_bad_command_lines(env: dict[str, str], standalone_server: EmbeddedServer) -> None:
    url = ["--url", standalone_server.url]
    bad = [
        [],
        ["nosuch"],
        ["demo", "--children", "0"],
        ["worker", "--concurrency", "0"],
        ["server", "--port", "-1"],
        ["flow", "show", "q"],
        ["flow", "show", "q", "not-a-job-id", *url],
        ["queue", "stats", "bad{q}", *url],
        ["worker", "--app", "no_such_module_xyz:handlers", *url],
    ]
    for result in run_many(bad, env):
        assert_one_line_error(result, 2)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung or firewalled server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


CONNECTING = [
    ["demo"],
    ["worker", "--wait-for-server", "0"],  # at once: no waiting for a server to come up
    ["pump", "--wait-for-server", "0"],
    ["flow", "show", "q", "JOB-1"],
    ["flow", "ls"],
    ["flow", "close", "q", "JOB-1"],
    ["queue", "stats"],
    ["queue", "config", "q"],
    ["poison", "list", "q"],
    ["poison", "replay", "q"],
]


def test_bad_and_unreachable_urls(env: dict[str, str], silent_port: int) -> None:
    bad_url = [[*c, "--url", "ftp://example.com"] for c in CONNECTING]
    refused = [[*c, "--url", "redis://127.0.0.1:1"] for c in CONNECTING[:-1]]
    silent = [
        [
            *CONNECTING[2],
            "--url",
            f"redis://127.0.0.1:{silent_port}",
            "--connect-timeout",
            "0.5",
        ]
    ]
    # a command that hangs or retries for ever fails by run_many's timeout (60 s each); no
    # bound on the total: 20 interpreters starting at once on a loaded machine took 42 s
    usage = run_many(bad_url, env)
    runtime = run_many([*refused, *silent], env)
    # the URL can come from the environment too
    runtime += run_many([CONNECTING[-1]], {**env, "ECHOMQ_URL": "redis://127.0.0.1:1"})
    for result in usage:
        assert_one_line_error(result, 2)
        assert "unsupported URL scheme 'ftp'" in result.stderr
    for result in runtime:
        assert_one_line_error(result, 1)
        assert "cannot reach 127.0.0.1:" in result.stderr


def test_demo_on_the_bundled_server(env: dict[str, str]) -> None:
    result = run("demo", "--children", "1000", "--json", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (
        report["children"],
        report["processed"],
        report["ignored"],
        report["failed"],
        report["dependencies"],
    ) == (1000, 999, 1, 0, 0)
    assert report["released"] is True and report["parent_state"] == "completed"
    assert report["server"] == "bundled" and report["seconds"] < 30
    assert list(report["ignored_failures"].values()) == ["RuntimeError: child 999 always fails"]


def test_demo_summary_on_a_given_server(
    env: dict[str, str], standalone_server: EmbeddedServer
) -> None:
    result = run("demo", "--children", "300", env={**env, "ECHOMQ_URL": standalone_server.url})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "children_values   299 results (e.g. .0 = 0, .1 = 1, .2 = 4)" in out
    assert "dependencies      0 outstanding" in out
    assert "ignored_failures  1 (.299: RuntimeError: child 299 always fails)" in out
    assert "settled as expected in" in out
    assert "[##############################] 300/300 settled (100%)" in result.stderr
    client = EchoMQ(standalone_server.url).connection.client
    assert list(client.scan_iter(match="demo-*")) == []  # the demo cleaned up after itself


def test_server_runs_in_the_foreground_and_persists(
    env: dict[str, str], tmp_path: Path, standalone_server: EmbeddedServer
) -> None:
    data = tmp_path / "data"

    def start(port: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [*CLI, "server", "--port", port, "--data-dir", str(data)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        return proc, proc.stdout.readline().strip()

    proc, url = start("0")
    try:
        assert url.startswith("redis://127.0.0.1:")
        with EchoMQ(url) as mq:
            mq.queue("kept").add({"x": 1}, job_id="JOB-kept")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "append-only file in" in err
    proc, again = start(url.rsplit(":", 1)[1])
    try:
        assert again == url
        with EchoMQ(url) as mq:
            assert mq.get_job("kept", "JOB-kept").payload == {"x": 1}  # from the AOF
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert proc.returncode == 0
    busy = run("server", "--port", str(standalone_server.port), "--no-persistence", env=env)
    assert_one_line_error(busy, 1)


APP = """
import time

def square(job):
    return job.payload * job.payload

def slow(job):
    open("slow.started", "w").close()  # the test signals the worker once the handler runs
    time.sleep(1.5)
    return "slow done"

HANDLERS = {"cli-kids": square, "cli-parents": lambda job: "parent ran", "cli-slow": slow}
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "cli_app.py").write_text(textwrap.dedent(APP))
    return tmp_path


def test_worker_pump_and_flow_watch(
    env: dict[str, str], standalone_server: EmbeddedServer, prefix: str, app_dir: Path
) -> None:
    conn = ["--url", standalone_server.url, "--prefix", prefix]
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    ref = mq.add_flow("cli-parents", [Child(i, queue="cli-kids") for i in range(50)])
    long_running = [
        subprocess.Popen(
            [*CLI, *args, *conn],
            env=env,
            cwd=app_dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in (
            [
                "worker",
                "cli-kids",
                "cli-parents",
                "--app",
                "cli_app:HANDLERS",
                "--concurrency",
                "2",
                "--no-pump",  # the Pump process below delivers
            ],
            ["pump"],
        )
    ]
    try:
        watched = run(
            "flow",
            "show",
            "cli-parents",
            ref.parent_id,
            "--watch",
            "--json",
            "--timeout",
            "30",
            "--interval",
            "0.1",
            *conn,
            env=env,
        )
        assert watched.returncode == 0, watched.stderr
        shown = json.loads(watched.stdout)
        assert (shown["total"], shown["processed"], shown["dependencies"]) == (50, 50, 0)
        assert shown["released"] is True and shown["subflows"] == []
        eventually(
            lambda: mq.get_job("cli-parents", ref.parent_id).state == "completed",
            20,
            "the parent's completion",
            every=0.05,
        )
        stats, table = run_many(
            [["queue", "stats", "cli-kids", "--json", *conn], ["queue", "stats", *conn]], env
        )
    finally:
        for proc in long_running:
            proc.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=30) for proc in long_running]
    assert [p.returncode for p in long_running] == [0, 0], outputs
    assert "worker: stopped (51 completed" in outputs[0][1]
    assert "pump: stopped (50 delivered" in outputs[1][1]
    counts = json.loads(stats.stdout)["cli-kids"]
    assert (counts["completed"], counts["pending"], counts["active"]) == (50, 0, 0)
    assert table.stdout.splitlines()[0].split()[:3] == ["queue", "pending", "active"]
    assert {line.split()[0] for line in table.stdout.splitlines()[1:]} == {
        "cli-kids",
        "cli-parents",
    }
    mq.close()


def test_worker_drains_on_sigterm(
    env: dict[str, str], standalone_server: EmbeddedServer, prefix: str, app_dir: Path
) -> None:
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    job_id = mq.queue("cli-slow").add("x")
    worker = subprocess.Popen(
        [
            *CLI,
            "worker",
            "cli-slow",
            "--app",
            "cli_app:HANDLERS",
            "--url",
            standalone_server.url,
            "--prefix",
            prefix,
        ],
        env=env,
        cwd=app_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # wait for the handler itself: a claimed job whose handler has not started yet is
        # given back on SIGTERM (by design), so "active" alone would make this test racy
        def started() -> bool:
            if (app_dir / "slow.started").exists():
                return True
            assert worker.poll() is None, "the worker exited"
            return False

        eventually(started, 20, "the handler to start")
    finally:
        worker.send_signal(signal.SIGTERM)  # mid-job: the handler is sleeping
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    info = mq.get_job("cli-slow", job_id)
    assert (info.state, info.result) == ("completed", "slow done")  # drained, not abandoned
    mq.close()


def test_flow_show_tree_and_failures(env: dict[str, str], mq_standalone: EchoMQ) -> None:
    mq = mq_standalone
    conn = ["--url", mq.url, "--prefix", mq.keys.prefix]
    root = mq.add_flow(
        "tree-root",
        [
            Child(1),
            Child(queue="tree-a", children=[Child(2), Child(3)]),
            Child(children=[Child(4, queue="tree-b")]),
            Child(queue="tree-a", id="JOB-explicit-sub", children=[Child(5)]),
        ],
    )
    pid = root.parent_id
    failing = mq.add_flow("fail-p", [Child(1), Child(2)])
    q = mq.queue("fail-p")
    (job, *_) = q.claim()
    q.fail(job, "broken on purpose", retry=False)
    held = mq.add_flow("held-p", [Child(1)])
    text, as_json, watched_fail, watched_held, missing = run_many(
        [
            ["flow", "show", "tree-root", pid, *conn],
            ["flow", "show", "tree-root", pid, "--json", *conn],
            ["flow", "show", "fail-p", failing.parent_id, "--watch", "--timeout", "10", *conn],
            ["flow", "show", "held-p", held.parent_id, "--watch", "--timeout", "0.3", *conn],
            ["flow", "show", "tree-root", "JOB-nope", *conn],
        ],
        env,
    )
    assert text.returncode == 0, text.stderr
    assert "  parent state  held\n  children      4\n  outstanding   4\n" in text.stdout
    assert f"|-- {pid}.1 [tree-a] held: 2 children, 2 outstanding" in text.stdout
    assert f"`-- {pid}.2 [tree-root] held: 1 child, 1 outstanding" in text.stdout
    assert "JOB-explicit-sub" not in text.stdout  # unsettled, explicit id: counted, not listed
    tree = json.loads(as_json.stdout)
    assert [s["parent_id"] for s in tree["subflows"]] == [f"{pid}.1", f"{pid}.2"]
    assert_one_line_error(watched_fail, 1)
    assert "parent state  failed" in watched_fail.stdout
    assert "broken on purpose" in watched_fail.stdout
    assert_one_line_error(watched_held, 1)
    assert "not released after 0.3s" in watched_held.stderr
    assert_one_line_error(missing, 1)
    assert "no flow JOB-nope" in missing.stderr
    # Once it settled, a sub-flow with an explicit id is found through the parent's records.
    a = mq.queue("tree-a")
    for _ in range(2):  # the leaves release their parents, then the parents complete
        a.complete_many([(j, 0) for j in a.claim(10)])
    Pump(mq, ["tree-a", "tree-root"]).tick()
    settled = run("flow", "show", "tree-root", pid, "--json", *conn, env=env)
    subs = {s["parent_id"]: s for s in json.loads(settled.stdout)["subflows"]}
    assert set(subs) == {f"{pid}.1", f"{pid}.2", "JOB-explicit-sub"}
    assert subs["JOB-explicit-sub"]["parent_state"] == "completed"


def test_queue_stats_and_poison(env: dict[str, str], mq_standalone: EchoMQ) -> None:
    mq = mq_standalone
    conn = ["--url", mq.url, "--prefix", mq.keys.prefix]
    mq.queue("st-q").add_bulk([1, 2, 3])
    outbox = mq.keys.outbox("st-q")
    mq.connection.client.rpush(outbox, b"garbage", b"c\nJOB-kid\nst-p\nJOB-gone\n42")
    pump = Pump(mq, ["st-q"], max_tries=1)
    assert pump.tick().poisoned == 1 and pump.tick().poisoned == 1
    stats, listed, as_json = run_many(
        [
            ["queue", "stats", "st-q", "--json", *conn],
            ["poison", "list", "st-q", *conn],
            ["poison", "list", "st-q", "--json", *conn],
        ],
        env,
    )
    assert json.loads(stats.stdout)["st-q"] == {
        "pending": 3,
        "active": 0,
        "delayed": 0,
        "dead": 0,
        "completed": 0,
        "outbox": 0,
        "poison": 2,
        "flows": dict.fromkeys(FLOW_INDEXES, 0),
        "flow_memory": {
            "available": True,
            "bytes": 0,
            "by_state": {s: {"sampled": 0, "bytes": 0} for s in FLOW_INDEXES},
        },
    }
    assert listed.stdout.splitlines() == [
        "malformed signal: expected 5 fields: 'garbage'",
        "parent JOB-gone does not exist in 'st-p': completed JOB-kid -> JOB-gone in 'st-p'",
    ]
    rows = json.loads(as_json.stdout)["poisoned"]
    assert rows[1] == {
        "reason": "parent JOB-gone does not exist in 'st-p'",
        "kind": "completed",
        "child": "JOB-kid",
        "parent_queue": "st-p",
        "parent": "JOB-gone",
        "value": "42",
    }
    replayed = run("poison", "replay", "st-q", *conn, env=env)
    assert replayed.stdout.strip() == "replayed 2 signal(s) of 'st-q' to its outbox"
    assert mq.queue("st-q").stats()["outbox"] == 2 and mq.queue("st-q").stats()["poison"] == 0


@pytest.fixture
def mq_standalone(standalone_server: EmbeddedServer, prefix: str) -> Iterator[EchoMQ]:
    client = EchoMQ(standalone_server.url, prefix=prefix)
    yield client
    client.close()
