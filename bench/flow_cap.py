"""A flow's concurrency cap (issue 28): is it held, what throughput does it give, what does it
cost - on an embedded server.

    python -m bench.flow_cap [--children 20000] [--cap 50] [--workers 4] [--concurrency 50]
                             [--handler-ms 20] [--flush-after 0.02] [--cost-only]

* **Cap held**: a barrier flow of N children with ``max_running=K``, worked by W worker
  processes of concurrency C (W x C slots, more than K) whose handler sleeps ``handler_ms``.
  A sampler reads ``ZCARD active`` of the child queue every 10 ms from the first start to the
  release: the largest sample must be <= K. Throughput (children / s from the first start to
  the release) is compared with the ideal K x (1 / handler time).
* **Cost**: commands per child (INFO commandstats, commands run inside scripts included) of
  adding the same flow and working it off in process (claim 500 / complete / Pump tick), with
  no cap and with the cap. ``--cost-only`` measures the no-cap figure alone, so the same file
  can be run against another checkout (``PYTHONPATH=<checkout>``) for a before/after figure.

Prints one JSON object and, unless ``--cost-only``, writes bench/results/issue28/flow_cap.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

from echomq_core import Child, EchoMQ, Pump
from echomq_core.server import EmbeddedServer

RESULTS = Path(__file__).resolve().parent / "results" / "issue28" / "flow_cap.json"
PARENTS, WORK = "cap-parents", "cap-work"


def worker_main(
    url: str, prefix: str, concurrency: int, handler_ms: int, flush_after: float, stop: Any
) -> None:
    """One worker process: the child queue's handler sleeps ``handler_ms``."""
    from echomq_core import Worker

    def handle(job: Any) -> Any:
        time.sleep(handler_ms / 1000)
        return job.payload

    mq = EchoMQ(url, prefix=prefix)
    worker = Worker(
        mq, {WORK: handle}, concurrency=concurrency, poll=0.05, flush_after=flush_after
    ).start()
    stop.wait()
    worker.stop()
    mq.close()


def cap_held(url: str, args: argparse.Namespace) -> dict[str, Any]:
    mq = EchoMQ(url, prefix="held")
    kids = [Child(i, queue=WORK) for i in range(args.children)]
    cap = args.cap or None  # --cap 0: the same run without a cap (the baseline)
    ref = mq.add_flow(PARENTS, kids, barrier=True, max_running=cap)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [
        ctx.Process(
            target=worker_main,
            args=(url, "held", args.concurrency, args.handler_ms, args.flush_after, stop),
        )
        for _ in range(args.workers)
    ]
    for p in procs:
        p.start()
    r = mq.connection.client
    active, pending = mq.keys.active(WORK), mq.keys.pending(WORK)
    samples: list[int] = []
    pump = Pump(mq, [PARENTS, WORK])  # the flow is cross-queue: its signals need a Pump
    try:
        while r.zcard(active) == 0:  # the first start
            time.sleep(0.001)
        started = time.perf_counter()
        next_sample = started
        while mq.dependencies(PARENTS, ref.parent_id) > 0:
            now = time.perf_counter()
            if now >= next_sample:
                samples.append(int(r.zcard(active)))
                next_sample += 0.010
            pump.tick()
            time.sleep(max(0.0, next_sample - time.perf_counter()))
        wall = time.perf_counter() - started
    finally:
        stop.set()
        for p in procs:
            p.join(30)
        pump.release_leases()
    assert r.zcard(pending) == 0
    ideal = (args.cap or args.workers * args.concurrency) * 1000 / args.handler_ms
    return {
        "children": args.children,
        "max_running": cap,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "slots": args.workers * args.concurrency,
        "handler_ms": args.handler_ms,
        "flush_after_s": args.flush_after,
        "samples": len(samples),
        "max_leased": max(samples),
        "mean_leased": round(sum(samples) / len(samples), 1),
        "wall_s": round(wall, 3),
        "throughput_per_s": round(args.children / wall, 1),
        "ideal_per_s": ideal,
        "of_ideal": round(args.children / wall / ideal, 3),
    }


def commands(mq: EchoMQ) -> int:
    info = mq.connection.client.info("commandstats")
    return sum(int(v["calls"]) for v in info.values())


def cost(url: str, n: int, cap: int | None) -> dict[str, Any]:
    """Commands per child and seconds of adding a flow of n children and working it off."""
    mq = EchoMQ(url, prefix=f"cost{cap or 0}")
    kids = [Child(i, queue=WORK) for i in range(n)]
    extra = {} if cap is None else {"max_running": cap}
    mq.connection.client.config_resetstat()
    t0 = time.perf_counter()
    ref = mq.add_flow(PARENTS, kids, barrier=True, **extra)
    add_s = time.perf_counter() - t0
    add_calls = commands(mq)
    mq.connection.client.config_resetstat()
    q, pump = mq.queue(WORK), Pump(mq, [PARENTS, WORK])
    t0 = time.perf_counter()
    while jobs := q.claim(500):
        q.complete_many([(j, j.payload) for j in jobs])
        pump.tick()
    while mq.dependencies(PARENTS, ref.parent_id) > 0:
        pump.tick()
    run_s = time.perf_counter() - t0
    run_calls = commands(mq)
    pump.release_leases()
    mq.close()
    return {
        "cap": cap,
        "add_commands_per_child": round(add_calls / n, 3),
        "run_commands_per_child": round(run_calls / n, 3),
        "add_s": round(add_s, 3),
        "run_s": round(run_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=20_000)
    parser.add_argument("--cap", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--handler-ms", type=int, default=20)
    parser.add_argument(
        "--flush-after",
        type=float,
        default=0.02,
        help="the workers' flush_after (s): a finished child holds its token until recorded",
    )
    parser.add_argument("--cost-only", action="store_true")
    args = parser.parse_args()
    server = EmbeddedServer().start()
    try:
        if args.cost_only or not args.cap:
            held = {} if args.cost_only else {"cap_held": cap_held(server.url, args)}
            print(json.dumps({**held, "uncapped": cost(server.url, args.children, None)}))
            return
        out = {
            "cap_held": cap_held(server.url, args),
            "cost": [
                cost(server.url, args.children, None),
                cost(server.url, args.children, args.cap),
            ],
        }
    finally:
        server.stop()
    text = json.dumps(out, indent=2)
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text + "\n")


if __name__ == "__main__":
    main()
