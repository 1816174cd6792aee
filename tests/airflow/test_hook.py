"""EchoMQHook and its connection settings, against a real server.

Connections come from ``AIRFLOW_CONN_*`` variables (URI and JSON forms), read through the
Task SDK's own connection lookup, sync and async.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from echomq_provider.hooks.echomq import EchoMQHook
from echomq_provider.hooks.settings import EchoMQConnectionSettings

from echomq_core import Child, ConfigurationError, EchoMQ

pytestmark = pytest.mark.onlystandalone

SECRET = "s3cr3t-pa55"


def settings_from(monkeypatch: pytest.MonkeyPatch, value: str) -> EchoMQConnectionSettings:
    monkeypatch.setenv("AIRFLOW_CONN_ECHOMQ_TEST", value)
    return EchoMQHook("echomq_test").settings()


def test_settings_from_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings_from(
        monkeypatch,
        f"echomq://alice:{SECRET}@redis.example:6380/3?prefix=etl&tls=true&ssl_cert_reqs=none",
    )
    assert (s.host, s.port, s.db, s.username, s.prefix, s.tls, s.cluster) == (
        "redis.example",
        6380,
        3,
        "alice",
        "etl",
        True,
        False,
    )
    assert s.url == f"rediss://alice:{SECRET}@redis.example:6380/3"
    assert s.client_options() == {"ssl_cert_reqs": "none"}
    assert SECRET not in repr(s) and SECRET not in s.where


def test_settings_from_json_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings_from(
        monkeypatch,
        json.dumps(
            {
                "conn_type": "echomq",
                "host": "node1",
                "port": 7000,
                "password": "p@ss/word",
                "extra": {"cluster": True, "extra__echomq__prefix": "fan"},
            }
        ),
    )
    assert (s.cluster, s.prefix, s.db) == (True, "fan", 0)
    assert s.url == "redis+cluster://:p%40ss%2Fword@node1:7000"  # quoted; no db on a Cluster
    bare = settings_from(monkeypatch, "echomq://")
    assert (bare.host, bare.port, bare.prefix, bare.url) == (
        "127.0.0.1",
        6379,
        "emq",
        "redis://127.0.0.1:6379/0",
    )
    assert EchoMQHook("echomq_test", prefix="override").settings().prefix == "override"


@pytest.mark.parametrize(
    ("uri", "complaint"),
    [
        ("echomq://h?clustr=true", "unknown extra 'clustr'"),
        ("echomq://h?tls=maybe", "'tls' must be a boolean"),
        ("echomq://h/x", "must be a number"),
        ("echomq://h/2?cluster=true", "only database 0"),
        ("echomq://h?tls=1&ssl_cert_reqs=sometimes", "ssl_cert_reqs must be one of"),
    ],
)
def test_bad_connections_are_refused_by_name(
    uri: str, complaint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match=complaint):
        settings_from(monkeypatch, uri)


def test_sync_client_round_trip(
    standalone_server: Any,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_ECHOMQ_DEFAULT",
        f"echomq://{standalone_server.url.split('//')[1]}/0?prefix={prefix}",
    )
    hook = EchoMQHook()
    ref = hook.get_conn().add_flow("hq", [Child(1)], parent_id="JOB-hook-1")
    assert hook.get_conn() is hook.get_conn()  # cached
    assert hook.get_conn().dependencies(ref.queue, ref.parent_id) == 1
    hook.close()
    logged = capfd.readouterr().out  # Airflow's hook logger writes through structlog
    assert "'echomq_default'" in logged and prefix in logged
    ok, message = hook.test_connection()
    assert ok, message
    assert "1 queue(s)" in message  # the flow registered 'hq'


def test_password_never_shown(
    standalone_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # The server knows no user 'alice', so AUTH fails: the error path must not leak it either.
    monkeypatch.setenv(
        "AIRFLOW_CONN_ECHOMQ_DEFAULT",
        f"echomq://alice:{SECRET}@{standalone_server.url.split('//')[1]}/0",
    )
    hook = EchoMQHook()
    with caplog.at_level(logging.DEBUG):
        client = hook.get_conn()
        ok, message = hook.test_connection()
        trigger_client = asyncio.run(_async_repr(hook))
    assert not ok, message
    shown = [
        repr(hook),
        repr(hook.settings()),
        repr(client),
        str(client),
        trigger_client,
        message,
        caplog.text,
        capfd.readouterr().out,
    ]
    assert [text for text in shown if SECRET in text] == []
    hook.close()


async def _async_repr(hook: EchoMQHook) -> str:
    client = await hook.aget_conn()
    await client.close()
    return repr(client)


def test_async_client_from_async_connection_fetch(
    standalone_server: Any, prefix: str, echomq_conn: str
) -> None:
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        ref = mq.add_flow("aq", [Child(1), Child(2)], parent_id="JOB-hook-async")

    async def read() -> int:
        client = await EchoMQHook().aget_conn()
        try:
            return await client.dependencies(ref.queue, ref.parent_id)
        finally:
            await client.close()

    assert asyncio.run(read()) == 2
