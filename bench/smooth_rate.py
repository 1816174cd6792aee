"""A rate limit that does not burst (issue 50 item 4): the most starts in any sliding span of
the window, and the overall rate, as the server timed the claims.

Usage (from the repository root, in the bench venv)::

    python bench/smooth_rate.py                       # 100/s, 3 worker processes, 30 s
    python bench/smooth_rate.py --seconds 5           # a smoke run
    python bench/smooth_rate.py --out bench/results/issue50 --label after

Self-contained (it imports nothing from ``bench``, and only ``EchoMQ``, ``Worker`` and
``EmbeddedServer`` from the library), so the same file measures another commit: run it with
``PYTHONPATH`` pointed at a clone of that commit (the fixed window of ``main`` before GCRA:
``--label before``).

**What runs.** One embedded Valkey; the queue ``smooth`` gets ``--rate``; enough jobs for the
run are added at once; then ``--workers`` worker processes (this file's ``worker`` mode:
threaded ``Worker``, concurrency 1, no Pump) start - after the add, as a fleet that starts
on a backlog does - and run ``--seconds`` from the add; then they are stopped.

**How a start is timed.** On the server, by the claim itself: a claim scores each job it
leases in the queue's ``active`` at (the server's clock at the claim, in ms + the lease), so
the handler reads that score back (one script: ZSCORE, then RPUSH of the claim's ms to a
list - nothing client-side is timed). The lease is 600 s and the worker's lease check of
buffered jobs is off, so no heartbeat has moved the score yet. A start here is a claim (a
job that waits in a worker's buffer has started, as far as a vendor is concerned, only when
its handler runs - later, never earlier, so counting claims cannot hide a burst of handler
calls that the claims did not have: the buffer can only spread them or bunch them by its own
delay, which is not the limit's).

**What is reported.** The most starts in any span ``[t, t + window)`` (sliding: every start
point; the span holding the most can be moved to begin at one of them), the number of starts
in the clock-aligned windows too (max), the smallest gap between consecutive starts, and the
overall rate as a multiple of the limit: ``(starts - 1) / (last - first)``, in starts per
window, over ``limit``.

Writes ``<out>/smooth_rate_<label>.json`` and ``.md`` and prints the markdown summary.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

QUEUE = "smooth"
STARTS = "bench:smooth:starts"
LEASE = 600.0
#: One script per handled job: its claim time from its ``active`` score, to the list.
RECORD = """
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], string.format('%d %s', tonumber(s) - tonumber(ARGV[2]), ARGV[3]))
return 1
"""


def run_worker(url: str) -> None:
    """A worker process: handles ``smooth`` jobs by recording each one's claim time."""
    from echomq_core import EchoMQ, Job, Worker

    mq = EchoMQ(url)
    r = redis.Redis.from_url(url)
    record = r.register_script(RECORD)
    active, pid, lease_ms = mq.keys.active(QUEUE), os.getpid(), int(LEASE * 1000)

    def handle(job: Job) -> None:
        record(keys=[active, STARTS], args=[job.id, lease_ms, pid])

    worker = Worker(mq, {QUEUE: handle}, concurrency=1, lease=LEASE, pump=False)
    worker.recheck = float("inf")  # a buffered job's lease check would move its score
    worker.run()


def most_in_a_window(times: list[int], window_ms: int) -> int:
    """The most of ``times`` (ms, sorted) in any span ``[t, t + window_ms)``."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= window_ms:
            first += 1
        most = max(most, last - first + 1)
    return most


def measure(url: str, rate: str, workers: int, seconds: float, burst: int) -> dict[str, Any]:
    from echomq_core import EchoMQ
    from echomq_core.control.rates import parse_rate

    limit, window_ms = parse_rate(rate) or (0, 0)
    admin = redis.Redis.from_url(url)
    admin.execute_command("FLUSHALL", "SYNC")
    n = int(limit * seconds * 1000 / window_ms * 2.5) + limit
    with EchoMQ(url) as mq:
        # no burst argument for 1: the same call runs against a commit before bursts
        mq.set_rate_limit(QUEUE, rate, *([burst] if burst > 1 else []))
        mq.queue(QUEUE, lease=LEASE).add_bulk(range(n))
    sec, micros = admin.time()
    added_ms = sec * 1000 + micros // 1000
    began = time.monotonic()
    argv = [sys.executable, os.path.abspath(__file__), "worker", url]
    procs = [subprocess.Popen(argv) for _ in range(workers)]
    try:
        time.sleep(max(0.0, seconds - (time.monotonic() - began)))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    rows = [x.decode().split() for x in admin.lrange(STARTS, 0, -1)]
    admin.close()
    times = sorted(int(at) for at, _ in rows)
    by_worker = Counter(pid for _, pid in rows)
    fixed = Counter(at // window_ms for at in times)
    span = times[-1] - times[0] if len(times) > 1 else 0
    per_window = (len(times) - 1) * window_ms / span if span else None
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "rate": rate,
        "burst": burst,
        "limit": limit,
        "window_ms": window_ms,
        "workers": workers,
        "seconds": seconds,
        "jobs_added": n,
        "starts": len(times),
        "starts_by_worker": sorted(by_worker.values()),
        "first_start_after_add_ms": times[0] - added_ms if times else None,
        "span_ms": span,
        "max_in_sliding_window": most_in_a_window(times, window_ms),
        # spans that begin at a start and hold limit + 1 starts
        "sliding_windows_over_limit": sum(
            1 for i in range(len(times) - limit) if times[i + limit] - times[i] < window_ms
        ),
        "max_in_clock_window": max(fixed.values(), default=0),
        "min_gap_ms": min(gaps, default=None),
        "overall_per_window": round(per_window, 2) if per_window else None,
        "overall_x_limit": round(per_window / limit, 4) if per_window else None,
    }


def render(doc: dict[str, Any], label: str) -> str:
    return "\n".join(
        [
            f"## {label}: {doc['rate']}"
            + (f" burst {doc['burst']}" if doc["burst"] > 1 else "")
            + f", {doc['workers']} worker processes, {doc['seconds']:g} s",
            "",
            f"- starts: {doc['starts']:,} (per worker: {doc['starts_by_worker']}), the first "
            f"{doc['first_start_after_add_ms']} ms after the add, over {doc['span_ms']:,} ms",
            f"- most starts in any sliding {doc['window_ms']} ms: "
            f"**{doc['max_in_sliding_window']}** (limit {doc['limit']}); starts beginning a "
            f"span of {doc['window_ms']} ms over the limit: {doc['sliding_windows_over_limit']}",
            f"- most in a clock-aligned window: {doc['max_in_clock_window']}; smallest gap "
            f"between consecutive starts: {doc['min_gap_ms']} ms",
            f"- overall: {doc['overall_per_window']} starts per window = "
            f"**{doc['overall_x_limit']}x** the limit",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["worker"]:
        run_worker(args_in[1])
        return
    from echomq_core.server import EmbeddedServer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="100/s")
    parser.add_argument("--burst", type=int, default=1)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--label", default="after")
    parser.add_argument("--out", type=Path, default=Path("bench/results/raw"))
    args = parser.parse_args(args_in)
    server = EmbeddedServer(appendonly=False).start()
    try:
        doc = measure(server.url, args.rate, args.workers, args.seconds, args.burst)
    finally:
        server.stop()
    import echomq_core

    doc["library"] = str(Path(echomq_core.__file__).parent.parent)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"smooth_rate_{args.label}.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = render(doc, args.label)
    (args.out / f"smooth_rate_{args.label}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
