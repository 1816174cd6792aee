"""What the settle log costs (issue 31, "Results as they settle"): deterministic counts, no
timings.

* memory: ``INFO memory`` used_memory before and after a flow of N same-queue children settles,
  with ``stream=True`` and without (the same flow, the server flushed between), and ``MEMORY
  USAGE`` of the log key itself; per child;
* server commands in the settle step: ``INFO commandstats`` over the completions, both variants
  (the log adds one XADD per child inside the scripts that settle);
* reader commands per result: following a released flow (paged ``log_read``: its XRANGE counts
  one per call) and following a live flow whose children settle one at a time, the follower
  reporting each before the next completes (each result then costs one XREAD wake-up plus one
  ``log_read``).

    python -m bench.stream_cost [--n 20000] [--live 200]
"""

from __future__ import annotations

import argparse
import json
import threading
from typing import Any

import redis

from echomq_core import Child, EchoMQ
from echomq_core.server import EmbeddedServer


def _calls(r: redis.Redis, *names: str) -> dict[str, int]:
    stats = r.info("commandstats")
    return {n: int(stats.get(f"cmdstat_{n}", {}).get("calls", 0)) for n in names}


def _settle_all(mq: EchoMQ, queue: str, n: int) -> None:
    q = mq.queue(queue)
    done = 0
    while done < n:
        jobs = q.claim(500)
        assert q.complete_many([(j, j.payload) for j in jobs])
        done += len(jobs)


def settle_cost(r: redis.Redis, url: str, n: int, stream: bool) -> dict[str, Any]:
    r.flushall()
    mq = EchoMQ(url, prefix="b")
    ref = mq.add_flow("s", [Child(i) for i in range(n)], barrier=True, stream=stream)
    r.config_resetstat()
    before = int(r.info("memory")["used_memory"])
    _settle_all(mq, "s", n)
    after = int(r.info("memory")["used_memory"])
    stats = r.info("commandstats")
    total = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    log = mq.keys.settle_log("s", ref.parent_id)
    out = {
        "stream": stream,
        "n": n,
        "used_memory_delta_per_child": (after - before) / n,
        "log_bytes_per_child": (r.memory_usage(log) or 0) / n,
        "server_commands_per_child": total / n,
        "xadd_per_child": _calls(r, "xadd")["xadd"] / n,
    }
    if stream:
        r.config_resetstat()
        got = sum(1 for _ in mq.iter_results("s", ref.parent_id, page=500))
        reads = _calls(r, "xrange", "xread")
        out["released_read"] = {"results": got, **reads, "per_result": sum(reads.values()) / got}
    mq.close()
    return out


def live_cost(r: redis.Redis, url: str, n: int) -> dict[str, Any]:
    r.flushall()
    mq = EchoMQ(url, prefix="b")
    reader = EchoMQ(url, prefix="b")
    ref = mq.add_flow("s", [Child(i) for i in range(n)], barrier=True, stream=True)
    jobs = mq.queue("s").claim(n)
    seen: list[str] = []
    got_one = threading.Semaphore(0)

    def follow() -> None:
        for child_id, _ in reader.iter_results("s", ref.parent_id, block=5.0):
            seen.append(child_id)
            got_one.release()

    r.config_resetstat()
    t = threading.Thread(target=follow)
    t.start()
    q = mq.queue("s")
    for job in jobs:  # one at a time: the follower reports each before the next settles
        assert q.complete_many([(job, 1)]) == [True]
        assert got_one.acquire(timeout=30)
    t.join(30)
    reads = _calls(r, "xrange", "xread")
    mq.close()
    reader.close()
    return {"results": len(seen), **reads, "per_result": sum(reads.values()) / len(seen)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--live", type=int, default=200)
    args = ap.parse_args()
    server = EmbeddedServer(appendonly=False).start()
    try:
        r = redis.Redis(host=server.host, port=server.port)
        report = {
            "plain": settle_cost(r, server.url, args.n, False),
            "stream": settle_cost(r, server.url, args.n, True),
            "live": live_cost(r, server.url, args.live),
        }
        print(json.dumps(report, indent=2))
        r.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
