"""A follower process SIGKILLed mid-stream resumes from the cursor it stored: every result once,
in settle order, nothing skipped or repeated; on standalone and on a real 3-master Cluster."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from echomq_core import Child, EchoMQ, Job, Pump

from ..conftest import Backend
from ..waiting import eventually

READER = Path(__file__).resolve().parent.parent / "procs" / "stream_reader_proc.py"


def lines(path: Path) -> list[list[str]]:
    """The complete lines the reader stored (a line cut by the kill was never stored)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return [ln.split("\t") for ln in text.split("\n")[:-1]]


def settle(mq: EchoMQ, pump: Pump, queue: str, jobs: list[Job]) -> None:
    """Complete ``jobs`` one call each, in order, then deliver them all to the parent."""
    q = mq.queue(queue)
    for job in jobs:
        assert q.complete_many([(job, {"n": job.payload})]) == [True]
    eventually(lambda: not pump.tick().busy and q.stats()["outbox"] == 0, 10, "the deliveries")


def test_a_killed_follower_resumes_from_its_cursor(
    backend: Backend, prefix: str, proc_env: dict[str, str], tmp_path: Path
) -> None:
    mq = backend.client(prefix)
    parents, work = backend.queues_on_distinct_nodes(2, "rk")
    ref = mq.add_flow(parents, [Child(i, queue=work) for i in range(40)], barrier=True, stream=True)
    jobs = mq.queue(work).claim(40)
    jobs.reverse()  # settle order differs from the ids' order
    out = tmp_path / "results.tsv"
    args = [backend.url, "1" if backend.cluster else "0", prefix, parents, ref.parent_id, str(out)]
    pump = Pump(mq, [parents, work])
    procs: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, str(READER), *args, *extra], env=proc_env, stdout=subprocess.PIPE
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        return proc

    try:
        settle(mq, pump, work, jobs[:10])
        first = start()
        eventually(lambda: len(lines(out)) == 10, 20, lambda: f"10 lines, got {lines(out)}")
        settle(mq, pump, work, jobs[10:15])
        eventually(lambda: len(lines(out)) == 15, 20, "15 lines")
        # the kill lands while the follower reads the next five (wherever it is by then)
        settle(mq, pump, work, jobs[15:20])
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        settle(mq, pump, work, jobs[20:30])  # settled while no one follows
        stored = lines(out)
        assert 15 <= len(stored) <= 20
        out.write_text("".join("\t".join(ln) + "\n" for ln in stored), encoding="utf-8")
        second = start(stored[-1][2])
        settle(mq, pump, work, jobs[30:])
        assert second.wait(20) == 0
        assert second.stdout is not None and second.stdout.read().strip() == b"end"
    finally:
        pump.release_leases()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    got: list[tuple[str, Any]] = [(c, json.loads(v)) for c, v, _ in lines(out)]
    assert got == [(j.id, {"n": j.payload}) for j in jobs]
    mq.close()
