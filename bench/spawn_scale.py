"""Spawning at scale (issue 31, "Spawn"): a flow of R children ("roots") each of which spawns K
more when it runs (R * K children grown at run time), against the same R + R * K children added
with the flow whole, run to the release by the same worker.

* ``added``: one flow of R + R * K children added whole; every child returns its payload;
* ``spawned``: one flow of R children; each spawns K siblings (``job.spawn``) and returns;
* ``own``: one flow of R children; each spawns K children of its own (``own=True``) and, when
  they have settled, runs again and returns their sum (R * K + 2 * R runs in all).

Per variant: the wall time from the add's start to the release (a threaded worker of
``--concurrency`` slots started after the add, as a user's is: it pays its start-up), the
server's commands per child (``INFO commandstats``, every command a script runs included) and
the server's CPU per child (``used_cpu_user + used_cpu_sys`` of ``INFO cpu``), on an embedded
server; medians of ``--runs`` interleaved rounds. Handlers do no work: this is the queue's own
cost.

    python -m bench.spawn_scale [--roots 1000] [--k 100] [--concurrency 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

import redis

from echomq_core import Child, EchoMQ, Job, Worker
from echomq_core.server import EmbeddedServer


def _cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _commands(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info",))


def one(r: redis.Redis, url: str, args: argparse.Namespace, variant: str, i: int) -> dict[str, Any]:
    prefix = f"s{i}{variant[0]}"
    mq = EchoMQ(url, prefix=prefix)
    mq.register_queue("kids")
    roots, k = args.roots, args.k
    total = roots + roots * k

    def handle(job: Job) -> Any:
        if variant != "added" and isinstance(job.payload, str):  # a root
            if variant == "own" and job.resumed:
                return sum(job.children_values().values())
            job.spawn([Child(j) for j in range(k)], own=variant == "own")
        return job.payload

    r.config_resetstat()
    cpu0, t0 = _cpu(r), time.perf_counter()
    if variant == "added":
        kids = [Child(f"r{j}") for j in range(roots)] + [Child(j) for j in range(roots * k)]
    else:
        kids = [Child(f"r{j}") for j in range(roots)]
    ref = mq.add_flow("kids", kids, barrier=True)
    worker = Worker(mq, {"kids": handle}, concurrency=args.concurrency)
    t = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    t.start()
    try:
        mq.wait("kids", ref.parent_id, timeout=3600, poll=0.05)
        seconds = time.perf_counter() - t0
    finally:
        worker.stop()
        t.join(120)
    cpu, commands = _cpu(r) - cpu0, _commands(r)
    snap = mq.snapshot("kids", ref.parent_id)
    assert snap.processed == (roots if variant == "own" else total), snap
    mq.close()
    r.flushall()
    return {
        "seconds": seconds,
        "children_per_s": total / seconds,
        "server_commands_per_child": commands / total,
        "server_cpu_us_per_child": cpu / total * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--roots", type=int, default=1000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    server = EmbeddedServer(appendonly=False).start()
    try:
        r = redis.Redis(host=server.host, port=server.port)
        runs: dict[str, list[dict[str, Any]]] = {"added": [], "spawned": [], "own": []}
        for i in range(args.runs):
            for variant in runs:
                runs[variant].append(one(r, server.url, args, variant, i))
        report = {
            variant: {key: statistics.median(run[key] for run in rows) for key in rows[0]}
            for variant, rows in runs.items()
        }
        print(json.dumps({"args": vars(args), "medians": report, "runs": runs}, indent=2))
        r.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
