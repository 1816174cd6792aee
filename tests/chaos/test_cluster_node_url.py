"""A standalone URL (``redis://``) that names a node of a Redis Cluster (issue 48, item B).

The node serves the slots it owns and answers ``MOVED`` for every other key. A standalone
client does not follow it - the whole slot map is the Cluster client's job - so the call fails;
it must fail with a :class:`~echomq_core.errors.ConfigurationError` that says the URL names a
Cluster node and how to connect to one, not with a ``ServerError`` carrying the bare text of the
redirect (``"13647 127.0.0.1:39083"``), which read as a stale slot map that was not followed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from echomq_core import AsyncEchoMQ, Child, EchoMQ
from echomq_core.errors import ConfigurationError
from echomq_core.wire.slots import key_slot

from ..clusterkit import EmbeddedCluster

pytestmark = pytest.mark.slow


def _queue_elsewhere(cluster: EmbeddedCluster, mq: EchoMQ | AsyncEchoMQ) -> str:
    """A queue whose slot another master than the URL's node (``servers[0]``) owns."""
    seed = cluster.servers[0]
    for i in range(100):
        name = f"cn{i}"
        if cluster.server_for_slot(key_slot(mq.keys.pending(name).encode())) is not seed:
            return name
    raise AssertionError("no queue found on another master")


def _says_cluster_node(exc: pytest.ExceptionInfo[ConfigurationError], url: str) -> None:
    text = str(exc.value)
    assert "Redis Cluster node" in text and "MOVED" in text, text
    assert "redis+cluster://" in text and "cluster=True" in text, text
    assert url.split("//")[1] in text, text  # the node the URL named


def test_a_standalone_url_of_a_cluster_node_is_a_configuration_error(
    cluster_servers: EmbeddedCluster, prefix: str
) -> None:
    """Sync: a queue another master serves raises ConfigurationError (today: ServerError)
    from ``queue.add`` and ``add_flow``; none of its jobs was written."""
    url = cluster_servers.servers[0].url
    mq = EchoMQ(url, prefix=prefix)
    try:
        assert not mq.connection.is_cluster
        elsewhere = _queue_elsewhere(cluster_servers, mq)
        with pytest.raises(ConfigurationError) as add:
            mq.queue(elsewhere).add(1)
        _says_cluster_node(add, url)
        with pytest.raises(ConfigurationError) as flow:
            mq.add_flow(elsewhere, [Child(i, queue=elsewhere) for i in range(3)])
        _says_cluster_node(flow, url)
    finally:
        mq.close()
    right = EchoMQ(url, prefix=prefix, cluster=True)  # what the message says to do
    try:
        assert right.queue(elsewhere).stats()["pending"] == 0  # nothing of the refused adds
    finally:
        right.close()


def test_a_standalone_url_of_a_cluster_node_is_a_configuration_error_async(
    cluster_servers: EmbeddedCluster, prefix: str
) -> None:
    """asyncio: the same error from the asyncio client."""
    url = cluster_servers.servers[0].url

    async def main() -> None:
        mq = AsyncEchoMQ(url, prefix=prefix)
        try:
            elsewhere = _queue_elsewhere(cluster_servers, mq)
            with pytest.raises(ConfigurationError) as add:
                await mq.queue(elsewhere).add(1)
            _says_cluster_node(add, url)
        finally:
            await mq.close()

    asyncio.run(main())


def test_echomq_worker_on_a_standalone_url_of_a_cluster_node_says_so(
    cluster_servers: EmbeddedCluster, prefix: str, proc_env: dict[str, str], tmp_path: Path
) -> None:
    """``echomq worker --url redis://<a Cluster node>`` for queues on every master exits 2 at
    once with the ConfigurationError's message (today: exit 1, ``echomq: error: 7450
    127.0.0.1:39423``, the bare redirect)."""
    (tmp_path / "cn_app.py").write_text(
        "HANDLERS = {f'cn{i}': (lambda job: job.payload) for i in range(6)}\n"
    )
    url = cluster_servers.servers[0].url
    done = subprocess.run(
        [sys.executable, "-m", "echomq_core.cli", "worker", "--url", url, "--prefix", prefix,
         "--app", "cn_app:HANDLERS", "--wait-for-server", "5"],
        env=proc_env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "is a Redis Cluster node" in done.stderr and "redis+cluster://" in done.stderr
