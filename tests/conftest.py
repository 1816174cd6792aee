"""Test fixtures: real servers started by the suite itself, standalone AND a 3-master Cluster.

``backend`` is parametrized like redis-py's own suite: every test that takes ``mq`` (or
``backend``) runs once per backend; ``@pytest.mark.onlycluster`` / ``onlystandalone`` narrow
it. Each test gets its own key prefix, so tests never see each other's keys and need no flush.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.crc import key_slot

from echomq_core import EchoMQ
from echomq_core.server import EmbeddedServer

from .clusterkit import EmbeddedCluster

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@dataclass
class Backend:
    name: str
    url: str
    cluster: bool
    servers: list[EmbeddedServer]
    handle: EmbeddedServer | EmbeddedCluster

    def client(self, prefix: str, **options: object) -> EchoMQ:
        return EchoMQ(self.url, cluster=self.cluster, prefix=prefix, **options)  # type: ignore[arg-type]

    def node_of_queue(self, queue: str) -> int:
        """Index of the server that owns ``queue``'s slot (0 on standalone)."""
        if not isinstance(self.handle, EmbeddedCluster):
            return 0
        owner = self.handle.server_for_slot(key_slot(f"{{{queue}}}".encode()))
        return self.servers.index(owner)

    def queues_on_distinct_nodes(self, count: int, stem: str = "q") -> list[str]:
        """``count`` queue names; on a Cluster each lives on a different node."""
        if not self.cluster:
            return [f"{stem}{i}" for i in range(count)]
        found: dict[int, str] = {}
        i = 0
        while len(found) < count:
            name = f"{stem}{i}"
            found.setdefault(self.node_of_queue(name), name)
            i += 1
        return list(found.values())[:count]


@pytest.fixture(scope="session")
def standalone_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def cluster_servers() -> Iterator[EmbeddedCluster]:
    cluster = EmbeddedCluster(3).start()
    yield cluster
    cluster.stop()


#: Test files that run an orchestrator as users deploy it (Airflow's components as processes,
#: ``dagster dev``, the production stacks, the W7 bench's deployment): each of their tests
#: carries the ``deployment`` marker, and ``scripts/test.sh`` runs them in a stream of their own
#: beside the rest of the suite (they spend most of their time waiting on the orchestrators'
#: loops, heartbeats and timeouts, not on the CPU).
DEPLOYMENTS = frozenset(
    {
        "test_deployment.py",
        "test_production.py",
        "test_stream_deployment.py",
        "test_first_deferral.py",
        "test_dagster_deployment.py",
        "test_dagster_dev_automation.py",
        "test_dagster_dev_checks.py",
        "test_dagster_dev_runs.py",
        "test_dagster_empty_plan.py",
        "test_dagster_production.py",
        "test_stream_dev.py",
        "test_bench_w7.py",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in DEPLOYMENTS:
            item.add_marker(pytest.mark.deployment)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        names = ["standalone", "cluster"]
        if metafunc.definition.get_closest_marker("onlycluster"):
            names = ["cluster"]
        if metafunc.definition.get_closest_marker("onlystandalone"):
            names = ["standalone"]
        metafunc.parametrize("backend", names, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "cluster":
        cluster: EmbeddedCluster = request.getfixturevalue("cluster_servers")
        return Backend("cluster", cluster.url, True, list(cluster.servers), cluster)
    server: EmbeddedServer = request.getfixturevalue("standalone_server")
    return Backend("standalone", server.url, False, [server], server)


@pytest.fixture
def prefix() -> str:
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def mq(backend: Backend, prefix: str) -> Iterator[EchoMQ]:
    client = backend.client(prefix)
    yield client
    client.close()


@pytest.fixture
def proc_env() -> dict[str, str]:
    """Environment for child processes (workers, pumps) that import this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture(scope="session")
def replica_cluster() -> Iterator[EmbeddedCluster]:
    """3 masters with 1 replica each, AOF on, cluster-node-timeout 2 s: for the failover and
    reshard tests (tests/chaos/test_cluster_topology.py), which leave it healthy."""
    cluster = EmbeddedCluster(3, replicas=1, node_timeout_ms=2000, appendonly=True).start()
    yield cluster
    cluster.stop()
