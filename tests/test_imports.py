"""What importing EchoMQ loads, and what the package exports. That the core's layers run one
way - no module imports another that imports it back, directly or round, type-only and
in-function imports included - is import-linter's to check (``lint-imports`` in .ci/run: the
contracts in pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echomq_core.wire.slots import key_slot

from .conftest import Backend

CORE = Path(__file__).resolve().parent.parent / "echomq_core"
ROOT = CORE.parent


def _fresh_env() -> dict[str, str]:
    """This checkout and its two adapters first on the path of a fresh interpreter."""
    paths = [str(ROOT), str(ROOT / "airflow_provider"), str(ROOT / "dagster_integration")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, *sys.path]))


def test_the_package_exports_its_public_api() -> None:
    """``__all__`` is what ``from echomq_core import *`` gives; every name in it resolves; every
    error of the Errors table (docs/troubleshooting.md) is among them, and every error class
    of echomq_core/errors.py is in that table."""
    import re

    import echomq_core

    assert sorted(echomq_core.__all__) == echomq_core.__all__
    star: dict[str, object] = {}
    exec("from echomq_core import *", star)
    assert sorted(k for k in star if k != "__builtins__") == echomq_core.__all__
    page = (CORE.parent / "docs" / "troubleshooting.md").read_text()
    table = page.split("\n## Errors", 1)[1].split("\n## ", 1)[0]
    errors = re.findall(r"^\| `([A-Za-z]+)` \|", table, re.MULTILINE)
    assert "ServerStartError" in errors
    assert set(errors) <= set(echomq_core.__all__), set(errors) - set(echomq_core.__all__)
    defined = re.findall(r"^class (\w+)\(", (CORE / "errors.py").read_text(), re.MULTILINE)
    assert set(defined) <= set(errors), f"not in the Errors table: {set(defined) - set(errors)}"


def fresh_modules(code: str) -> set[str]:
    """The modules loaded after ``code`` in a fresh interpreter (this checkout first)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CORE.parent), *sys.path]))
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_a_synchronous_user_does_not_load_the_asyncio_side() -> None:
    """``import echomq_core`` and the synchronous names (an Airflow task, a Dagster step) leave
    the asyncio queue and worker unloaded; ``redis.asyncio`` only if ``redis`` itself loads it
    (redis 8's ``__init__`` does: the floor is not ours)."""
    sync = fresh_modules("from echomq_core import EchoMQ, Pump, Queue, Worker")
    assert "echomq_core.work.worker" in sync and "echomq_core.client.clients" in sync
    loaded = {m for m in sync if m.startswith("echomq_core.async")}
    assert not loaded, loaded
    if "redis.asyncio" not in fresh_modules("import redis"):
        assert "redis.asyncio" not in sync
    lazy = fresh_modules(
        "import echomq_core\nassert 'AsyncWorker' in dir(echomq_core)\n"
        "from echomq_core import AsyncQueue, AsyncWorker"
    )
    assert {"echomq_core.client.async_queue", "echomq_core.work.async_worker"} <= lazy


def test_the_lazy_names_resolve_to_their_classes() -> None:
    import echomq_core
    from echomq_core.client.async_queue import AsyncQueue
    from echomq_core.work.async_worker import AsyncWorker

    assert echomq_core.AsyncQueue is AsyncQueue and echomq_core.AsyncWorker is AsyncWorker
    try:
        echomq_core.NoSuchName  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as e:
        assert "NoSuchName" in str(e)
    else:
        raise AssertionError("an unknown name resolved")


def test_defining_flows_does_not_import_redis(backend: Backend, prefix: str) -> None:
    """A process that only loads definitions - Airflow's DAG processor parsing a DAG file, a
    Dagster code server - imports the core, the Dagster integration and the provider's modules
    a DAG file imports (operator, sensor, decorator, results, trigger) without redis-py; the
    first client loads it, and that first connection works (sync and asyncio, standalone and
    Cluster)."""
    code = f"""
import asyncio, sys
import echomq_core, dagster_echomq
import echomq_provider.operators.echo_flow, echomq_provider.sensors.echo_flow
import echomq_provider.decorators.echo_flow, echomq_provider.results
import echomq_provider.triggers.echo_flow
from echomq_core import AsyncEchoMQ, Child, EchoMQ
from echomq_core.wire.connection import Call, parse_url
parse_url({backend.url!r}, cluster={backend.cluster!r})
loaded = sorted(m for m in sys.modules if m == "redis" or m.startswith("redis."))
assert not loaded, loaded
prefix = {prefix!r}
mq = EchoMQ({backend.url!r}, cluster={backend.cluster!r}, prefix=prefix)
ref = mq.add_flow("lazyq", [Child(1), Child(2)], parent_id="JOB-af/dag/task/0")
assert mq.dependencies(ref.queue, ref.parent_id) == 2, ref
mq.close()
async def main():
    amq = AsyncEchoMQ({backend.url!r}, cluster={backend.cluster!r}, prefix=prefix)
    assert await amq.dependencies("lazyq", "JOB-af/dag/task/0") == 2
    await amq.close()
asyncio.run(main())
print("connected")
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_fresh_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("connected"), done.stdout


def test_the_connection_module_resolves_its_lazy_names() -> None:
    """The names ``echomq_core.wire.connection`` re-exports from the redis-py side resolve to the
    same objects on first access; an unknown name is an AttributeError naming it."""
    from echomq_core.wire import cluster, connection, drivers

    assert connection.Connection is drivers.Connection
    assert connection.AsyncConnection is drivers.AsyncConnection
    assert connection.slot_of is cluster.slot_of
    assert connection.DURABLE_WAIT_MS == cluster.DURABLE_WAIT_MS
    assert {"Connection", "slot_of", "connect"} <= set(dir(connection))
    with pytest.raises(AttributeError, match="NoSuchName"):
        connection.NoSuchName  # type: ignore[attr-defined]  # noqa: B018


@given(st.binary(max_size=40) | st.text(max_size=20).map(lambda t: f"a{{{t}}}b".encode()))
def test_the_key_slot_is_the_servers(key: bytes) -> None:
    """Our CRC16 slot of a key is redis-py's (itself checked against the server's ``CLUSTER
    KEYSLOT`` below), hash tags included."""
    from redis.crc import key_slot as redis_key_slot

    assert key_slot(key) == redis_key_slot(key)


@pytest.mark.onlycluster
def test_the_key_slot_matches_cluster_keyslot(backend: Backend) -> None:
    import redis

    keys = ["emq:{q}:job:JOB-af/d/t/1", "plain", "{}x", "a{b}{c}", "{{x}}", "é{ü}"]
    client = redis.RedisCluster.from_url(backend.url)
    try:
        for key in keys:
            assert key_slot(key.encode()) == client.cluster_keyslot(key), key
    finally:
        client.close()


def test_the_command_line_help_does_not_import_redis() -> None:
    """``echomq --help`` (and a subcommand's) builds every parser without loading redis-py
    or the drivers."""
    for argv in (["--help"], ["worker", "--help"]):
        loaded = fresh_modules(
            f"from echomq_core.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n"
            "    pass"
        )
        assert "echomq_core.cli" in loaded
        assert not {"redis", "echomq_core.wire.drivers", "echomq_core.wire.replies"} & loaded, argv


def test_a_redis_error_is_told_apart_without_importing_redis() -> None:
    """``is_redis_error`` is false for anything while redis-py was never imported (nothing
    could have raised one then), and true for redis-py's errors once it is."""
    assert fresh_modules(
        "from echomq_core.errors import is_redis_error\n"
        "assert not is_redis_error(ConnectionError('x'))\n"
        "import sys\nassert 'redis' not in sys.modules"
    )
    import redis

    from echomq_core.errors import EchoMQError, is_redis_error

    assert is_redis_error(redis.ResponseError("ERR x")) and is_redis_error(redis.RedisError())
    assert not is_redis_error(OSError("x")) and not is_redis_error(EchoMQError("x"))


def test_the_cli_still_explains_a_redis_error_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A redis-py error that reaches ``main`` is an expected failure (one line, status 1),
    not an internal error, now that the CLI no longer names ``redis.RedisError`` itself."""
    import redis

    from echomq_core import cli

    def refused(args: object) -> object:
        raise redis.ResponseError("ERR refused by the server")

    monkeypatch.setattr(cli, "settle_global_options", refused)
    assert cli.main(["workers"]) == 1
    assert capsys.readouterr().err == "echomq: error: ResponseError: ERR refused by the server\n"
