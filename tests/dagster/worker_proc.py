"""A real EchoMQ worker process for the Dagster tests, running no Pump (``pump=False``: these
tests check that Dagster's own Pumps - the run's, the sensor's - deliver what they wait for).

    python worker_proc.py URL PREFIX QUEUE[,QUEUE...]

Each handler returns ``{"queue", "n", "value": n * n}`` for a payload ``{"n": n}``; a payload
with ``"fail": true`` raises :class:`Unrecoverable`, so the child dies at once (and a
fail-the-parent child fails its parent); so does one with ``"fail_unless": PATH`` while no file
is at PATH (a failure a test then repairs); ``"sleep": S`` makes it run S seconds first;
``"wait_for": PATH`` makes it wait (up to 120 s) until a file is at PATH, a gate the test opens;
``"record": PATH`` appends ``<queue> <n>`` to the file at PATH each time it runs;
``"deep": K`` raises its failure from a chain of K causes (a long traceback).
SIGTERM drains and stops.
"""

import os
import sys
import time
from typing import Any

from echomq_core import EchoMQ, Job, Unrecoverable, Worker


def cause(depth: int) -> None:
    if depth == 0:
        raise ValueError("the first cause")
    try:
        cause(depth - 1)
    except ValueError as inner:
        raise ValueError(f"cause {depth}") from inner


def refuse(depth: int, why: str) -> None:
    if depth == 0:
        raise Unrecoverable(why)
    try:
        cause(depth - 1)
    except ValueError as inner:
        raise Unrecoverable(why) from inner


def handle(job: Job) -> dict[str, Any]:
    payload = job.payload or {}
    n = int(payload.get("n", 0))
    if payload.get("record"):
        with open(payload["record"], "a") as out:  # one short append: whole lines
            out.write(f"{job.queue} {n}\n")
    time.sleep(float(payload.get("sleep", 0)))
    if payload.get("wait_for"):
        deadline = time.monotonic() + 120
        while not os.path.exists(payload["wait_for"]) and time.monotonic() < deadline:
            time.sleep(0.02)
    if payload.get("fail"):
        refuse(int(payload.get("deep", 0)), f"child {n} refused on purpose")
    if payload.get("fail_unless") and not os.path.exists(payload["fail_unless"]):
        raise Unrecoverable(f"child {n} refused until {payload['fail_unless']} exists")
    return {"queue": job.queue, "n": n, "value": n * n}


def main() -> None:
    url, prefix, queues = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    with EchoMQ(url, prefix=prefix) as mq:
        handlers = dict.fromkeys(queues, handle)
        Worker(mq, handlers, concurrency=2, poll=0.01, max_poll=0.1, pump=False).run()


if __name__ == "__main__":
    main()
