"""RQ under the benchmark workloads, and its worker process.

Configuration: library defaults (``result_ttl`` 500 s, so finished jobs and their results are
kept for the run), jobs added in bulk with ``Queue.enqueue_many``; one worker process of
class :data:`WORKER_CLASS` (``SimpleWorker`` runs jobs in the worker process itself; RQ's
default ``Worker`` forks a child per job, several times slower for no-op jobs - set
``BENCH_RQ_WORKER=Worker`` to measure it). Fan-in: the parent is enqueued with
``depends_on`` the list of its children, runs once they have all finished and reads their
results (``fetch_dependencies`` + ``return_value``). Cross-queue (W3): the children in one
queue, the parent in another, one worker listening on both.

RQ is the slowest peer, so its fan-in runs at two smaller sizes (to show that its cost per
child does not depend on N) rather than at 10,000.

Process: ``python -m bench.peers.rq_peer worker URL QUEUE[,QUEUE] CLASS``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import redis

from ..common import READY, STALL, BenchError, Proc, Stopper, Window, reached, result
from . import Peer, Unsupported

MODULE = "bench.peers.rq_peer"
WORKER_CLASS = os.environ.get("BENCH_RQ_WORKER", "SimpleWorker")


def _version() -> str:
    try:
        import rq

        return str(rq.__version__)
    except ImportError:
        return "not installed"


def _timeout(n: int) -> float:
    return max(120.0, n / 10)


def _worker(url: str, queues: str) -> Proc:
    return Proc(MODULE, ["worker", url, queues, WORKER_CLASS], name="rq-worker").wait_ready(
        settle=0.5
    )


# -- the job functions (imported by the worker by name) -------------------------------------


def noop(i: int) -> None:
    return None


def child(i: int) -> int:
    return i * 2


def parent() -> dict[str, int]:
    from rq import get_current_job

    job = get_current_job()
    assert job is not None
    values = [dep.return_value() for dep in job.fetch_dependencies()]
    return {"count": len(values), "sum": sum(v for v in values if v is not None)}


class RQPeer(Peer):
    name = "rq"
    version = _version()
    config = (
        f"defaults (result_ttl 500 s); enqueue_many; 1 worker process, "
        f"{WORKER_CLASS}; fan-in = a parent job with depends_on=[children], which "
        "reads fetch_dependencies() + return_value(); W3 parent in another queue, one "
        "worker on both"
    )
    full_sizes = {"W1": [5_000], "W2": [500, 2_000], "W3": [500, 2_000], "W5": [5_000]}
    smoke_sizes = {"W2": [100], "W3": [100], "W5": [200]}
    notes = {
        "W1": "run at 5,000 jobs: the per-job cost does not grow with N (the rate is flat), "
        "and 20,000 would take about 1.5 min a run",
        "W2": "run at 500 and 2,000 children (10,000 would take over a minute a run): its "
        "cost per child is flat in N (about 80 commands), so its rate carries to "
        "10,000. About 25 of them are HGETALLs of enqueue(depends_on=[...]): it WATCHes "
        "every child and re-reads them all whenever a finishing child changes one under "
        "it, so with the worker running the add retries until most children have finished",
        "W3": "as W2",
        "W4": "n/a (no outbox): the worker that finishes a dependency enqueues the dependent "
        "itself; there is no delivery stage to time",
        "W5": "one run at 5,000 children (see W2); no paged read of the results",
    }

    def w1(self, url: str, n: int) -> dict[str, Any]:
        from rq import Queue

        win = Window(url)
        conn = redis.Redis.from_url(url)
        queue = Queue("w1", connection=conn)
        try:
            with Stopper() as procs:
                worker = procs.add(_worker(url, "w1"))
                win.begin()
                queue.enqueue_many([Queue.prepare_data(noop, (i,)) for i in range(n)])
                win.split("added")
                win.wait_for(
                    lambda: reached(win.cmd("ZCARD", "rq:finished:w1"), n),
                    timeout=_timeout(n),
                    what=f"{n} finished jobs",
                    procs=[worker],
                    stall=STALL,
                )
                measure = win.end()
            return result(measure, n=n, unit="jobs", worker_class=WORKER_CLASS)
        finally:
            conn.close()
            win.close()

    def w4(self, url: str, n: int) -> dict[str, Any]:
        raise Unsupported(self.notes["W4"])

    def w5(self, url: str, n: int) -> dict[str, Any]:
        record = self.fan_in(url, n, "w5", "w5")
        record["reader"] = {"paged_all_kib": None, "note": "no paged read API"}
        return record

    def fan_in(self, url: str, n: int, parent_q: str, child_q: str) -> dict[str, Any]:
        from rq import Queue

        win = Window(url)
        conn = redis.Redis.from_url(url)
        children_q, parents_q = Queue(child_q, connection=conn), Queue(parent_q, connection=conn)
        queues = parent_q if parent_q == child_q else f"{child_q},{parent_q}"
        try:
            with Stopper() as procs:
                worker = procs.add(_worker(url, queues))
                win.begin()
                kids = children_q.enqueue_many([Queue.prepare_data(child, (i,)) for i in range(n)])
                top = parents_q.enqueue(parent, depends_on=kids)
                added = win.split("added")
                key = f"rq:job:{top.id}"
                win.wait_for(
                    lambda: win.cmd("HGET", key, "status") == b"finished",
                    timeout=_timeout(n),
                    what="the parent job",
                    procs=[worker],
                )
                settled = win.split("released")
                measure = win.end()
            read_back = top.return_value(refresh=True)
            if read_back != {"count": n, "sum": n * (n - 1)}:
                raise BenchError(f"the parent read {read_back}, expected {n} results")
            return result(
                measure,
                n=n,
                unit="children",
                add_seconds=round(added, 4),
                settle_seconds=round(settled - added, 4),
                worker_class=WORKER_CLASS,
            )
        finally:
            conn.close()
            win.close()


# -- process --------------------------------------------------------------------------------


def run_worker(url: str, queues: str, worker_class: str) -> None:
    import rq

    conn = redis.Redis.from_url(url)
    cls = {"SimpleWorker": rq.SimpleWorker, "Worker": rq.Worker}[worker_class]
    worker = cls([rq.Queue(q, connection=conn) for q in queues.split(",")], connection=conn)
    print(READY, flush=True)
    worker.work(logging_level="WARNING")


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        run_worker(argv[1], argv[2], argv[3])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
