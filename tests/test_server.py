"""Tests for echomq_core.server against real server processes (no fakes, no mocks)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from echomq_core.server import EmbeddedServer, ServerStartError, free_port

from .clusterkit import CLUSTER_SLOTS, EmbeddedCluster
from .serverkit import kill, restart
from .waiting import eventually


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(masters=3) as c:
        yield c


def _owners_from_cluster_nodes(url: str) -> dict[int, list[tuple[int, int]]]:
    """port -> slot ranges, parsed by hand from a node's raw CLUSTER NODES reply."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        raw = client.execute_command("CLUSTER", "NODES")  # "CLUSTER" alone: no parse callback
    finally:
        client.close()
    owners: dict[int, list[tuple[int, int]]] = {}
    for line in str(raw).splitlines():
        fields = line.split()
        port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        ranges = []
        for spec in fields[8:]:
            first, _, last = spec.partition("-")
            ranges.append((int(first), int(last or first)))
        owners[port] = ranges
    return owners


def test_free_port_respects_max_port() -> None:
    for _ in range(20):
        port = free_port(max_port=40000)
        assert 0 < port <= 40000


def test_standalone_start_ping_stop() -> None:
    server = EmbeddedServer()
    assert not server.is_running() and server.pid is None
    with server:
        assert server.url == f"redis://127.0.0.1:{server.port}"
        assert server.is_running()
        pid = server.pid
        assert pid is not None and _alive(pid)
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        assert client.info("server")["process_id"] == pid
        client.close()
        assert server.log_path.exists()
    assert not server.is_running() and server.pid is None
    assert not _alive(pid)
    assert not server.data_dir.exists()  # temporary data_dir is removed on stop()


def test_kill_and_restart_keeps_aof_data() -> None:
    server = EmbeddedServer(appendonly=True, appendfsync="always").start()
    try:
        port, pid = server.port, server.pid
        assert pid is not None
        client = redis.Redis.from_url(server.url)
        client.set("job:1", "payload")
        client.close()
        kill(server)
        assert not server.is_running() and not _alive(pid)
        assert server.data_dir.exists()  # kept for restart()
        restart(server)
        assert server.port == port and server.pid not in (None, pid)
        client = redis.Redis.from_url(server.url)
        assert client.get("job:1") == b"payload"
        client.close()
    finally:
        server.stop()
    assert not server.data_dir.exists()


def test_stop_is_idempotent_and_leaves_no_process() -> None:
    server = EmbeddedServer().start()
    pid = server.pid
    assert pid is not None
    server.stop()
    server.stop()
    assert not _alive(pid)
    assert not server.is_running()
    kill(server)  # also a no-op once stopped


def test_start_on_port_held_by_another_server_raises() -> None:
    with EmbeddedServer() as first:
        second = EmbeddedServer(port=first.port)
        with pytest.raises(ServerStartError, match="in use"):
            second.start(timeout=5)
        assert not second.is_running()
        second.stop()
        assert redis.Redis.from_url(first.url).ping()  # the first server is unharmed


def test_start_on_port_held_by_plain_socket_raises() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        server = EmbeddedServer(port=holder.getsockname()[1])
        with pytest.raises(ServerStartError) as info:
            server.start(timeout=5)
        assert str(server.log_path) in str(info.value)
        server.stop()


def test_bad_flag_reports_log_tail() -> None:
    server = EmbeddedServer(extra_args=["--no-such-option", "1"])
    with pytest.raises(ServerStartError, match=r"(?i)no-such-option"):
        server.start(timeout=5)
    server.stop()


def test_cluster_forms_and_routes_keys(cluster: EmbeddedCluster) -> None:
    assert len(cluster.servers) == 3
    assert cluster.url == cluster.urls[0]
    for server in cluster.servers:
        info = redis.Redis.from_url(server.url).cluster("INFO")
        assert info["cluster_state"] == "ok"
        assert int(info["cluster_known_nodes"]) == 3
        assert int(info["cluster_slots_assigned"]) == CLUSTER_SLOTS

    # Find one hash tag per node so the cluster client must talk to all three.
    keys: dict[int, str] = {}
    tag = 0
    while len(keys) < 3:
        key = f"{{job:{tag}}}:payload"
        keys.setdefault(cluster.server_for_key(key).port, key)
        tag += 1

    rc = RedisCluster.from_url(cluster.url)
    try:
        for key in keys.values():
            rc.set(key, key)
        for key in keys.values():
            assert rc.get(key) == key.encode()
    finally:
        rc.close()

    owners = _owners_from_cluster_nodes(cluster.url)
    for port, key in keys.items():
        slot = key_slot(key.encode())
        direct = redis.Redis.from_url(cluster.url)
        assert direct.execute_command("CLUSTER", "KEYSLOT", key) == slot
        direct.close()
        assert any(a <= slot <= b for a, b in owners[port])
        # The owning node serves the key directly, without a MOVED redirect.
        owner = redis.Redis(port=port)
        assert owner.get(key) == key.encode()
        owner.close()
        assert cluster.server_for_key(key.encode()).port == port
        assert cluster.server_for_slot(slot).port == port


def test_cluster_node_kill_and_restart_rejoins(cluster: EmbeddedCluster) -> None:
    node = cluster.servers[1]
    key = next(k for k in (f"{{r{i}}}" for i in range(10_000)) if cluster.server_for_key(k) is node)
    rc = RedisCluster.from_url(cluster.url)
    try:
        rc.set(key, "before")
    finally:
        rc.close()
    kill(node)
    restart(node)  # same port, nodes.conf kept: rejoins with its id and slots
    client = redis.Redis.from_url(node.url)
    eventually(
        lambda: client.cluster("INFO")["cluster_state"] == "ok",
        15,
        "the restarted node to rejoin",
        every=0.05,
    )
    client.close()
    assert cluster.server_for_key(key) is node
    rc = RedisCluster.from_url(cluster.url)
    try:
        rc.set(key, "after")
        assert rc.get(key) == b"after"
    finally:
        rc.close()


def test_cluster_stop_leaves_no_process() -> None:
    c = EmbeddedCluster(masters=1).start()
    pids = [s.pid for s in c.servers]
    assert all(pid is not None and _alive(pid) for pid in pids)
    c.stop()
    c.stop()
    assert not any(pid is not None and _alive(pid) for pid in pids)
    assert not c.data_dir.exists()
