"""The test worker: the example's handlers, plus delays, a first-try failure and a record.

Run as ``python worker_proc.py`` with ``ECHOMQ_URL`` and ``ECHOMQ_PREFIX`` set (SIGTERM drains
and exits), or as ``echomq worker QUEUE... --app worker_proc:HANDLERS`` (the deployment test).

* A job waits ``ECHOMQ_TEST_JOB_DELAY`` seconds (env, default 0) plus its payload's ``sleep``
  before its handler runs, so that children settle *after* a sensor started waiting: the
  sensor then really polls (or defers) instead of finding the flow done at its first look.
* A payload with ``fail_once: NAME`` dies (``Unrecoverable``) the first time any worker runs
  it - a marker file ``NAME`` in ``ECHOMQ_TEST_MARKERS`` remembers it - and succeeds after.
* A payload with ``wait_for: NAME`` waits (bounded, 300 s) until a marker file ``NAME`` in
  ``ECHOMQ_TEST_MARKERS`` exists: the test decides when that child settles.
* With ``ECHOMQ_TEST_GATE`` set (a path), every job waits the same way until that file exists:
  the test decides when any child settles (e.g. once the sensor waits, see
  ``helpers.OpenWhen``), for DAGs it runs as shipped.
* A payload's ``then_sleep``: seconds the job takes once its gates opened (the time between
  the test's go and the child's completion).
* With ``ECHOMQ_TEST_RUNS`` set, every handler call appends ``{"id", "queue"}`` to that file
  (JSON lines): what ran, and how often.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "airflow"))

from echomq_worker import CUBE_QUEUE, SQUARE_QUEUE, cube, square

from echomq_core import EchoMQ, Job, Pump, Unrecoverable, Worker

DELAY = float(os.environ.get("ECHOMQ_TEST_JOB_DELAY", "0"))
LATER_QUEUE = "example.later"
NOWHERE_QUEUE = "example.nowhere"


def wait_for(marker: Path) -> None:
    """Until ``marker`` exists, at most 300 s."""
    deadline = time.monotonic() + 300
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def slow(handler: Callable[[Job], Any]) -> Callable[[Job], Any]:
    def run(job: Job) -> Any:
        runs = os.environ.get("ECHOMQ_TEST_RUNS")
        if runs:
            with open(runs, "a") as out:
                out.write(json.dumps({"id": job.id, "queue": job.queue}) + "\n")
        time.sleep(DELAY + float(job.payload.get("sleep", 0)))
        gate = job.payload.get("wait_for")
        if gate:
            wait_for(Path(os.environ["ECHOMQ_TEST_MARKERS"]) / gate)
        if os.environ.get("ECHOMQ_TEST_GATE"):
            wait_for(Path(os.environ["ECHOMQ_TEST_GATE"]))
        time.sleep(float(job.payload.get("then_sleep", 0)))
        once = job.payload.get("fail_once")
        if once:
            marker = Path(os.environ["ECHOMQ_TEST_MARKERS"]) / once
            if not marker.exists():
                marker.touch()
                raise Unrecoverable(f"item {job.payload.get('n')}: corrupt input (first try)")
        return handler(job)

    return run


HANDLERS = {
    SQUARE_QUEUE: slow(square),
    CUBE_QUEUE: slow(cube),
    LATER_QUEUE: slow(square),
    NOWHERE_QUEUE: slow(square),  # served only once a story starts a worker for it
}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="worker %(asctime)s %(name)s %(message)s")
    with (
        EchoMQ(os.environ["ECHOMQ_URL"], prefix=os.environ["ECHOMQ_PREFIX"]) as mq,
        Pump(mq, queues=[SQUARE_QUEUE, CUBE_QUEUE]),
    ):
        Worker(
            mq,
            {SQUARE_QUEUE: HANDLERS[SQUARE_QUEUE], CUBE_QUEUE: HANDLERS[CUBE_QUEUE]},
            concurrency=4,
        ).run()


if __name__ == "__main__":
    main()
