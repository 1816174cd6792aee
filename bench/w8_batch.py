"""W8: batch handlers (issue 31 item 4) - one call per item against one call per 256 items.

A handler whose call costs 2 ms plus 10 us per item (a bulk insert, a model scoring rows: a
fixed price per call, a small one per row), modelled as a wait (``time.sleep``; Node:
``setTimeout``), so the figure is the queue's and not the GIL's. N jobs are added in one bulk
call inside the window (as W1), and the window ends when all N are completed:

* ``echomq-b1``: ``Worker(concurrency=C)``, a handler per job (each call 2.01 ms);
* ``echomq-b256``: the same worker with ``batch=256``: a call takes up to 256 jobs of the
  queue and costs 2 ms + 10 us x its jobs;
* ``bullmq_node``: BullMQ for Node, ``Worker`` concurrency C, its processor per job (2 ms +
  10 us there too, as the work runs per job; Node's timers round 2.01 ms down to 2 ms).

Each figure: jobs/s over the window (add included, as W1) and after the add returned, Redis
commands per job from ``INFO commandstats`` (harness probes subtracted,
:class:`~bench.common.Window`), and CPU per job. One embedded Valkey, flushed before every
run; configurations interleaved per round.

Usage (repository root)::

    python -m bench.w8_batch --n 200000 --rounds 1            # the issue's size
    python -m bench.w8_batch --n 20000 --rounds 3             # rounds for medians
    python -m bench.w8_batch --only echomq-b1,echomq-b256     # without the Node peer
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from echomq_core import EchoMQ, Job, Worker
from echomq_core.server import EmbeddedServer

from .common import READY, REPO, STALL, BenchError, Proc, Stopper, Window, reached, result
from .peers.bullmq_node_peer import _node
from .peers.bullmq_node_peer import _version as node_version
from .run import git_state, machine

MODULE = "bench.w8_batch"
QUEUE = "w8"
#: A call's fixed cost and its cost per item (s).
COST_CALL = 0.002
COST_ITEM = 0.00001
CONFIGS = ("echomq-b1", "echomq-b256", "bullmq_node")
OUT = REPO / "bench" / "results" / "issue31" / "w8"


def _timeout(n: int) -> float:
    return max(120.0, n / 50)


# -- the EchoMQ worker process ------------------------------------------------------------


def one(job: Job) -> None:
    time.sleep(COST_CALL + COST_ITEM)


def batch(jobs: list[Job]) -> list[None]:
    time.sleep(COST_CALL + COST_ITEM * len(jobs))
    return [None] * len(jobs)


def run_worker(url: str, size: str, concurrency: str) -> None:
    mq = EchoMQ(url)
    handler: Any = batch if int(size) > 1 else one
    worker = Worker(mq, {QUEUE: handler}, concurrency=int(concurrency), batch=int(size))
    print(READY, flush=True)
    worker.run()


# -- the runs -----------------------------------------------------------------------------


def echomq_run(url: str, n: int, size: int, concurrency: int) -> dict[str, Any]:
    mq, win = EchoMQ(url), Window(url)
    queue = mq.queue(QUEUE)
    completed = win.counted(lambda: queue.stats()["completed"])
    try:
        with Stopper() as procs:
            worker = procs.add(
                Proc(MODULE, ["worker", url, str(size), str(concurrency)], name="w8-worker")
            ).wait_ready(settle=0.3)
            win.begin()
            queue.add_bulk(range(n))
            win.split("added")
            at_add = completed()
            win.wait_for(
                lambda: reached(completed(), n),
                timeout=_timeout(n),
                what=f"{n} completions",
                procs=[worker],
                stall=STALL,
            )
            measure = win.end()
        stats = queue.stats()
        if stats["completed"] != n or stats["pending"] or stats["active"]:
            raise BenchError(f"w8 incomplete: {stats}")
        return result(measure, n=n, unit="jobs", **_after_add(measure, n, at_add))
    finally:
        mq.close()
        win.close()


def bullmq_run(url: str, n: int, concurrency: int) -> dict[str, Any]:
    win = Window(url)
    try:
        with Stopper() as procs:
            worker = procs.add(_node("worker", url, QUEUE, str(concurrency)))
            driver = procs.add(_node("driver", url, QUEUE))
            win.begin()
            driver.send(json.dumps({"op": "bulk", "queue": QUEUE, "n": n, "name": "cost"}))
            driver.wait_line("ADDED", _timeout(n))
            win.split("added")
            at_add = int(win.cmd("ZCARD", f"bull:{QUEUE}:completed"))
            win.wait_for(
                lambda: reached(int(win.cmd("ZCARD", f"bull:{QUEUE}:completed")), n),
                timeout=_timeout(n),
                what=f"{n} completions",
                procs=[worker, driver],
                stall=STALL,
            )
            measure = win.end()
        return result(measure, n=n, unit="jobs", **_after_add(measure, n, at_add))
    finally:
        win.close()


def _after_add(measure: Any, n: int, at_add: int) -> dict[str, Any]:
    """The rate once the add returned: (jobs completed after it) / (seconds after it), so a
    slow add (the server shares 2 cores with the worker) does not hide the handlers' rate."""
    after = measure.seconds - measure.splits["added"]
    return {
        "completed_at_add": at_add,
        "rate_after_add": round((n - at_add) / after, 1) if after > 0 else None,
    }


def run_one(config: str, url: str, n: int, concurrency: int) -> dict[str, Any]:
    redis.Redis.from_url(url).flushall()
    if config == "bullmq_node":
        return bullmq_run(url, n, concurrency)
    return echomq_run(url, n, int(config.removeprefix("echomq-b")), concurrency)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration and N: the median (and range) of jobs/s and of commands per job."""
    out: dict[str, Any] = {}
    for key in sorted({(r["config"], r["n"]) for r in runs}):
        mine = [r for r in runs if (r["config"], r["n"]) == key]
        rates = [r["rate"] for r in mine]
        after = [r["rate_after_add"] for r in mine]
        cmds = [r["commands_per_item"] for r in mine]
        cpu = [r["cpu_us_per_item"]["total"] for r in mine]
        out[f"{key[0]}@{key[1]}"] = {
            "runs": len(mine),
            "rate_median": statistics.median(rates),
            "rate_range": [min(rates), max(rates)],
            "rate_after_add_median": statistics.median(after),
            "commands_per_job_median": statistics.median(cmds),
            "cpu_us_per_job_median": statistics.median(cpu),
        }
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["worker"]:
        run_worker(*argv[1:4])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.w8_batch")
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--only", default=",".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--tag", default="", help="file name tag (default: n and rounds)")
    args = parser.parse_args(argv)
    configs = [c for c in args.only.split(",") if c]
    server = EmbeddedServer(appendonly=False).start()
    runs: list[dict[str, Any]] = []
    try:
        for rnd in range(args.rounds):
            for config in configs:
                started = time.monotonic()
                record = run_one(config, server.url, args.n, args.concurrency)
                record.update(config=config, round=rnd + 1)
                runs.append(record)
                print(
                    f"round {rnd + 1} {config:12} n={args.n}: {record['rate']:>9,.0f} jobs/s "
                    f"({record['rate_after_add']:,.0f} after the add), "
                    f"{record['commands_per_item']:.3f} commands/job, "
                    f"{record['cpu_us_per_item']['total']:.0f} us CPU/job "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
    finally:
        server.stop()
    doc = {
        "workload": "W8: batch handlers, a call costs 2 ms + 10 us per item (a wait)",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "note": "a 2-core VM shared with other work (other sessions' builds and tests)",
        "echomq": git_state(),
        "bullmq_node": node_version(),
        "n": args.n,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "runs": runs,
        "summary": summary(runs),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or f"n{args.n}-r{args.rounds}"
    path = args.out / f"w8-{tag}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["summary"], indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
