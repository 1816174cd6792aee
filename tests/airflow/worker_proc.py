"""The test worker: the example's handlers, plus delays a test can ask for.

Run as ``python worker_proc.py`` with ``ECHOMQ_URL`` and ``ECHOMQ_PREFIX`` set; SIGTERM drains
and exits. A job waits ``ECHOMQ_TEST_JOB_DELAY`` seconds (env, default 0) plus its payload's
``sleep`` before its handler runs, so that children settle *after* a sensor started waiting:
the sensor then really polls (or defers) instead of finding the flow done at its first look.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "airflow"))

from echomq_worker import CUBE_QUEUE, SQUARE_QUEUE, cube, square

from echomq_core import EchoMQ, Job, Pump, Worker

DELAY = float(os.environ.get("ECHOMQ_TEST_JOB_DELAY", "0"))


def slow(handler: Callable[[Job], Any]) -> Callable[[Job], Any]:
    def run(job: Job) -> Any:
        time.sleep(DELAY + float(job.payload.get("sleep", 0)))
        return handler(job)

    return run


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="worker %(asctime)s %(name)s %(message)s")
    with (
        EchoMQ(os.environ["ECHOMQ_URL"], prefix=os.environ["ECHOMQ_PREFIX"]) as mq,
        Pump(mq, queues=[SQUARE_QUEUE, CUBE_QUEUE]),
    ):
        Worker(mq, {SQUARE_QUEUE: slow(square), CUBE_QUEUE: slow(cube)}, concurrency=4).run()


if __name__ == "__main__":
    main()
