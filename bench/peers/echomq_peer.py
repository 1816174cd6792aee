"""EchoMQ under the benchmark workloads, and its worker / reader processes.

Configuration: the library defaults (``keep_completed=True``, lease 30 s, JSON), one worker
process ``Worker(mq, {queue: handler}, concurrency=C)`` (its fetcher claims adaptive batches of
up to 500 for the C runner threads; its flusher records their results); ``echomq_async``: the
same with ``AsyncWorker`` (one event loop, C handler tasks, async handlers). Fan-in results are
read the way the orchestrator adapters read them: the adding process waits for the parent's
release and reads ``children_values`` (W5: in pages, in a fresh process). Cross-queue fan-in
(W3) is carried by a Pump thread in the adding process.

Processes: ``python -m bench.peers.echomq_peer worker URL QUEUE[,QUEUE] CONCURRENCY MODE``
(MODE: threaded, async) and ``python -m bench.peers.echomq_peer read URL QUEUE PARENT_ID MODE``
(MODE: baseline, page, paged, whole; prints one JSON line with the peak RSS of the process).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import echomq_core
from echomq_core import Child, EchoMQ, Job, JobSpec, Pump, Worker

from ..common import (
    READY,
    STALL,
    BenchError,
    Proc,
    Stopper,
    Window,
    peak_rss_kib,
    reached,
    result,
)
from . import IO_WAIT, Peer, Unsupported

MODULE = "bench.peers.echomq_peer"
#: W5 reads in pages of this many results (HSCAN COUNT).
PAGE = 5000


def _timeout(n: int) -> float:
    return max(60.0, n / 100)


def _worker(url: str, queues: str, concurrency: int, mode: str, ready: bool = True) -> Proc:
    """A worker process; with ``ready``, once it is constructed and connected (else at once:
    a worker started after the add, whose start-up is timed)."""
    proc = Proc(MODULE, ["worker", url, queues, str(concurrency), mode], name="echomq-worker")
    return proc.wait_ready() if ready else proc


def _expected_sum(n: int) -> int:
    return n * (n - 1)  # child i returns 2 * i


#: ECHOMQ_BENCH_GROUPS=K gives W1's jobs and W2/W3's children fairness groups k0..k(K-1), in
#: turn (issue 50's cost of groups that bind nothing: bench/cpu_ab.py --b-env); unset: none.
#: ECHOMQ_BENCH_KEYED=K instead makes every payload a mapping {"n": i, "tenant": "k<i % K>"}
#: and, with ECHOMQ_BENCH_RULE=1, the queues take the group from "tenant" (set_group_rule):
#: run both sides keyed, only B with the rule, for the cost of the rule and the groups alone.
GROUPS = int(os.environ.get("ECHOMQ_BENCH_GROUPS", "0"))
KEYED = int(os.environ.get("ECHOMQ_BENCH_KEYED", "0"))
RULE = os.environ.get("ECHOMQ_BENCH_RULE") == "1"


def _payload(i: int) -> Any:
    return {"n": i, "tenant": f"k{i % KEYED}"} if KEYED else i


def _rule(mq: EchoMQ, *queues: str) -> None:
    """The group rule of ECHOMQ_BENCH_RULE, set before the measuring window."""
    if RULE:
        for queue in queues:
            mq.set_group_rule(queue, "tenant")


def _jobs(n: int) -> Any:
    """W1's jobs: payloads, or with groups (GROUPS) JobSpecs naming them."""
    if GROUPS:
        return [JobSpec(i, group=f"k{i % GROUPS}") for i in range(n)]
    return [_payload(i) for i in range(n)] if KEYED else range(n)


def _children(n: int, queue: str) -> list[Child]:
    """W2/W3's children, with a group each when GROUPS is set."""
    if GROUPS:
        return [Child(i, queue=queue, group=f"k{i % GROUPS}") for i in range(n)]
    return [Child(_payload(i), queue=queue) for i in range(n)]


class EchoMQPeer(Peer):
    name = "echomq"
    mode = "threaded"
    version = echomq_core.__version__
    config = (
        "defaults (keep_completed=True); 1 worker process, Worker(concurrency=C) (C runner "
        "threads; one fetcher claims adaptive batches up to 500, one flusher records the "
        "results); W2/W3/W5 results read by the adding process (wait + children_values; W5 "
        "iter_children_values in pages of 5000); W3 Pump as a thread of the adding process; "
        "W6 handlers time.sleep(0.05)"
    )
    notes = {"W4": "Pump.tick() on one outbox of N completion signals, default page (1000)"}

    late_start = True

    def _worker(self, url: str, queues: str, ready: bool = True) -> Proc:
        return _worker(url, queues, self.concurrency, self.mode, ready)

    def _early(self, procs: Stopper, url: str, queues: str) -> Proc | None:
        """The worker started before the window opens (None: it starts after the add)."""
        return None if self.worker_start == "after" else procs.add(self._worker(url, queues))

    def _late(self, procs: Stopper, url: str, queues: str, worker: Proc | None) -> Proc:
        """The worker, started now (after the add) unless it already runs."""
        return worker or procs.add(self._worker(url, queues, ready=False))

    # -- W1, W6 ---------------------------------------------------------------------------
    def w1(self, url: str, n: int) -> dict[str, Any]:
        return self._flat(url, n, "w1")

    def w6(self, url: str, n: int) -> dict[str, Any]:
        return self._flat(url, n, "w6")

    def _flat(self, url: str, n: int, name: str) -> dict[str, Any]:
        mq, win = EchoMQ(url), Window(url)
        queue = mq.queue(name)
        _rule(mq, name)
        completed = win.counted(lambda: queue.stats()["completed"])
        try:
            with Stopper() as procs:
                early = self._early(procs, url, name)
                win.begin()
                queue.add_bulk(_jobs(n))
                win.split("added")
                worker = self._late(procs, url, name, early)
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
                raise BenchError(f"{name} incomplete: {stats}")
            return result(measure, n=n, unit="jobs")
        finally:
            mq.close()
            win.close()

    # -- W2 / W3 --------------------------------------------------------------------------
    def fan_in(self, url: str, n: int, parent_q: str, child_q: str) -> dict[str, Any]:
        mq, pump_mq, win = EchoMQ(url), EchoMQ(url), Window(url)
        released = win.counted(mq.snapshot, parent_q, "JOB-bench-probe")
        try:
            with Stopper() as procs:
                early = self._early(procs, url, child_q)
                pump = Pump(pump_mq, [child_q]) if parent_q != child_q else None
                if pump is not None:
                    pump.start()
                _rule(mq, child_q)
                try:
                    win.begin()
                    ref = mq.add_flow(parent_q, _children(n, child_q))
                    win.split("added")
                    worker = self._late(procs, url, child_q, early)
                    _wait_released(win, released, parent_q, ref.parent_id, n, worker)
                    win.split("released")
                    values = mq.children_values(parent_q, ref.parent_id)
                    measure = win.end()
                finally:
                    if pump is not None:
                        pump.stop()
            if len(values) != n or sum(values.values()) != _expected_sum(n):
                raise BenchError(f"fan-in read {len(values)} results, expected {n}")
            return result(measure, n=n, unit="children")
        finally:
            mq.close()
            pump_mq.close()
            win.close()

    # -- W4 -------------------------------------------------------------------------------
    def w4(self, url: str, n: int) -> dict[str, Any]:
        mq, win = EchoMQ(url), Window(url)
        try:
            ref = mq.add_flow("w4p", [Child(i, queue="w4c") for i in range(n)])
            queue = mq.queue("w4c")
            while jobs := queue.claim(2000):  # claim() accepts 10,000 but unpack fails > ~4000
                queue.complete_many([(job, job.payload * 2) for job in jobs])
            outbox = queue.stats()["outbox"]
            if outbox != n:
                raise BenchError(f"W4 setup: outbox holds {outbox} signals, expected {n}")
            pump = Pump(mq, ["w4c"])
            ticks = 0
            win.begin()
            while pump.totals.delivered < n:
                pump.tick()
                ticks += 1
                if ticks > n:
                    raise BenchError(f"W4: {pump.totals.delivered} of {n} delivered")
            measure = win.end()
            snap = mq.snapshot("w4p", ref.parent_id)
            if not snap.released or snap.processed != n or queue.stats()["outbox"]:
                raise BenchError(f"W4 incomplete: {snap}")
            return result(measure, n=n, unit="signals", ticks=ticks, page=pump.page)
        finally:
            mq.close()
            win.close()

    # -- W5 -------------------------------------------------------------------------------
    def w5(self, url: str, n: int) -> dict[str, Any]:
        mq, win = EchoMQ(url), Window(url)
        released = win.counted(mq.snapshot, "w5", "JOB-bench-probe")
        try:
            with Stopper() as procs:
                worker = procs.add(self._worker(url, "w5"))
                win.begin()
                ref = mq.add_flow("w5", [Child(i) for i in range(n)])
                added = win.split("added")
                _wait_released(win, released, "w5", ref.parent_id, n, worker)
                settled = win.split("released")
                measure = win.end()
            reads = {
                mode: read_in_process(url, "w5", ref.parent_id, mode)
                for mode in ("baseline", "page", "paged", "whole")
            }
            paged = reads["paged"]
            if paged["count"] < n or reads["whole"]["count"] != n:
                raise BenchError(f"W5 read {paged['count']} results in pages, expected {n}")
            base = reads["baseline"]["maxrss_kib"]
            return result(
                measure,
                n=n,
                unit="children",
                add_seconds=round(added, 4),
                settle_seconds=round(settled - added, 4),
                reader={
                    "method": "peak RSS (VmHWM) of a fresh process; baseline: same imports "
                    "and connection, no read",
                    "page": PAGE,
                    "baseline_kib": base,
                    "one_page_kib": reads["page"]["maxrss_kib"],
                    "paged_all_kib": paged["maxrss_kib"],
                    "whole_kib": reads["whole"]["maxrss_kib"],
                    "paged_all_delta_kib": paged["maxrss_kib"] - base,
                    "whole_delta_kib": reads["whole"]["maxrss_kib"] - base,
                    "paged_seconds": paged["seconds"],
                },
            )
        finally:
            mq.close()
            win.close()


class EchoMQAsyncPeer(EchoMQPeer):
    name = "echomq_async"
    mode = "async"
    config = (
        "as EchoMQ, with AsyncWorker(concurrency=C): one event loop, C handler tasks, async "
        "handlers (W6: await asyncio.sleep(0.05))"
    )
    notes: dict[str, str] = {}

    def w4(self, url: str, n: int) -> dict[str, Any]:
        raise Unsupported("the Pump is the same as EchoMQ's (no worker runs)")

    def w5(self, url: str, n: int) -> dict[str, Any]:
        raise Unsupported("not run (W2 shows the same worker)")


def _wait_released(
    win: Window, snapshot: Any, queue: str, parent_id: str, n: int, worker: Proc
) -> None:
    """What ``mq.wait(queue, parent_id, poll=0.01)`` does, with the polls counted."""

    def released() -> int | bool:
        snap = snapshot(queue, parent_id)
        if snap.parent_state == "failed":
            raise BenchError(f"parent {parent_id} failed: {snap.error}")
        return True if snap.released else snap.dependencies

    win.wait_for(
        released, timeout=_timeout(n), what="the parent's release", procs=[worker], stall=STALL
    )


def read_in_process(url: str, queue: str, parent_id: str, mode: str) -> dict[str, Any]:
    args = ["read", url, queue, parent_id, mode]
    return Proc(MODULE, args, name=f"echomq-read-{mode}").json_result()


# -- processes ------------------------------------------------------------------------------


def _handle(job: Job) -> Any:
    if isinstance(job.payload, dict):  # ECHOMQ_BENCH_KEYED's payloads
        return job.payload["n"] * 2
    return job.payload * 2 if isinstance(job.payload, int) else None


def _noop(job: Job) -> None:
    return None


def _io(job: Job) -> None:
    time.sleep(IO_WAIT)


async def _handle_async(job: Job) -> Any:
    return _handle(job)


async def _noop_async(job: Job) -> None:
    return None


async def _io_async(job: Job) -> None:
    await asyncio.sleep(IO_WAIT)


def _stamp(job: Job) -> float:
    """bench.latency's children: the wall-clock time (ms) at which the handler finished."""
    return time.time() * 1000


SYNC = {"w1": _noop, "w6": _io, "lat": _stamp, "latc": _stamp}
ASYNC = {"w1": _noop_async, "w6": _io_async}


def run_worker(url: str, queues: str, concurrency: str, mode: str) -> None:
    """``ECHOMQ_BENCH_WORKER_PUMP=0``: the worker without its own Pump (the outboxes are left
    to a Pump process, as every worker did before workers drained their queues)."""
    names = queues.split(",")
    pump = os.environ.get("ECHOMQ_BENCH_WORKER_PUMP", "1") != "0"
    if mode == "async":
        from echomq_core import AsyncEchoMQ, AsyncWorker

        async def main() -> None:
            amq = AsyncEchoMQ(url)
            handlers = {q: ASYNC.get(q, _handle_async) for q in names}
            worker = AsyncWorker(amq, handlers, concurrency=int(concurrency), pump=pump)
            await worker.start()  # registers its queues before the window opens
            print(READY, flush=True)
            await worker.run()
            await amq.close()

        asyncio.run(main())
        return
    mq = EchoMQ(url)
    handlers = {q: SYNC.get(q, _handle) for q in names}
    worker = Worker(mq, handlers, concurrency=int(concurrency), pump=pump)
    print(READY, flush=True)
    worker.run()


def run_reader(url: str, queue: str, parent_id: str, mode: str) -> None:
    import time

    mq = EchoMQ(url)
    mq.dependencies(queue, parent_id)  # connect, like every mode
    count, total = 0, 0
    started = time.perf_counter()
    if mode in ("page", "paged"):
        for _, value in mq.iter_children_values(queue, parent_id, page=PAGE):
            count += 1
            total += value
            if mode == "page" and count >= PAGE:
                break
    elif mode == "whole":
        values = mq.children_values(queue, parent_id)
        count, total = len(values), sum(values.values())
    elif mode != "baseline":
        raise SystemExit(f"unknown read mode {mode!r}")
    seconds = time.perf_counter() - started
    mq.close()
    print(
        json.dumps(
            {
                "mode": mode,
                "count": count,
                "sum": total,
                "seconds": round(seconds, 3),
                "maxrss_kib": peak_rss_kib(),
            }
        )
    )


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        run_worker(*argv[1:5])
    elif argv[:1] == ["read"]:
        run_reader(*argv[1:5])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
