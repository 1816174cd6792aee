"""A network partition between the server and a worker, and between the server and a Pump.

The partitioned process runs in a network namespace the test makes itself (``unshare -rn``:
no privileges, loopback only; see ``partition_proc.py``), talking TCP to the server over that
namespace's loopback, which the test takes down and up. Down, its packets are dropped and its
calls hang - no reset, no error -, as behind a real partition; up, TCP's retransmissions
get through and the process carries on with whatever it had sent.

* **A worker**: its handler is running when the partition starts (a gate file it waits on).
  Its lease expires; a worker on the server's side takes the job and completes it; when the
  partition heals, the partitioned worker's late completion is refused (its token is not the
  lease) and the flow holds each child's value once - the other worker's.
* **A Pump**: it holds the outbox lease of 20,000 completed children's signals when the
  partition starts. Its outbox lease expires, a Pump on the server's side delivers the rest;
  when the partition heals the first Pump's calls that were on their way run late, and the
  parent counts every child exactly once.

Both run with a plain child queue and with a 3-shard one (``shards``): the partitioned worker
serves every shard, the Pumps drain every shard's outbox (one outbox lease each).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from echomq_core import Child, EchoMQ, Job, Pump, Worker
from echomq_core.server import EmbeddedServer

from ..waiting import eventually

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=10
    )
    return probe.returncode == 0


if not _can_unshare():  # pragma: no cover - the CI image has both (util-linux, iproute2)
    pytest.fail("these tests need `unshare -rn` and `ip` (util-linux, iproute2)", pytrace=False)


class Partitioned:
    """A worker or Pump process in its own network namespace, and the switch of its link."""

    def __init__(self, cfg: dict[str, Any], env: dict[str, str], log: Path) -> None:
        self.control = cfg["control"]
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            ["unshare", "-rn", sys.executable, str(HERE / "partition_proc.py"), json.dumps(cfg)],
            stdout=subprocess.PIPE,
            stderr=self._out,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == b"ready", self.text()

    def switch(self, word: str) -> None:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(self.control)
            s.sendall(word.encode())
            assert s.recv(8) == b"ok\n"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._out.close()


_ACTIVE: set[int] = set()  # seconds in which a unix client was seen active (no tot-cmds)


def _unix_commands(raw: Any) -> int:
    """Commands run so far by the clients on the unix socket: the partitioned process's (its
    relay connects there; the test's own clients use TCP). ``tot-cmds`` where the server has it
    (7.2+, Valkey); else (Redis 7.0) how many distinct seconds one was seen active in."""
    total = 0
    for client in raw.client_list():
        if "U" not in client.get("flags", ""):
            continue
        if "tot-cmds" in client:
            total += int(client["tot-cmds"])
        elif int(client["idle"]) == 0:
            _ACTIVE.add(int(time.monotonic()))
    return total + 6 * len(_ACTIVE)


#: the child queue plain (K = 1) and sharded (K = 3)
SHARDS = pytest.mark.parametrize("shards", [1, 3], ids=["plain", "3-shard"])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    sock = tmp_path / "server.sock"
    srv = EmbeddedServer(extra_args=["--unixsocket", str(sock), "--unixsocketperm", "777"])
    srv.start()
    srv.unix = str(sock)  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


@SHARDS
def test_a_partitioned_workers_late_completion_is_refused_and_counted_once(
    server: EmbeddedServer, tmp_path: Path, proc_env: dict[str, str], shards: int
) -> None:
    mq = EchoMQ(server.url, prefix="pw")
    parents, work = "pw-parents", "pw-work"
    assert len(mq.set_shards(work, shards)) == shards
    pid = "JOB-af/etl/fan_out/partition"
    mq.add_flow(parents, [Child({"n": i}, queue=work) for i in range(20)], parent_id=pid,
                barrier=True)  # fmt: skip
    gate = tmp_path / "gate"
    gate.mkdir()
    cfg = {
        "role": "worker",
        "unix": server.unix,  # type: ignore[attr-defined]
        "control": str(tmp_path / "control.sock"),
        "gate": str(gate),
        "prefix": "pw",
        "queues": [work],
        "lease": 2.0,
        "pump_id": "",
    }
    behind = Partitioned(cfg, proc_env, tmp_path / "partitioned.log")
    runs: dict[str, int] = {}

    def outside(job: Job) -> Any:
        runs[job.id] = runs.get(job.id, 0) + 1
        return {"by": "outside"}

    worker = None
    try:
        started = eventually(lambda: sorted(gate.glob("started-*")), 30, "its handler running")
        stuck = f"{pid}.{started[0].name.removeprefix('started-')}"
        behind.switch("down")
        (gate / "go").touch()  # its handler returns; what it sends now is dropped
        worker = Worker(mq, {work: outside}, concurrency=4, lease=2.0).start()
        eventually(lambda: mq.snapshot(parents, pid).parent_state == "released", 60)
        assert runs.get(stuck) == 1  # its lease expired: taken over here
        behind.switch("up")
        # the late completion reaches the server once TCP retransmits: refused by its token
        eventually(lambda: "not recorded, their lease was gone" in behind.text(), 120,
                   "the partitioned worker's late completion refused")  # fmt: skip
    finally:
        if worker is not None:
            worker.stop()
        behind.stop()
    snap = mq.snapshot(parents, pid)
    assert (snap.parent_state, snap.processed, snap.total) == ("released", 20, 20)
    values = mq.children_values(parents, pid)
    assert len(values) == 20 and all(v == {"by": "outside"} for v in values.values()), values
    assert mq.queue(work).stats()["poison"] == 0
    mq.close()


@SHARDS
def test_a_partitioned_pump_is_taken_over_and_its_late_calls_count_nothing_twice(
    server: EmbeddedServer, tmp_path: Path, proc_env: dict[str, str], shards: int
) -> None:
    mq = EchoMQ(server.url, prefix="pp")
    parents, work = "pp-parents", "pp-work"
    outboxes = [parents, *mq.set_shards(work, shards)]  # what a Pump drains: every shard
    pid = "JOB-af/etl/fan_out/pump-partition"
    n = 20_000
    mq.add_flow(parents, [Child({"n": i}, queue=work) for i in range(n)], parent_id=pid,
                barrier=True)  # fmt: skip
    q = mq.queue(work)
    while jobs := q.claim(2000):
        q.complete_many([(j, j.payload["n"]) for j in jobs])
    assert q.stats()["outbox"] == n
    cfg = {
        "role": "pump",
        "unix": server.unix,  # type: ignore[attr-defined]
        "control": str(tmp_path / "control.sock"),
        "gate": str(tmp_path),
        "prefix": "pp",
        "queues": outboxes,
        "lease": 2.0,
        "pump_id": "pump-partitioned",
    }
    lease_keys = [mq.keys.outbox_lease(q) for q in outboxes[1:]]
    raw = mq.connection.client
    behind = Partitioned(cfg, proc_env, tmp_path / "partitioned.log")
    pump = None
    try:
        eventually(
            lambda: b"pump-partitioned" in [raw.get(k) for k in lease_keys], 30, "an outbox lease"
        )
        behind.switch("down")
        cut = mq.snapshot(parents, pid).processed
        pump = Pump(mq, outboxes, pump_id="pump-outside", lease=2.0, sweep_every=None)
        pump.start()
        eventually(lambda: mq.snapshot(parents, pid).parent_state == "released", 120)
        before = _unix_commands(raw)
        behind.switch("up")
        # its calls on their way run late, then it ticks again: a few round trips (3 a tick)
        eventually(lambda: _unix_commands(raw) >= before + 6, 120, "the healed Pump's calls")
    finally:
        if pump is not None:
            pump.stop()
        behind.stop()
    snap = mq.snapshot(parents, pid)
    assert (snap.parent_state, snap.processed, snap.total) == ("released", n, n), (cut, snap)
    assert len(mq.children_values(parents, pid)) == n
    assert q.stats()["poison"] == 0 and q.stats()["outbox"] == 0
    mq.close()
