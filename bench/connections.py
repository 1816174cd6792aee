"""Connections per worker process (issue 19, item 2): how many a worker opens at each concurrency.

Usage (from the repository root, in the bench venv)::

    python -m bench.connections                    # concurrency 1, 50, 200; W1 and W6 jobs
    python -m bench.connections --levels 1,50 --n 5000

For each worker kind (threaded ``Worker``, ``AsyncWorker``) and concurrency: a fresh worker
process is started on an empty queue after ``CONFIG RESETSTAT``, N no-op jobs are added, then
5 x concurrency jobs that wait 50 ms (so both the batched and the one-per-runner claim paths
run), the worker drains them and is stopped. Every connection a client opens greets the server with
``HELLO`` (redis-py; ``CLIENT SETINFO`` twice besides), so ``cmdstat_hello`` counts the
connections the worker opened over its whole life - the harness's own client connects before
the reset. Also reported: the most connections the server saw at once (``connected_clients``
sampled every 10 ms, less the harness's own).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import redis

from echomq_core import EchoMQ
from echomq_core.server import EmbeddedServer

from .common import REPO, Proc


def one(url: str, mode: str, level: int, n: int) -> dict[str, Any]:
    admin = redis.Redis.from_url(url)
    mq = EchoMQ(url)
    admin.flushall()
    for name in ("w1", "w6"):
        mq.queue(name).stats()  # the harness's connections exist before the reset
    admin.config_resetstat()
    base = int(admin.info("clients")["connected_clients"])
    worker = Proc(
        "bench.peers.echomq_peer",
        ["worker", url, "w1,w6", str(level), mode],
        name=f"echomq-worker-{mode}",
    ).wait_ready()
    peak = 0
    try:
        for name, count in (("w1", n), ("w6", 5 * level)):
            queue = mq.queue(name)
            queue.add_bulk(range(count))
            deadline = time.monotonic() + 300
            while queue.stats()["completed"] < count:
                worker.check_alive()
                peak = max(peak, int(admin.info("clients")["connected_clients"]) - base)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: not drained in 300 s")
                time.sleep(0.01)
    finally:
        worker.stop()
    stats = admin.info("commandstats")
    mq.close()
    admin.close()

    def calls(name: str) -> int:
        return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))

    return {
        "mode": mode,
        "concurrency": level,
        "hello": calls("hello"),
        "client_setinfo": calls("client|setinfo"),
        "peak_connections": peak,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.connections", description=__doc__)
    parser.add_argument("--levels", default="1,50,200")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    server = EmbeddedServer(appendonly=False).start()
    rows = []
    try:
        for mode in ("threaded", "async"):
            for level in (int(c) for c in args.levels.split(",")):
                rows.append(one(server.url, mode, level, args.n))
    finally:
        server.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "connections.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("| Worker | Concurrency | HELLO | CLIENT SETINFO | Most open at once |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['concurrency']} | {r['hello']} | {r['client_setinfo']} "
            f"| {r['peak_connections']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
