"""A queue's rate limit (issue 28 item 2; the GCRA of issue 50): is the rate held, what do the
waiting workers cost, what does a limit that does not bind cost.

Usage (from the repository root, in the bench venv; from a clone of the commit measured)::

    python -m bench.rate_limit                          # 1000/s, 3 worker processes, 30 s
    python -m bench.rate_limit --seconds 5 --w1-runs 1  # a smoke run
    python -m bench.rate_limit --out bench/results/issue50

**Rate held.** One embedded Valkey; the queue ``rl`` gets ``--rate`` (``--burst``);
``--workers`` worker processes (``bench.peers.echomq_peer worker``, threaded, concurrency 1,
no-op handlers, their own Pumps on) start on the empty queue, then enough jobs for the whole
run are added at once. The starts are counted from the ``completed`` index (finish times on
the server's clock: a start's completion lands a few ms after its claim), per clock-aligned
window and in the busiest sliding window, over ``[1 s after the add, end]``; the overall rate
is the completions of that period over its length, as a multiple of the limit. (How the claims
themselves are spaced, timed by the claim script: ``bench/smooth_rate.py``.) Each worker's
CPU over that period: ``/proc/<pid>/stat`` (user + system, 10 ms ticks), as a share of one
core. Commands per start: ``INFO commandstats`` over the period.

**Cost.** W1 of ``bench.run`` (N no-op jobs, one worker process at concurrency 1, time from the
add to the last completion, commands per item) without a rate and with a rate far above what
W1 achieves (``--w1-rate``, with ``--w1-burst`` above any claim's batch: a GCRA limit of burst
1 takes one job per claim however high it is), interleaved, same server, same clone; medians
over ``--w1-runs``.

Writes ``<out>/rate_limit.json`` and prints a markdown summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from echomq_core import EchoMQ
from echomq_core.control.rates import parse_rate
from echomq_core.server import EmbeddedServer

from .common import REPO, Proc, Stopper
from .peers.echomq_peer import EchoMQPeer
from .smooth_rate import most_in_a_window

QUEUE = "rl"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    """User + system ticks of process ``pid`` (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def server_ms(admin: redis.Redis) -> int:
    sec, micros = admin.time()
    return int(sec) * 1000 + int(micros) // 1000


def rate_held(url: str, rate: str, burst: int, workers: int, seconds: float) -> dict[str, Any]:
    limit, window_ms = parse_rate(rate) or (0, 0)
    mq = EchoMQ(url)
    admin = redis.Redis.from_url(url)
    admin.execute_command("FLUSHALL", "SYNC")
    mq.set_rate_limit(QUEUE, rate, *([burst] if burst > 1 else []))
    n = int(limit * (seconds + 3) * 1000 / window_ms * 1.1)
    try:
        with Stopper() as procs:
            started = [
                procs.add(
                    Proc(
                        "bench.peers.echomq_peer",
                        ["worker", url, QUEUE, "1", "threaded"],
                        name=f"rate-worker-{i}",
                    ).wait_ready()
                )
                for i in range(workers)
            ]
            pids = [p.popen.pid for p in started]
            mq.queue(QUEUE).add_bulk(range(n))
            added_ms = server_ms(admin)
            time.sleep(1.0)  # the judged period starts 1 s after the add
            admin.config_resetstat()
            ticks = [cpu_ticks(p) for p in pids]
            begin_ms = server_ms(admin)
            time.sleep(seconds)
            stats = admin.info("commandstats")
            ticks = [cpu_ticks(p) - t for p, t in zip(pids, ticks, strict=True)]
            end_ms = server_ms(admin)
            time.sleep(0.2)
    finally:
        mq.close()
    done = admin.zrangebyscore(mq.keys.completed(QUEUE), begin_ms, f"({end_ms}", withscores=True)
    times = sorted(int(score) for _, score in done)
    admin.close()
    first = (added_ms + 1000) // window_ms * window_ms + window_ms
    judged = [s for s in range(first, end_ms - window_ms + 1, window_ms)]
    per_window = [sum(1 for t in times if s <= t < s + window_ms) for s in judged]
    period = end_ms - begin_ms
    cmds = Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})
    cmds["info"] -= 1
    total = sum(v for v in cmds.values() if v > 0)
    within = [abs(c - limit) <= 0.05 * limit for c in per_window]
    return {
        "rate": rate,
        "burst": burst,
        "limit": limit,
        "window_ms": window_ms,
        "workers": workers,
        "seconds": seconds,
        "jobs_added": n,
        "period_ms": period,
        "completions_in_period": len(times),
        "overall_x_limit": round(len(times) * window_ms / period / limit, 4) if period else None,
        "max_in_sliding_window": most_in_a_window(times, window_ms),
        "windows_judged": len(judged),
        "completions_per_window": per_window,
        "per_window_median": statistics.median(per_window) if per_window else None,
        "per_window_min": min(per_window, default=None),
        "per_window_max": max(per_window, default=None),
        "windows_within_5pct": sum(within),
        "worker_cpu_share": [round(t * 1000 / TICK / period, 4) for t in ticks],
        "commands_per_start": round(total / len(times), 3) if times else None,
        "top_commands_per_start": {
            k: round(v / len(times), 3)
            for k, v in sorted(cmds.items(), key=lambda kv: -kv[1])[:10]
            if v > 0 and times
        },
    }


def w1_cost(url: str, n: int, runs: int, rate: str, burst: int) -> dict[str, Any]:
    admin = redis.Redis.from_url(url)
    peer = EchoMQPeer()
    out: dict[str, list[dict[str, Any]]] = {"none": [], rate: []}
    for _ in range(runs):
        for variant in ("none", rate):  # interleaved: the machine's drift hits both alike
            admin.execute_command("FLUSHALL", "SYNC")
            if variant != "none":
                with EchoMQ(url) as mq:
                    mq.set_rate_limit("w1", variant, burst=burst)
            out[variant].append(peer.w1(url, n))
    admin.close()

    def median(variant: str, field: str) -> float:
        return float(statistics.median(r[field] for r in out[variant]))

    summary = {
        v: {
            "seconds": median(v, "seconds"),
            "rate": median(v, "rate"),
            "commands_per_item": median(v, "commands_per_item"),
            "top_commands": out[v][0]["top_commands"],
        }
        for v in out
    }
    base, limited = summary["none"], summary[rate]
    return {
        "n": n,
        "runs": runs,
        "rate": rate,
        "burst": burst,
        "variants": summary,
        "throughput_change_pct": round(100 * (limited["rate"] / base["rate"] - 1), 1),
        "commands_per_item_change": round(
            limited["commands_per_item"] - base["commands_per_item"], 3
        ),
        "raw": out,
    }


def render(doc: dict[str, Any]) -> str:
    held, cost = doc["rate_held"], doc["w1"]
    burst = f" burst {held['burst']}" if held["burst"] > 1 else ""
    lines = [
        f"## Rate held: {held['rate']}{burst}, {held['workers']} worker processes, "
        f"{held['seconds']:g} s",
        "",
        f"- completions over {held['period_ms']:,} ms (from 1 s after the add): "
        f"{held['completions_in_period']:,} = {held['overall_x_limit']}x the limit; the most "
        f"in any sliding {held['window_ms']} ms: {held['max_in_sliding_window']}",
        f"- clock-aligned windows judged: {held['windows_judged']}; completions per window "
        f"median {held['per_window_median']}, min {held['per_window_min']}, max "
        f"{held['per_window_max']}; within 5 % of {held['limit']}: "
        f"{held['windows_within_5pct']} of {held['windows_judged']}",
        "- each worker's CPU over the period (share of one core): "
        + ", ".join(f"{s}" for s in held["worker_cpu_share"]),
        f"- commands per start: {held['commands_per_start']} "
        f"(top: {held['top_commands_per_start']})",
        "",
        f"## Cost: W1, N = {cost['n']:,}, medians of {cost['runs']} interleaved runs "
        f"(rate {cost['rate']}, burst {cost['burst']:,})",
        "",
        "| | seconds | jobs/s | commands per item |",
        "|---|---|---|---|",
    ]
    for name, v in cost["variants"].items():
        label = "no rate" if name == "none" else f"rate {name}"
        lines.append(f"| {label} | {v['seconds']:.3f} | {v['rate']:,.0f} | "
                     f"{v['commands_per_item']} |")  # fmt: skip
    lines += [
        "",
        f"Throughput with the rate: {cost['throughput_change_pct']:+.1f} %; commands per item "
        f"{cost['commands_per_item_change']:+.3f}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="1000/s")
    parser.add_argument("--burst", type=int, default=1)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--w1-n", type=int, default=20_000)
    parser.add_argument("--w1-runs", type=int, default=3)
    parser.add_argument("--w1-rate", default="1000000/s", help="far above what W1 achieves")
    parser.add_argument("--w1-burst", type=int, default=10_000, help="above any claim's batch")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "raw")
    args = parser.parse_args(argv)
    server = EmbeddedServer(appendonly=False).start()
    try:
        doc = {
            "rate_held": rate_held(server.url, args.rate, args.burst, args.workers, args.seconds),
            "w1": w1_cost(server.url, args.w1_n, args.w1_runs, args.w1_rate, args.w1_burst),
        }
    finally:
        server.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rate_limit.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = render(doc)
    (args.out / "rate_limit.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
