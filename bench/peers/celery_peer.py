"""Celery under the benchmark workloads, and its worker process.

Configuration: Redis as broker and result backend (both on the run's server), JSON, results
kept at the default ``result_expires`` (1 day); one worker process with the ``solo`` pool (one
process, no pool children: the fastest pool for no-op tasks, and "one worker process" to the
letter), ``--without-gossip --without-mingle --without-heartbeat`` (Celery's documented advice
to cut broker chatter; none of them changes task semantics), default prefetch (4). Fan-in is
a ``chord``: the header tasks' results are counted by the Redis backend (its native chord
support, no ``chord_unlock`` polling), and the callback task receives the list of results.
Cross-queue (W3): the header routed to one queue, the callback to another, one worker
consuming both.

Process: ``python -m bench.peers.celery_peer worker URL QUEUE[,QUEUE]``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..common import READY, BenchError, Proc, Stopper, Window, result
from . import Peer, Unsupported

MODULE = "bench.peers.celery_peer"


def _version() -> str:
    try:
        import celery

        return str(celery.__version__)
    except ImportError:
        return "not installed"


_apps: dict[str, Any] = {}


def make_app(url: str) -> Any:
    """The Celery app for the server at ``url`` (one per process and server: Celery keeps a
    registry of task names, and the broker and backend connection pools live in the app)."""
    if url in _apps:
        return _apps[url]
    from celery import Celery

    app = Celery("bench", broker=url, backend=url)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )

    @app.task(name="bench.noop")
    def noop(i: int) -> None:
        return None

    @app.task(name="bench.child")
    def child(i: int) -> int:
        return i * 2

    @app.task(name="bench.parent")
    def parent(results: list[int]) -> dict[str, int]:
        return {"count": len(results), "sum": sum(results)}

    _apps[url] = app
    return app


def _timeout(n: int) -> float:
    return max(120.0, n / 20)


def _worker(url: str, queues: str) -> Proc:
    return Proc(MODULE, ["worker", url, queues], name="celery-worker").wait_ready(settle=0.5)


def _meta(win: Window, task_id: str) -> dict[str, Any] | None:
    raw = win.cmd("GET", f"celery-task-meta-{task_id}")
    return json.loads(raw) if raw else None


class CeleryPeer(Peer):
    name = "celery"
    version = _version()
    config = (
        "Redis broker + Redis result backend, JSON, default result_expires (1 day); 1 "
        "worker process, solo pool, --without-gossip/mingle/heartbeat, default "
        "prefetch; fan-in = chord (native Redis chord counting), the callback task "
        "receives the results; W3 header and callback in different queues"
    )
    full_sizes = {"W5": [20_000]}
    notes = {
        "W4": "n/a (no outbox): the last header task to finish calls the chord callback "
        "itself; there is no delivery stage to time",
        "W5": "one run at 20,000 children (200,000 would take over 10 min); no paged read: "
        "the callback receives every result in one list",
    }

    def w1(self, url: str, n: int) -> dict[str, Any]:
        from celery import group

        app, win = make_app(url), Window(url)
        try:
            with Stopper() as procs:
                worker = procs.add(_worker(url, "w1"))
                noop = app.tasks["bench.noop"]
                win.begin()
                res = group(noop.s(i).set(queue="w1") for i in range(n)).apply_async()
                win.split("added")
                last = res.results[-1].id
                # the solo worker runs the queue in order: the last result stored means all
                # are (checked below, after the window, for every one of them)
                win.wait_for(
                    lambda: _meta(win, last) is not None,
                    timeout=_timeout(n),
                    what=f"{n} results",
                    procs=[worker],
                )
                measure = win.end()
            states = _states(win, [r.id for r in res.results])
            if states != {"SUCCESS": n}:
                raise BenchError(f"W1 incomplete: {states}")
            return result(measure, n=n, unit="jobs")
        finally:
            win.close()

    def w4(self, url: str, n: int) -> dict[str, Any]:
        raise Unsupported(self.notes["W4"])

    def w5(self, url: str, n: int) -> dict[str, Any]:
        record = self.fan_in(url, n, "w5", "w5")
        record["reader"] = {
            "method": "peak RSS (VmHWM) of the worker process that runs the "
            "callback (it receives every result at once)",
            "paged_all_kib": None,
            "whole_kib": record.pop("worker_peak_kib"),
            "note": "no paged read: the callback gets one list",
        }
        return record

    def fan_in(self, url: str, n: int, parent_q: str, child_q: str) -> dict[str, Any]:
        from celery import chord

        app, win = make_app(url), Window(url)
        queues = parent_q if parent_q == child_q else f"{child_q},{parent_q}"
        child, parent = app.tasks["bench.child"], app.tasks["bench.parent"]
        try:
            with Stopper() as procs:
                worker = procs.add(_worker(url, queues))
                win.begin()
                res = chord([child.s(i).set(queue=child_q) for i in range(n)])(
                    parent.s().set(queue=parent_q)
                )
                added = win.split("added")
                win.wait_for(
                    lambda: _meta(win, res.id) is not None,
                    timeout=_timeout(n),
                    what="the chord callback",
                    procs=[worker],
                )
                settled = win.split("released")
                measure = win.end()
                meta = _meta(win, res.id) or {}
                worker_peak = _worker_peak(worker)
            read_back = meta.get("result") or {}
            if meta.get("status") != "SUCCESS" or read_back != {"count": n, "sum": n * (n - 1)}:
                raise BenchError(f"the callback read {meta}, expected {n} results")
            return result(
                measure,
                n=n,
                unit="children",
                add_seconds=round(added, 4),
                settle_seconds=round(settled - added, 4),
                worker_peak_kib=worker_peak,
            )
        finally:
            win.close()


def _states(win: Window, ids: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in range(0, len(ids), 1000):
        for raw in win.r.mget([f"celery-task-meta-{t}" for t in ids[i : i + 1000]]):
            state = json.loads(raw)["status"] if raw else "MISSING"
            out[state] = out.get(state, 0) + 1
    return out


def _worker_peak(worker: Proc) -> int | None:
    try:
        with open(f"/proc/{worker.popen.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# -- process --------------------------------------------------------------------------------


def run_worker(url: str, queues: str) -> None:
    from celery.signals import worker_ready

    app = make_app(url)

    @worker_ready.connect
    def ready(**_: Any) -> None:
        print(READY, flush=True)

    app.worker_main(
        [
            "worker",
            "--pool=solo",
            f"--queues={queues}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=WARNING",
        ]
    )


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        run_worker(argv[1], argv[2])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
