"""The fault suites' shared fixtures: the Cluster with replicas, checked healthy around each
test, and the topology runs' flows, closed after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..clusterkit import EmbeddedCluster
from .topology import Flow


@pytest.fixture
def cluster(replica_cluster: EmbeddedCluster) -> Iterator[EmbeddedCluster]:
    """The session's Cluster with replicas, healthy before the test and again after it."""
    replica_cluster.wait_healthy(60)  # whatever the test before did
    yield replica_cluster
    for server in replica_cluster.servers:  # a failed test must not leave a node down
        if not server.is_running():
            server.start()
    replica_cluster.wait_healthy(90)


@pytest.fixture
def flows() -> Iterator[list[Flow]]:
    """The topology runs' flows: each closed (its fleet killed, its clients closed) after."""
    made: list[Flow] = []
    yield made
    for flow in made:
        flow.close()
