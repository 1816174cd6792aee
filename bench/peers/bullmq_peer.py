"""BullMQ for Python under the benchmark workloads, and its worker / reader processes.

Configuration: library defaults (jobs kept after completion: ``removeOnComplete`` unset; the
events stream at its default cap), one worker process running one ``Worker`` per queue with
``concurrency`` C (async processors; the harness's ``--concurrency``, default 1, BullMQ's own).
Flows are added with ``FlowProducer.add`` (one MULTI/EXEC); the parent job is processed by the
worker and reads its children with ``job.getChildrenValues()`` - BullMQ's fan-in. Cross-queue
(W3): the parent in its own queue, served by a second ``Worker`` in the same process.

Processes: ``python -m bench.peers.bullmq_peer worker URL QUEUE[,QUEUE] CONCURRENCY`` and
``python -m bench.peers.bullmq_peer read URL QUEUE PARENT_ID MODE`` (MODE: baseline, whole).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from typing import Any

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

MODULE = "bench.peers.bullmq_peer"


def _version() -> str:
    try:
        import bullmq

        return str(bullmq.__version__)
    except ImportError:
        return "not installed"


def _timeout(n: int) -> float:
    return max(120.0, n / 20)


def _worker(url: str, queues: str, concurrency: int) -> Proc:
    args = ["worker", url, queues, str(concurrency)]
    return Proc(MODULE, args, name="bullmq-worker").wait_ready(settle=0.5)


class BullMQPeer(Peer):
    name = "bullmq"
    version = _version()
    config = (
        "defaults (completed jobs kept, events stream capped at its default); 1 worker "
        "process, Worker concurrency=C; FlowProducer.add, the parent job "
        "runs on the worker and reads getChildrenValues(); W3 parent queue served by a "
        "second Worker in the same process; W6 processors await asyncio.sleep(0.05)"
    )
    full_sizes = {"W5": [20_000]}
    notes = {
        "W4": "n/a (no outbox): a child's completion script updates its parent directly, "
        "whatever its queue, so there is no delivery stage to time",
        "W5": "one run at 20,000 children (200,000 would take about 6 min a run at the W2 rate; "
        "rate, commands and memory per child are flat in N, see W2); the reader has no "
        "paged API (getChildrenValues reads the whole hash)",
    }

    def w1(self, url: str, n: int) -> dict[str, Any]:
        return asyncio.run(self._flat(url, n, "w1", "noop"))

    def w6(self, url: str, n: int) -> dict[str, Any]:
        return asyncio.run(self._flat(url, n, "w6", "io"))

    async def _flat(self, url: str, n: int, name: str, kind: str) -> dict[str, Any]:
        from bullmq import Queue

        win = Window(url)
        queue = Queue(name, {"connection": url})
        try:
            with Stopper() as procs:
                worker = procs.add(_worker(url, name, self.concurrency))
                win.begin()
                await queue.addBulk([{"name": kind, "data": {"i": i}} for i in range(n)])
                win.split("added")
                await _wait_for(
                    win,
                    lambda: reached(win.cmd("ZCARD", f"bull:{name}:completed"), n),
                    n,
                    f"{n} completions",
                    worker,
                )
                measure = win.end()
            return result(measure, n=n, unit="jobs")
        finally:
            await queue.close()
            win.close()

    def fan_in(self, url: str, n: int, parent_q: str, child_q: str) -> dict[str, Any]:
        return asyncio.run(self._fan_in(url, n, parent_q, child_q))

    def w4(self, url: str, n: int) -> dict[str, Any]:
        raise Unsupported(self.notes["W4"])

    def w5(self, url: str, n: int) -> dict[str, Any]:
        record = asyncio.run(self._fan_in(url, n, "w5", "w5", read=True))
        return record

    async def _fan_in(
        self, url: str, n: int, parent_q: str, child_q: str, read: bool = False
    ) -> dict[str, Any]:
        from bullmq import FlowProducer

        win = Window(url)
        producer = FlowProducer({"connection": url})
        queues = parent_q if parent_q == child_q else f"{child_q},{parent_q}"
        try:
            with Stopper() as procs:
                worker = procs.add(_worker(url, queues, self.concurrency))
                win.begin()
                tree = await producer.add(
                    {
                        "name": "parent",
                        "queueName": parent_q,
                        "data": {},
                        "children": [
                            {"name": "child", "queueName": child_q, "data": {"i": i}}
                            for i in range(n)
                        ],
                    }
                )
                added = win.split("added")
                parent_id = tree["job"].id
                await _wait_for(
                    win,
                    lambda: _parent_done(win, parent_q, child_q, parent_id),
                    n,
                    "the parent's completion",
                    worker,
                )
                settled = win.split("released")
                measure = win.end()
            raw = win.r.hget(f"bull:{parent_q}:{parent_id}", "returnvalue")
            read_back = json.loads(raw) if raw else {}
            if read_back.get("count") != n or read_back.get("sum") != n * (n - 1):
                raise BenchError(f"the parent read {read_back}, expected {n} results")
            extra: dict[str, Any] = {}
            if read:
                base = _read(url, parent_q, parent_id, "baseline")
                whole = _read(url, parent_q, parent_id, "whole")
                if whole["count"] != n:
                    raise BenchError(f"reader got {whole['count']} results, expected {n}")
                extra = {
                    "add_seconds": round(added, 4),
                    "settle_seconds": round(settled - added, 4),
                    "reader": {
                        "method": "peak RSS (VmHWM) of a fresh process; baseline: "
                        "same imports and connection, no read",
                        "baseline_kib": base["maxrss_kib"],
                        "whole_kib": whole["maxrss_kib"],
                        "whole_delta_kib": whole["maxrss_kib"] - base["maxrss_kib"],
                        "paged_all_kib": None,
                        "note": "no paged read API",
                    },
                }
            return result(measure, n=n, unit="children", **extra)
        finally:
            await producer.close()
            win.close()


async def _wait_for(win: Window, done: Any, n: int, what: str, worker: Proc) -> None:
    """As :meth:`Window.wait_for` with a stall limit, without blocking the event loop."""
    deadline = time.monotonic() + _timeout(n)
    last, changed = None, time.monotonic()
    while (value := done()) is not True:
        now = time.monotonic()
        worker.check_alive()
        if value != last:
            last, changed = value, now
        if now > deadline:
            raise BenchError(f"timed out waiting for {what}")
        if now - changed > STALL:
            raise BenchError(
                f"no progress for {STALL:.0f}s (stuck at {last!r}) waiting for {what}; "
                f"worker: {worker.tail(5)}"
            )
        await asyncio.sleep(0.01)


def _parent_done(win: Window, parent_q: str, child_q: str, parent_id: str) -> int | bool:
    """True once the parent job completed; until then the children completed (progress)."""
    if win.cmd("ZSCORE", f"bull:{parent_q}:completed", parent_id) is not None:
        return True
    return int(win.cmd("ZCARD", f"bull:{child_q}:completed"))


def _read(url: str, queue: str, parent_id: str, mode: str) -> dict[str, Any]:
    args = ["read", url, queue, parent_id, mode]
    return Proc(MODULE, args, name=f"bullmq-read-{mode}").json_result()


# -- processes ------------------------------------------------------------------------------


async def _process(job: Any, token: str) -> Any:
    if job.name == "parent":
        values = await job.getChildrenValues()
        return {"count": len(values), "sum": sum(values.values())}
    if job.name == "noop":
        return None
    if job.name == "io":
        await asyncio.sleep(IO_WAIT)
        return None
    return job.data["i"] * 2


async def run_worker(url: str, queues: str, concurrency: int) -> None:
    from bullmq import Worker

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    workers = [
        Worker(q, _process, {"connection": url, "concurrency": concurrency})
        for q in queues.split(",")
    ]
    await asyncio.sleep(0.2)
    print(READY, flush=True)
    await stop.wait()
    for worker in workers:
        await worker.close()


async def run_reader(url: str, queue_name: str, parent_id: str, mode: str) -> None:
    from bullmq import Job, Queue

    queue = Queue(queue_name, {"connection": url})
    job = await Job.fromId(queue, parent_id)
    count, total = 0, 0
    if mode == "whole":
        values = await job.getChildrenValues()
        count, total = len(values), sum(values.values())
    await queue.close()
    print(json.dumps({"mode": mode, "count": count, "sum": total, "maxrss_kib": peak_rss_kib()}))


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        asyncio.run(run_worker(argv[1], argv[2], int(argv[3])))
    elif argv[:1] == ["read"]:
        asyncio.run(run_reader(*argv[1:5]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
