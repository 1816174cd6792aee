"""A claim's server time in a queue with 100,000 fairness groups of which 1,000 have work
(issue 50), against a queue without groups: the same 100,000 pending jobs either way.

    python -m bench.group_claim_cost [--rounds 5]

Per round and side, a fresh queue is filled (grouped: 100,000 groups that ran once - their
turns left in the queue's ``fair`` hash, not yet swept - then 1,000 groups of 100 jobs each;
plain: 100,000 jobs), then claimed off by ``Queue.claim(500)`` and completed; the server's CPU
(``INFO cpu``, user + sys) is read around the claims alone and around the add of the last
100,000, and ``commandstats`` counts the claim script's calls. Prints one JSON object: per side
the medians of server µs per claimed job and per added job."""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import redis

from echomq_core import EchoMQ, JobSpec
from echomq_core.server import EmbeddedServer


def _cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def one(mq: EchoMQ, r: redis.Redis, name: str, grouped: bool) -> dict[str, float]:
    q = mq.queue(name)
    if grouped:  # 100,000 groups that ran once: their turns stay until a sweep
        q.add_bulk([JobSpec(0, group=f"old-{i}") for i in range(100_000)])
        while done := q.claim(500):
            q.complete_many([(job, None) for job in done])
        specs: list[Any] = [JobSpec(i, group=f"t{i % 1000}") for i in range(100_000)]
    else:
        specs = list(range(100_000))
    before = _cpu(r)
    q.add_bulk(specs)
    added = _cpu(r) - before
    claimed, spent = 0, 0.0
    while True:
        before = _cpu(r)
        got = q.claim(500)
        spent += _cpu(r) - before
        if not got:
            break
        claimed += len(got)
        q.complete_many([(job, None) for job in got])
    return {"claim_us_per_job": spent / claimed * 1e6, "add_us_per_job": added / 1e5 * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    server = EmbeddedServer(appendonly=False).start()
    try:
        mq, r = EchoMQ(server.url), redis.Redis.from_url(server.url)
        out: dict[str, list[dict[str, float]]] = {"plain": [], "groups": []}
        for i in range(args.rounds):
            out["plain"].append(one(mq, r, f"plain-{i}", grouped=False))
            out["groups"].append(one(mq, r, f"groups-{i}", grouped=True))
        summary: dict[str, Any] = {
            side: {k: round(statistics.median(x[k] for x in rows), 3) for k in rows[0]}
            for side, rows in out.items()
        }
        summary["rounds"] = out
        print(json.dumps(summary, indent=1))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
