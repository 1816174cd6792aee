"""Server instructions per item of each phase of W1, W2 and W3, counted by callgrind.

    python bench/cpu_phases.py [N]        # from a clone of the commit measured, PYTHONPATH=.

The server (the bench's valkey binary) runs under ``valgrind --tool=callgrind
--instr-atstart=no``; instrumentation is switched on around one phase and the dump's total
is divided by the items. Instruction counts, unlike CPU time, do not move with the load of a
shared machine, so two commits compare to a fraction of a percent (bench/cpu_per_job.md).
Phases (batches of 500, the worker's largest claim): W1 add_bulk, the claim script, the rows
script, complete (with its tally); W2 add_flow, claim + rows, complete (the same-queue
fan-in, the parent released by the last); W3 add_flow, claim + rows, complete (cross-queue
signals), Pump ticks until every signal is delivered. Needs valgrind (callgrind_control).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from echomq_core import Child, EchoMQ, Pump
from echomq_core.queues import claiming
from echomq_core.queues.registry import lease_token
from echomq_core.server import EmbeddedServer, find_server_binary
from echomq_core.wire.calls import Call

BATCH = 500


class Counted:
    """An embedded server under callgrind, and the instructions it runs in a phase."""

    def __init__(self, out: Path) -> None:
        self.out = out
        wrapper = out / "valkey-under-callgrind"
        wrapper.write_text(
            "#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no "
            f'--callgrind-out-file={out}/cg.%p {find_server_binary()} "$@"\n'
        )
        wrapper.chmod(0o755)
        self.server = EmbeddedServer(appendonly=False, binary=wrapper).start(timeout=120)

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.server.pid)], capture_output=True)

    def run(self, fn: Callable[[], Any]) -> int:
        self._control("-z")
        self._control("-i", "on")
        fn()
        before = set(self.out.glob("cg.*"))
        self._control("--dump=phase")
        deadline = time.monotonic() + 30
        while not (new := set(self.out.glob("cg.*")) - before) and time.monotonic() < deadline:
            time.sleep(0.05)  # the dump is written when the server next enters valgrind
        time.sleep(0.2)
        dump = max(new, key=os.path.getmtime)
        text = dump.read_text()
        dump.unlink()
        self._control("-i", "off")
        found = re.search(r"^totals:\s*(\d+)", text, re.M)
        if found is None:
            raise RuntimeError(f"no totals in {dump}")
        return int(found.group(1))


def w1(mq: EchoMQ, n: int, measure: Callable[[str, Callable[[], Any]], None]) -> None:
    q, ks, token = mq.queue("w1"), mq.keys, lease_token("host-1-0badc0de")
    measure("W1 add_bulk", lambda: q.add_bulk(range(n)))
    parts: list[list[str]] = []

    def claim() -> None:
        call = Call.lua("claim", ks.claim_keys("w1"), [BATCH, 30_000, token, 100])
        while len(reply := mq.connection.execute([call])[0]) > 1:
            parts.append([i.decode() if isinstance(i, bytes) else str(i) for i in reply[1:]])

    measure("W1 claim script", claim)
    jobs: list[list[Any]] = []
    measure(
        "W1 rows script",
        lambda: jobs.extend(
            mq.perform(claiming.leased(ks, "w1", part, token, mq.serializer)) for part in parts
        ),
    )
    done = [[(j, None) for j in b] for b in jobs]
    measure("W1 complete (+ tally)", lambda: [q.complete_many(b) for b in done])


def w2(mq: EchoMQ, n: int, measure: Callable[[str, Callable[[], Any]], None]) -> None:
    kids = [Child(i) for i in range(n)]  # the parent's queue: the same-queue fan-in
    measure("W2 add_flow", lambda: mq.add_flow("w2", kids))
    q, batches = mq.queue("w2"), []

    def claim() -> None:
        while jobs := q.claim(BATCH):
            batches.append(list(jobs))

    measure("W2 claim + rows", claim)
    done = [[(j, 2 * j.payload) for j in b] for b in batches]
    measure("W2 complete (settle)", lambda: [q.complete_many(b) for b in done])


def w3(mq: EchoMQ, n: int, measure: Callable[[str, Callable[[], Any]], None]) -> None:
    kids = [Child(i, queue="w3c") for i in range(n)]
    measure("W3 add_flow", lambda: mq.add_flow("w3p", kids))
    q, batches = mq.queue("w3c"), []

    def claim() -> None:
        while jobs := q.claim(BATCH):
            batches.append(list(jobs))

    measure("W3 claim + rows", claim)
    done = [[(j, 2 * j.payload) for j in b] for b in batches]
    measure("W3 complete (signals)", lambda: [q.complete_many(b) for b in done])
    pump = Pump(mq, ["w3c"])

    def deliver() -> None:
        while pump.totals.delivered < n:
            pump.tick()

    measure("W3 Pump ticks (deliver)", deliver)


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 5000
    with tempfile.TemporaryDirectory() as tmp:
        counted = Counted(Path(tmp))
        mq = EchoMQ(counted.server.url)
        try:
            for workload in (w1, w2, w3):
                mq.connection.execute([Call.cmd("FLUSHALL")])
                workload(mq, 50, lambda name, fn: fn())  # every script loaded, nothing counted
                mq.connection.execute([Call.cmd("FLUSHALL")])

                def measure(name: str, fn: Callable[[], Any]) -> None:
                    print(f"{name:26s} {counted.run(fn) / n:9,.0f} instructions per item")

                workload(mq, n, measure)
        finally:
            mq.close()
            counted.server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
