"""A worker SIGKILLed in the middle of a handler's spawns (a real process): the re-run on another
worker spawns the same children - siblings, or children of its own (then the spawner runs
again as their parent); 0 lost, 0 counted twice; on standalone and on a Cluster."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from echomq_core import Child

from ..conftest import Backend
from ..waiting import eventually

WORKER = Path(__file__).resolve().parent.parent / "procs" / "spawn_worker_proc.py"


@pytest.mark.parametrize("own", [False, True], ids=["siblings", "own"])
def test_a_worker_killed_mid_spawn_loses_and_doubles_nothing(
    backend: Backend, prefix: str, proc_env: dict[str, str], own: bool
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "ko" if own else "ks")
    seeded = "seed-own" if own else "seed"
    ref = mq.add_flow(parents, [Child(seeded, queue=work), Child("b", queue=work)], barrier=True)
    seed = next(c for _, c in ref.children)
    args = [sys.executable, str(WORKER), backend.url, "1" if backend.cluster else "0", prefix]
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([*args, f"{parents},{work}"], env=proc_env, stdout=subprocess.PIPE)
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        return proc

    try:
        first = start()
        assert first.stdout is not None
        while (line := first.stdout.readline()) and line.strip() != b"mid-spawn":
            pass
        assert line.strip() == b"mid-spawn", "the first run never reached its third spawn"
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        snap = mq.snapshot(work, seed) if own else mq.snapshot(parents, ref.parent_id)
        assert (snap.parent_state, snap.total) == ("active", 20) if own else ("held", 2 + 20)
        start()  # the seed's lease runs out; this worker re-runs it
        eventually(lambda: mq.snapshot(parents, ref.parent_id).released, 60, "the release")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
    snap = mq.snapshot(parents, ref.parent_id)
    values = mq.children_values(parents, ref.parent_id)
    if own:  # the flow kept its 2; the seed holds the 50 and summed them in its second run
        assert (snap.total, snap.processed, snap.dependencies) == (2, 2, 0), snap
        assert values[seed] == sum(range(50))
        node = mq.snapshot(work, seed)
        assert (node.total, node.processed, node.dependencies) == (50, 50, 0), node
        values = mq.children_values(work, seed)
    else:
        assert (snap.total, snap.processed, snap.dependencies) == (52, 52, 0), snap
    stem = f"{seed}.k" if own else f"{seed}.s"
    expected = {f"{stem}{k}": {"n": k} for k in range(50)}
    assert {k: v for k, v in values.items() if k.startswith(stem)} == expected
    assert mq.queue(work).stats()["completed"] == 52
    mq.close()
