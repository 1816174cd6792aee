"""A queue's rate limit (issue 28 item 2): is the rate held, do waiting workers spin, what does
it cost.

Usage (from the repository root, in the bench venv; from a clone of the commit measured)::

    python -m bench.rate_limit                          # 1000/s, 3 worker processes, 30 s
    python -m bench.rate_limit --seconds 5 --w1-runs 1  # a smoke run
    python -m bench.rate_limit --out bench/results/issue28

**Rate held.** One embedded Valkey; the queue ``rl`` gets ``--rate``; ``--workers`` worker
processes (``bench.peers.echomq_peer worker``, threaded, concurrency 1, no-op handlers, their
own Pumps on) start on the empty queue, then enough jobs for the whole run are added at once.
A sampler in this process reads the queue's window record (``rate:window``: start and count,
with the server's ``TIME``) every 5 ms; a window's starts are the last count seen for its
start. As a cross-check independent of that counter, the completions per window are counted
from the ``completed`` index (finish times on the server's clock: a start's completion lands a
few ms after its claim, so a window's completions can differ from its starts by the jobs
claimed in its last ms). Windows fully inside ``[1 s after the add, end]`` are judged: within
5 % of the limit. Each worker's CPU while it waits on a spent window: ``/proc/<pid>/stat``
(user + system, 10 ms ticks) read by the sampler; from the first sample that sees the window
spent to the window's last sample; reported as the share of one core, per worker, over all
such spans (and the median per window). Commands per start: ``INFO commandstats`` over the
judged period, the sampler's own commands subtracted.

**Cost.** W1 of ``bench.run`` (N no-op jobs, one worker process at concurrency 1, time from the
add to the last completion, commands per item) without a rate and with a rate far above what
W1 achieves (``--w1-rate``), interleaved, same server, same clone; medians over ``--w1-runs``.

Writes ``<out>/rate_limit.json`` and prints a markdown summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
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

QUEUE = "rl"
#: How often the sampler reads the window record and the workers' CPU (s).
SAMPLE_EVERY = 0.005
TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    """User + system ticks of process ``pid`` (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


class Sampler(threading.Thread):
    """Reads (server ms, window start, count, each worker's CPU ticks) every
    :data:`SAMPLE_EVERY` s until stopped."""

    def __init__(self, url: str, key: str, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.r = redis.Redis.from_url(url)
        self.key, self.pids = key, pids
        self.samples: list[tuple[int, int, int, list[int]]] = []
        self.stop = threading.Event()
        self.commands = 0

    def run(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        while not self.stop.is_set():
            pipe.time()
            pipe.hmget(self.key, "start", "count")
            (sec, micros), (start, count) = pipe.execute()
            self.commands += 2
            now = sec * 1000 + micros // 1000
            ticks = [cpu_ticks(p) for p in self.pids]
            if start is not None:
                self.samples.append((now, int(start), int(count), ticks))
            time.sleep(SAMPLE_EVERY)
        self.r.close()


def rate_held(url: str, rate: str, workers: int, seconds: float) -> dict[str, Any]:
    limit, window_ms = parse_rate(rate) or (0, 0)
    mq = EchoMQ(url)
    admin = redis.Redis.from_url(url)
    admin.execute_command("FLUSHALL", "SYNC")
    mq.set_rate_limit(QUEUE, rate)
    key = mq.keys.rate_window(QUEUE)
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
            sampler = Sampler(url, key, pids)
            sampler.start()
            mq.queue(QUEUE).add_bulk(range(n))
            sec, micros = admin.time()
            added_ms = sec * 1000 + micros // 1000
            time.sleep(1.0)  # the judged period starts 1 s after the add
            admin.config_resetstat()
            reset_at = sampler.commands
            time.sleep(seconds)
            stats = admin.info("commandstats")
            sampler_commands = sampler.commands - reset_at + 1  # + the first INFO of its read
            sec, micros = admin.time()
            end_ms = sec * 1000 + micros // 1000
            time.sleep(0.2)
            sampler.stop.set()
            sampler.join()
    finally:
        mq.close()
    # -- windows: starts (the window record), completions (the completed index) ----------
    final: dict[int, int] = {}
    for _, start, count, _ in sampler.samples:
        final[start] = max(final.get(start, 0), count)
    first = (added_ms + 1000) // window_ms * window_ms + window_ms
    judged = [s for s in sorted(final) if s >= first and s + window_ms <= end_ms]
    starts = [final[s] for s in judged]
    completions = [
        int(admin.zcount(mq.keys.completed(QUEUE), s, s + window_ms - 1)) for s in judged
    ]
    # -- CPU while waiting on a spent window ----------------------------------------------
    by_window: dict[int, list[tuple[int, int, list[int]]]] = {}
    for now, start, count, ticks in sampler.samples:
        by_window.setdefault(start, []).append((now, count, ticks))
    waiting_ms = 0
    waiting_ticks = [0] * workers
    per_window_share: list[list[float]] = [[] for _ in range(workers)]
    for start in judged:
        rows = by_window.get(start, [])
        spent = [r for r in rows if r[1] >= limit]
        if len(spent) < 2:
            continue
        span = spent[-1][0] - spent[0][0]
        if span <= 0:
            continue
        waiting_ms += span
        for i in range(workers):
            used = spent[-1][2][i] - spent[0][2][i]
            waiting_ticks[i] += used
            per_window_share[i].append(used * 1000 / TICK / span)
    admin.close()
    cmds = Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})
    cmds["time"] -= sampler_commands // 2
    cmds["hmget"] -= sampler_commands // 2
    cmds["info"] -= 1
    total = sum(v for v in cmds.values() if v > 0)
    started_in_period = sum(starts)
    within = [abs(c - limit) <= 0.05 * limit for c in starts]
    return {
        "rate": rate,
        "limit": limit,
        "window_ms": window_ms,
        "workers": workers,
        "seconds": seconds,
        "jobs_added": n,
        "windows_judged": len(judged),
        "starts_per_window": starts,
        "completions_per_window": completions,
        "starts_median": statistics.median(starts) if starts else None,
        "starts_min": min(starts, default=None),
        "starts_max": max(starts, default=None),
        "windows_within_5pct": sum(within),
        "all_within_5pct": all(within) and bool(within),
        "completions_within_5pct": sum(abs(c - limit) <= 0.05 * limit for c in completions),
        "waiting_ms_sampled": waiting_ms,
        "worker_cpu_share_while_waiting": [
            round(t * 1000 / TICK / waiting_ms, 4) if waiting_ms else None for t in waiting_ticks
        ],
        "worker_cpu_share_while_waiting_median_per_window": [
            round(statistics.median(s), 4) if s else None for s in per_window_share
        ],
        "commands_per_start": round(total / started_in_period, 3) if started_in_period else None,
        "top_commands_per_start": {
            k: round(v / started_in_period, 3)
            for k, v in sorted(cmds.items(), key=lambda kv: -kv[1])[:10]
            if v > 0 and started_in_period
        },
    }


def w1_cost(url: str, n: int, runs: int, rate: str) -> dict[str, Any]:
    admin = redis.Redis.from_url(url)
    peer = EchoMQPeer()
    out: dict[str, list[dict[str, Any]]] = {"none": [], rate: []}
    for _ in range(runs):
        for variant in ("none", rate):  # interleaved: the machine's drift hits both alike
            admin.execute_command("FLUSHALL", "SYNC")
            if variant != "none":
                with EchoMQ(url) as mq:
                    mq.set_rate_limit("w1", variant)
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
        "variants": summary,
        "throughput_change_pct": round(100 * (limited["rate"] / base["rate"] - 1), 1),
        "commands_per_item_change": round(
            limited["commands_per_item"] - base["commands_per_item"], 3
        ),
        "raw": out,
    }


def render(doc: dict[str, Any]) -> str:
    held, cost = doc["rate_held"], doc["w1"]
    lines = [
        f"## Rate held: {held['rate']}, {held['workers']} worker processes, {held['seconds']:g} s",
        "",
        f"- windows judged: {held['windows_judged']} (after the first second); starts per "
        f"window median {held['starts_median']}, min {held['starts_min']}, max "
        f"{held['starts_max']}; within 5 % of {held['limit']}: "
        f"{held['windows_within_5pct']} of {held['windows_judged']}",
        f"- completions per window (the completed index, cross-check): within 5 %: "
        f"{held['completions_within_5pct']} of {held['windows_judged']}",
        "- each worker's CPU while waiting on a spent window (share of one core): "
        + ", ".join(f"{s}" for s in held["worker_cpu_share_while_waiting"])
        + f" over {held['waiting_ms_sampled']} ms sampled; median per window: "
        + ", ".join(f"{s}" for s in held["worker_cpu_share_while_waiting_median_per_window"]),
        f"- commands per start: {held['commands_per_start']} "
        f"(top: {held['top_commands_per_start']})",
        "",
        f"## Cost: W1, N = {cost['n']:,}, medians of {cost['runs']} interleaved runs",
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
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--w1-n", type=int, default=20_000)
    parser.add_argument("--w1-runs", type=int, default=3)
    parser.add_argument("--w1-rate", default="1000000/s", help="far above what W1 achieves")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "raw")
    args = parser.parse_args(argv)
    server = EmbeddedServer(appendonly=False).start()
    try:
        doc = {
            "rate_held": rate_held(server.url, args.rate, args.workers, args.seconds),
            "w1": w1_cost(server.url, args.w1_n, args.w1_runs, args.w1_rate),
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
