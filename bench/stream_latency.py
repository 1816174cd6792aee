"""How soon a follower sees results (issue 31, "Time to first result downstream"), small scale:
N children of a barrier flow run by one threaded worker (``--concurrency`` slots, a handler
that sleeps ``--work-ms``), read either by ``iter_results(follow=True)`` started with the flow
or by ``wait()`` then ``iter_children_values`` (the baseline), interleaved run by run.

Times are the server's (``TIME``, and the settle log's entry ids, which are the settle's server
milliseconds), so the follower's lag is measured against the step that counted the child:

* ``first_lag_ms``: the follower's first result minus the first settle;
* ``end_lag_ms``: the end of the read (follower: the iterator ended; baseline: the last value
  read) minus the release.

    python -m bench.stream_latency [--n 2000] [--work-ms 5] [--concurrency 8] [--runs 3]

Prints medians per variant (a shared, noisy machine: read them as ratios of one run set).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
from typing import Any

import redis

from echomq_core import Child, EchoMQ, Job, Worker
from echomq_core.server import EmbeddedServer


def _now_ms(r: redis.Redis) -> float:
    s, us = r.time()
    return s * 1000 + us / 1000


def one(r: redis.Redis, url: str, args: argparse.Namespace, variant: str, i: int) -> dict[str, Any]:
    prefix = f"l{i}{variant[0]}"
    mq = EchoMQ(url, prefix=prefix)
    reader = EchoMQ(url, prefix=prefix)
    ref = mq.add_flow("kids", [Child(k) for k in range(args.n)], barrier=True, stream=True)
    pause = args.work_ms / 1000

    def handle(job: Job) -> Any:
        threading.Event().wait(pause)
        return job.payload

    worker = Worker(mq, {"kids": handle}, concurrency=args.concurrency)
    t = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    first = None
    t.start()
    try:
        if variant == "follow":
            results = iter(reader.iter_results("kids", ref.parent_id, block=1.0))
            next(results)
            first = _now_ms(r)
            got = 1 + sum(1 for _ in results)
            end = _now_ms(r)
        else:
            reader.wait("kids", ref.parent_id, timeout=600)
            got = sum(1 for _ in reader.iter_children_values("kids", ref.parent_id))
            end = _now_ms(r)
    finally:
        worker.stop()
        t.join(60)
    log = mq.keys.settle_log("kids", ref.parent_id)
    (entry,) = r.xrange(log, count=1)
    first_settle = int(entry[0].split(b"-")[0])
    released = int(r.hget(mq.keys.job("kids", ref.parent_id), "released") or 0)
    mq.close()
    reader.close()
    assert got == args.n
    out = {"end_lag_ms": end - released}
    if first is not None:
        out["first_lag_ms"] = first - first_settle
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--work-ms", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    server = EmbeddedServer(appendonly=False).start()
    try:
        r = redis.Redis(host=server.host, port=server.port)
        runs: dict[str, list[dict[str, Any]]] = {"follow": [], "wait_then_read": []}
        for i in range(args.runs):
            for variant in runs:
                runs[variant].append(one(r, server.url, args, variant, i))
        report = {
            variant: {
                key: statistics.median(run[key] for run in rows)
                for key in rows[0]
            }
            for variant, rows in runs.items()
        }
        print(json.dumps({"args": vars(args), "medians": report, "runs": runs}, indent=2))
        r.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
