"""What cancel and repair cost on a large flow (issue 14): commands (from INFO commandstats,
commands run inside scripts included) and seconds, on an embedded server.

    python -m bench.lifecycle_costs [--children 10000] [--dead-percent 1]

A barrier flow of N children over two queues (cross-queue: every report goes through an outbox
and the Pump) is worked off with 1% of the children dying (max_attempts=1): the parent fails.
Then ``retry_flow`` is timed and counted, the flow worked off again; then a second flow is
cancelled half-way and its cost counted. Prints one JSON object and writes
bench/results/lifecycle_costs.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from echomq_core import Child, EchoMQ, Pump
from echomq_core.server import EmbeddedServer

RESULTS = Path(__file__).resolve().parent / "results" / "lifecycle_costs.json"


def commandstats(mq: EchoMQ) -> tuple[int, int]:
    """(calls, usec) over every command the server counted."""
    info = mq.connection.client.info("commandstats")
    calls = sum(int(v["calls"]) for v in info.values())
    usec = sum(int(v["usec"]) for v in info.values())
    return calls, usec


def measured(mq: EchoMQ, action: Any) -> dict[str, Any]:
    mq.connection.client.config_resetstat()
    started = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - started
    calls, usec = commandstats(mq)
    calls -= 1  # the INFO that read them
    return {
        "seconds": round(seconds, 4),
        "commands": calls,
        "server_usec": usec,
        "result": repr(result),
    }


def work(mq: EchoMQ, queues: list[str], die: set[int], pump: Pump) -> None:
    while True:
        moved = False
        for name in queues:
            q = mq.queue(name)
            jobs = q.claim(500)
            if not jobs:
                continue
            moved = True
            ok = [(j, j.payload) for j in jobs if j.payload not in die]
            bad = [(j, "dies", False) for j in jobs if j.payload in die]
            if ok:
                q.complete_many(ok)
            if bad:
                q.fail_many(bad)
        stats = pump.tick()
        if not moved and not stats.busy:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--children", type=int, default=10_000)
    parser.add_argument("--dead-percent", type=float, default=1.0)
    args = parser.parse_args()
    n = args.children
    every = max(1, round(100 / args.dead_percent))
    dead = {i for i in range(n) if i % every == every - 1}
    with EmbeddedServer() as server:
        mq = EchoMQ(server.url, prefix="lc")
        parents, a, b = "lc-parents", "lc-a", "lc-b"
        pump = Pump(mq, [parents, a, b], sweep_every=None)
        kids = [Child(i, queue=a if i % 2 else b, max_attempts=1) for i in range(n)]
        ref = mq.add_flow(parents, kids, parent_id="JOB-repair", barrier=True)
        work(mq, [parents, a, b], dead, pump)
        assert mq.snapshot(parents, ref.parent_id).parent_state == "failed"
        repair = measured(mq, lambda: mq.retry_flow(parents, ref.parent_id))
        work(mq, [parents, a, b], set(), pump)
        snap = mq.snapshot(parents, ref.parent_id)
        assert snap.parent_state == "released" and snap.processed == n, snap
        other = mq.add_flow(parents, kids, parent_id="JOB-cancel", barrier=True)
        half = mq.queue(b).claim(n // 4)
        mq.queue(b).complete_many([(j, j.payload) for j in half])
        pump.tick()
        cancel = measured(mq, lambda: mq.cancel_flow(parents, other.parent_id, reason="bench"))
        resume = measured(mq, lambda: mq.retry_flow(parents, other.parent_id))
        work(mq, [parents, a, b], set(), pump)
        assert mq.snapshot(parents, other.parent_id).processed == n
        out = {
            "children": n,
            "dead": len(dead),
            "repair": repair,
            "cancel_after_a_quarter": cancel,
            "resume_cancelled": resume,
            "valkey": mq.connection.client.info("server")["valkey_version"]
            if "valkey_version" in mq.connection.client.info("server")
            else mq.connection.client.info("server")["redis_version"],
        }
        mq.close()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
