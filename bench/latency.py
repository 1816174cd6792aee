"""Fan-in latency (issue 19, item 6): from the last child's completion to the parent released.

Usage (from the repository root, in the bench venv)::

    python -m bench.latency                  # N = 10,000, 20 flows each way, worker at c1
    python -m bench.latency --n 2000 --flows 5 --concurrency 1,50 --out DIR

Each flow is a *barrier* flow (the way the Airflow sensor and the Dagster IO manager read one:
its parent is never claimed, and release is the moment it becomes readable), of N children in
one worker process (``bench.peers.echomq_peer worker``, threaded, at each concurrency). A child
returns the wall-clock time (ms) at which its handler finished; the release script stamps the
parent's row with the server's ``TIME`` (``released``, ms). Latency = released - the latest
child's finish: it covers the result waiting in the worker for its batch call, the call
itself, and, cross-queue, the signal waiting in the outbox for a Pump (a separate ``echomq
pump`` process at its defaults) and its delivery. Both clocks are the same machine's. Same-queue
(children in the parent's queue) and cross-queue (children in another queue) flows alternate.

Writes ``<out>/latency.json`` and prints a markdown table: median, p90, p99 (the nearest rank;
with 20 flows the p99 is the largest) and max, in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from echomq_core import Child, EchoMQ
from echomq_core.server import EmbeddedServer
from echomq_core.wire.connection import Call

from .common import REPO, Proc

QUEUES = {"same": ("lat", "lat"), "cross": ("latp", "latc")}


def _rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


#: Who drains the cross-queue outbox: a Pump process beside a worker that runs none of its own
#: (``pump``), the worker's own Pump alone (``worker``), or both (``both``).
DRAINS = ("pump", "worker", "both")


def measure(url: str, n: int, flows: int, concurrency: int, drain: str = "pump") -> dict[str, Any]:
    mq = EchoMQ(url)
    worker = Proc(
        "bench.peers.echomq_peer",
        ["worker", url, "lat,latc", str(concurrency), "threaded"],
        name="echomq-worker",
        env={"ECHOMQ_BENCH_WORKER_PUMP": "0" if drain == "pump" else "1"},
    ).wait_ready()
    pump = (
        Proc("echomq_core.cli", ["pump", "latc", "latp", "--url", url], name="echomq-pump")
        if drain != "worker"
        else None
    )
    time.sleep(1.0)  # the Pump connects and starts ticking
    out: dict[str, list[float]] = {"same": [], "cross": []}
    try:
        for i in range(flows):
            for kind, (parent_q, child_q) in QUEUES.items():
                ref = mq.add_flow(
                    parent_q,
                    [Child(j, queue=child_q) for j in range(n)],
                    parent_id=f"JOB-lat-{kind}-c{concurrency}-{drain}-{i}",
                    barrier=True,
                )
                deadline = time.monotonic() + 120
                while not mq.snapshot(parent_q, ref.parent_id).released:
                    worker.check_alive()
                    if pump is not None:
                        pump.check_alive()
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"flow {ref.parent_id} not released in 120 s")
                    time.sleep(0.02)
                last = max(mq.children_values(parent_q, ref.parent_id).values())
                (released,) = mq.connection.execute(
                    [Call.cmd("HGET", mq.keys.job(parent_q, ref.parent_id), "released")]
                )
                out[kind].append(float(released) - float(last))
                mq.close_flow(parent_q, ref.parent_id)
    finally:
        worker.stop()
        if pump is not None:
            pump.stop()
        mq.close()
    return {
        kind: {
            "flows": len(values),
            "median_ms": round(statistics.median(values), 2),
            "p90_ms": round(_rank(values, 0.9), 2),
            "p99_ms": round(_rank(values, 0.99), 2),
            "max_ms": round(max(values), 2),
            "min_ms": round(min(values), 2),
            "all_ms": [round(v, 2) for v in values],
        }
        for kind, values in out.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    parser.add_argument("--n", type=int, default=10_000, help="children per flow")
    parser.add_argument("--flows", type=int, default=20, help="flows of each kind")
    parser.add_argument("--concurrency", default="1", help="worker concurrencies, e.g. 1,50")
    parser.add_argument(
        "--drain",
        default="pump",
        help="who drains the cross-queue outbox, comma-separated: pump (a Pump process, the "
        "worker's own Pump off), worker (the worker's own Pump alone), both",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    drains = args.drain.split(",")
    if set(drains) - set(DRAINS):
        parser.error(f"--drain takes {', '.join(DRAINS)}")
    server = EmbeddedServer(appendonly=False).start()
    doc: dict[str, Any] = {"n": args.n, "flows": args.flows, "results": {}}
    try:
        for level in (int(c) for c in args.concurrency.split(",")):
            for drain in drains:
                key = f"c{level}" if drain == "pump" and drains == ["pump"] else f"c{level}/{drain}"
                doc["results"][key] = measure(server.url, args.n, args.flows, level, drain)
    finally:
        server.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latency.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        f"Fan-in latency, N = {args.n:,} children, {args.flows} flows each (ms, from the "
        "last child's finish to the parent's release)",
        "",
        "| Worker | Fan-in | Median | p90 | p99 | Max | Goal |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for level, kinds in doc["results"].items():
        for kind, r in kinds.items():
            goal = "5" if kind == "same" else "50"
            lines.append(
                f"| {level} | {kind}-queue | {r['median_ms']} | {r['p90_ms']} | {r['p99_ms']} "
                f"| {r['max_ms']} | {goal} |"
            )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
