"""A success threshold's reaction (issue 28, item 3): from the death that makes ``min_success``
unreachable to the parent failed (and to its unstarted children cancelled), and how many of
the flow's children started after that death.

Usage (from the repository root)::

    python -m bench.flow_threshold                 # N 5,000, 2 workers x concurrency 8, 5 runs
    python -m bench.flow_threshold --n 20000 --runs 7

Per run, on an embedded server: a barrier flow of N children allowing 5 failures; children
100..105 raise (so the sixth death, child 105, tips it); the rest take 2 ms. Two in-process
workers serve the children's queue (cross-queue: the parent lives in another queue, so the
death reaches the parent through the Pump; same-queue: the worker's fail script settles it).
Times are the server's: the tipping child's row ``finished`` (its death) and the parent's row
``finished`` (failed); the follow-up's end is when the harness first sees the row ``stopped``
(polled every 1 ms). Starts are stamped by the handler on the same machine's clock. "Started
after the death" counts children whose handler began after the death, "claimed and started
after the death" those of them taken by a claim sent after the death (not leased at the death:
the goal is none); "after cancelled" those
that began after the follow-up was seen done: what the workers had claimed before the cancel
reached them (their buffers hold up to 500 claimed jobs each; a buffered job is re-checked
before it starts only when it was claimed more than 0.25 s before).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from echomq_core import Child, EchoMQ, Worker
from echomq_core.server import EmbeddedServer

ALLOW = 5
DOOMED = range(100, 100 + ALLOW + 1)


def one(url: str, n: int, cross: bool, run: int) -> dict[str, Any]:
    mq = EchoMQ(url, prefix=f"th{run}{'x' if cross else 's'}")
    work = "th-work"
    parents = "th-parents" if cross else work
    starts: list[tuple[float, str]] = []
    claims: dict[str, float] = {}  # child id -> when the claim that took it was sent
    lock = threading.Lock()

    def handle(job: Any) -> Any:
        with lock:
            starts.append((time.time(), job.id))
        if job.payload in DOOMED:
            raise ValueError(f"bad input {job.payload}")
        time.sleep(0.002)
        return job.payload

    kids = [Child(i, queue=work, max_attempts=1) for i in range(n)]
    ref = mq.add_flow(parents, kids, min_success=n - ALLOW, barrier=True)
    row = mq.keys.job(parents, ref.parent_id)
    workers = [Worker(mq, {work: handle}, concurrency=8) for _ in range(2)]
    for w in workers:
        _spy_claims(w.queues[work], claims, lock)
        w.start()
    try:
        deadline = time.monotonic() + 120
        while True:
            state, stopped = mq.connection.execute([_hmget(row, "state", "stopped")])[0]
            if stopped is not None:
                seen_stopped = time.time()
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run}: not stopped in 120 s (state {state!r})")
            time.sleep(0.001)
    finally:
        for w in workers:
            w.stop()
    error, failed_at = (
        v.decode() for v in mq.connection.execute([_hmget(row, "error", "finished")])[0]
    )
    tipper = error.rsplit("; child ", 1)[1].split(" failed:", 1)[0]
    (died,) = mq.connection.execute([_hmget(mq.keys.job(work, tipper), "finished")])[0]
    died_s = int(died) / 1000
    snap = mq.snapshot(parents, ref.parent_id)
    mq.close()
    return {
        "death_to_failed_ms": int(failed_at) - int(died),
        "death_to_cancelled_ms": round((seen_stopped - died_s) * 1000, 1),
        "started_after_death": sum(1 for t, _ in starts if t > died_s),
        "claimed_and_started_after_death": sum(
            1 for t, i in starts if t > died_s and claims.get(i, 0) > died_s
        ),
        "started_after_cancelled": sum(1 for t, _ in starts if t > seen_stopped),
        "started": len(starts),
        "failed": snap.failed,
    }


def _spy_claims(queue: Any, claims: dict[str, float], lock: threading.Lock) -> None:
    """Note, per child a worker's claim took, when that claim was sent (the claim ran on the
    server after that): a child claimed by a claim sent after the death was not leased at
    the death, so the goal says it must not start."""
    claim_op = queue.claim_op  # the fetcher's claims (routines.claim_turn)

    def spied(count: int, *args: Any, **kwargs: Any) -> Any:
        sent = time.time()
        jobs = yield from claim_op(count, *args, **kwargs)
        with lock:
            for job in jobs:
                claims[job.id] = sent
        return jobs

    queue.claim_op = spied


def _hmget(key: str, *fields: str) -> Any:
    from echomq_core.wire.calls import Call

    return Call.cmd("HMGET", key, *fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    server = EmbeddedServer().start()
    report: dict[str, Any] = {"n": args.n, "allowed": ALLOW, "workers": "2 x concurrency 8"}
    try:
        for cross in (False, True):
            name = "cross-queue" if cross else "same-queue"
            runs = [one(server.url, args.n, cross, i) for i in range(args.runs)]
            report[name] = {
                "runs": runs,
                "median": {
                    key: statistics.median(r[key] for r in runs)
                    for key in (
                        "death_to_failed_ms",
                        "death_to_cancelled_ms",
                        "started_after_death",
                        "claimed_and_started_after_death",
                        "started_after_cancelled",
                    )
                },
            }
            print(name, json.dumps(report[name]["median"]))
    finally:
        server.stop()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
