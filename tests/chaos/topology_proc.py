"""A worker or Pump process for the topology runs: ``python topology_proc.py ROLE CONFIG_JSON``.

ROLE is ``worker`` or ``pump``. CONFIG_JSON holds url, prefix, queues, and: concurrency,
max_batch, lease (workers); pump_lease, max_stalls (Pumps); ``default_node`` ("host:port":
the client's default node is set to it, as in issue 12); ``gate`` (a file path: children
whose payload has ``"gate": true`` wait until the file exists - the test opens the gate, so a
flow cannot finish before the fault it is meant to meet); ``runs`` (a file path: each run of a
parent's handler appends one JSON line there - a local file, so the record survives what the
Cluster goes through).

The handlers never touch the Cluster except a parent's read of its children's results: a
child returns ``{"sq": n * n, "pid": ..., "t": ...}`` (who ran it, and when).

It prints ``ready``, then, with wall-clock times (``time.time()``), what its operations meet
- ``down WHAT T ERROR``: WHAT failed (the first failure of a streak);
- ``up WHAT T``: WHAT succeeded after a streak of failures;
- ``ok WHAT T``: WHAT succeeded (printed at most every 0.25 s per WHAT);
WHAT is ``claim:<queue>`` for a worker (the physical queue: a shard of a sharded queue; every
runner claims from every queue, busy or idle) and ``tick`` for a Pump (each tick reads every
queue's outbox: it touches every master).
A queue may be sharded (its logical name): a worker serves, and a Pump drains, every shard.
On SIGUSR1 it writes every thread's stack to its log (faulthandler): what a hung process was
doing. On SIGTERM it stops gracefully and prints ``router {...}``: what its client's Cluster router
met (``Connection.stats``).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from echomq_core import Backoff, EchoMQ, EchoMQError, Job, Pump, Worker
from echomq_core.work.routines import AHEAD_FAILED, CLAIM_FAILED

OK_EVERY = 0.25
_OUT = threading.Lock()


def say(line: str) -> None:
    """One whole line on stdout (runner threads print at once: print() may interleave)."""
    with _OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Reporter:
    """Prints the transitions of each operation's health (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.down: set[str] = set()
        self.last_ok: dict[str, float] = {}

    def failed(self, what: str, exc: BaseException) -> None:
        with self.lock:
            if what in self.down:
                return
            self.down.add(what)
        text = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
        say(f"down {what} {time.time():.3f} {text}")

    def ok(self, what: str) -> None:
        now = time.time()
        with self.lock:
            was_down = what in self.down
            self.down.discard(what)
            if not was_down and now - self.last_ok.get(what, 0.0) < OK_EVERY:
                return
            self.last_ok[what] = now
        say(f"{'up' if was_down else 'ok'} {what} {now:.3f}")


REPORT = Reporter()


class ReportingPump(Pump):
    def tick(self) -> Any:
        try:
            stats = super().tick()
        except EchoMQError as exc:
            REPORT.failed("tick", exc)
            raise
        REPORT.ok("tick")
        return stats


class ClaimFailures(logging.Handler):
    """Reports each claim the worker's fetcher logs as failed (routines.claim_turn and
    read_ahead: a claim's operation fails in the connection's driver, outside it, where no
    wrapper of the operation sees the error) as ``down claim:<queue>``."""

    def emit(self, record: logging.LogRecord) -> None:
        if not isinstance(record.msg, str) or not isinstance(record.args, tuple):
            return
        if record.msg == AHEAD_FAILED:
            name, exc = record.args
        elif CLAIM_FAILED in record.msg:  # the worker's Outage: (who, queue, error, ...)
            name, exc = record.args[1:3]
        else:
            return
        if isinstance(exc, BaseException):
            REPORT.failed(f"claim:{name}", exc)


def report_claims(worker: Worker) -> None:
    """Report the fetcher's claims: ``ok`` (or ``up``) when one returns, ``down`` when one
    fails (:class:`ClaimFailures`)."""
    logging.getLogger("echomq_core.worker").addHandler(ClaimFailures())
    for queue in worker.queues.values():
        claim_op, what = queue.claim_op, f"claim:{queue.name}"

        def reported(*args: Any, _claim_op: Any = claim_op, _what: str = what, **kw: Any) -> Any:
            jobs = yield from _claim_op(*args, **kw)
            REPORT.ok(_what)
            return jobs

        queue.claim_op = reported  # type: ignore[method-assign]


def make_handler(mq: EchoMQ, config: dict[str, Any]) -> Any:
    def handle(job: Job) -> Any:
        payload = job.payload
        if payload.get("gate"):
            deadline = time.monotonic() + 300
            while not os.path.exists(config["gate"]):
                if time.monotonic() > deadline:
                    raise RuntimeError("the gate never opened")
                time.sleep(0.02)
        if payload.get("pause"):
            time.sleep(payload["pause"] / 1000)
        if payload.get("parent"):
            values = mq.children_values(job.queue, job.id)
            total = sum(v["sq"] for v in values.values())
            with open(config["runs"], "a", encoding="utf-8") as fh:
                fh.write(json.dumps([job.id, os.getpid(), len(values), total]) + "\n")
            return {"count": len(values), "sum": total}
        n = payload["n"]
        return {"sq": n * n, "pid": os.getpid(), "t": round(time.time(), 3)}

    return handle


def main() -> None:
    role, config = sys.argv[1], json.loads(sys.argv[2])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    mq = EchoMQ(config["url"], cluster=True, prefix=config["prefix"])
    if config.get("default_node"):
        client: Any = mq.connection.client
        client.set_default_node(client.get_node(node_name=config["default_node"]))
    queues = config["queues"]
    if role == "worker":
        worker = Worker(
            mq,
            {q: make_handler(mq, config) for q in queues},
            concurrency=config.get("concurrency", 4),
            max_batch=config.get("max_batch", 50),
            lease=config.get("lease", 2.0),
            grace=1.0,
            queue_options={"backoff": Backoff(base_ms=20, cap_ms=200)},
        )
        report_claims(worker)
        say("ready")
        worker.run()  # until SIGTERM
    else:
        pump = ReportingPump(
            mq,
            [shard for q in queues for shard in mq.shards(q)],  # a sharded queue: every outbox
            lease=config.get("pump_lease", 1.0),
            max_stalls=config.get("max_stalls", 20),
        )
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        pump.start()
        say("ready")
        while not stop.wait(0.2):
            pass
        pump.stop()
    # what the Cluster router met in this process (echomq_core.wire.connection)
    say("router " + json.dumps(dict(mq.connection.stats), sort_keys=True))


if __name__ == "__main__":
    main()
