"""Chaos for a flow's concurrency cap: a 600-child flow capped at ``max_running=8`` while a
driver SIGKILLs a random worker or Pump process every 0.2-0.5 s and starts a replacement.

Three worker processes (concurrency 6 each: 18 slots, over twice the cap) and one Pump
process, 1 s leases, so a killed worker's leases expire and are recovered while the run goes
on - a recovered child keeps its token (back to pending), so it never lets a ninth start. A
sampler reads ``ZCARD active`` of the child queue on its own server every few milliseconds for
the whole run. Afterwards:

* the largest sample is at most 8, and the gate is idle (nothing admitted, nothing waiting);
* the parent ran on exactly the 600 results (none lost, none doubled: the raw counter is 0);
* nothing is leased, pending, retrying, dead or poisoned.

On standalone and on the Cluster (parent and children on different masters).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import redis

from echomq_core import Child

from ..conftest import Backend
from ..waiting import eventually
from .harness import Fleet, Killer
from .test_cluster_chaos import drained, no_leftovers, parent_runs

pytestmark = [pytest.mark.slow]

N, CAP = 600, 8
CONFIG = {"concurrency": 6, "max_batch": 6, "lease": 1.0, "pump_lease": 1.0, "max_stalls": 50}


class Sampler(threading.Thread):
    """``ZCARD active`` of one queue on its own server, as fast as it answers, until stopped."""

    def __init__(self, backend: Backend, queue: str, key: str) -> None:
        super().__init__(daemon=True)
        server = backend.servers[backend.node_of_queue(queue)]
        self.r = redis.Redis(host=server.host, port=server.port)
        self.key = key
        self.samples: list[int] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append(int(self.r.zcard(self.key)))
            self._stop_event.wait(0.003)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)
        self.r.close()


def test_the_cap_holds_while_workers_and_pumps_are_killed(
    backend: Backend, prefix: str, proc_env: dict[str, str], tmp_path: Path
) -> None:
    parents, work = backend.queues_on_distinct_nodes(2, "capchaos")
    mq = backend.client(prefix)
    kids = [Child({"n": i, "pause": 15}, queue=work, max_attempts=3) for i in range(N)]
    ref = mq.add_flow(
        parents, kids, payload={"parent": True}, parent_id="JOB-capchaos", max_running=CAP
    )
    config = {
        "url": backend.url,
        "cluster": backend.cluster,
        "prefix": prefix,
        "queues": [parents, work],
        **CONFIG,
    }
    fleet = Fleet(config, proc_env, tmp_path, workers=3, pumps=1).start()
    # a Pump first, then a worker: CI once saw the only 2 kills before the flow ended both
    # pick a worker (3 of the 4 members are workers)
    killer = Killer(fleet, 0.2, 0.5, seed=5, first=("pump", "worker"))
    sampler = Sampler(backend, work, mq.keys.active(work))
    try:
        fleet.wait_ready()
        sampler.start()
        killer.start()

        def done() -> bool:
            assert killer.error is None, killer.error
            return mq.get_job(parents, ref.parent_id).state == "completed"

        eventually(done, 240, "the capped flow to finish", every=0.1)
        killer.stop()
        assert killer.error is None, killer.error
        drained(backend.client(prefix), [parents, work])
        fleet.stop()
    finally:
        sampler.stop()
        killer.stop()
        fleet.close()
    assert fleet.kills["worker"] > 0 and fleet.kills["pump"] > 0
    assert len(sampler.samples) > 100
    assert max(sampler.samples) <= CAP, max(sampler.samples)
    assert max(sampler.samples) == CAP, "the cap was reached (the fleet has more slots)"
    values = mq.children_values(parents, ref.parent_id)
    assert values == {f"JOB-capchaos.{i}": {"sq": i * i} for i in range(N)}
    assert mq.connection.client.get(mq.keys.dependencies(parents, ref.parent_id)) == b"0"
    runs = parent_runs(mq, prefix, ref.parent_id)
    assert runs and all(run[2] == N for run in runs)
    cap = mq.flow_cap(parents, ref.parent_id)
    assert cap is not None and (cap.cap, cap.admitted, cap.waiting) == (CAP, 0, 0)
    assert no_leftovers(mq, [parents, work]) == {"dead": 0, "poison": 0}
    mq.close()
