"""The EchoMQ workers behind the example DAG ``echomq_fan_out``.

Run next to Airflow (any host that reaches the server)::

    ECHOMQ_URL=redis://127.0.0.1:6379/0 ECHOMQ_PREFIX=emq python examples/airflow/echomq_worker.py

It serves the two child queues and runs a Pump in the same process: the children live in
other queues than their parent (``example.reports``), and a Pump is what delivers their
completions across queues. SIGTERM (or Ctrl-C) drains gracefully: the job in hand finishes,
unstarted jobs go back to pending.

Handlers: ``example.square`` returns n², ``example.cube`` returns n³. A payload with a
``fail`` reason stands for bad input: the handler raises ``Unrecoverable`` and the job dies
at once (retrying bad input cannot help), which the flow then settles by the child's policy.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from echomq_core import EchoMQ, Job, Pump, Unrecoverable, Worker

SQUARE_QUEUE = "example.square"
CUBE_QUEUE = "example.cube"


def _number(job: Job) -> int:
    payload: dict[str, Any] = job.payload
    if payload.get("fail"):
        raise Unrecoverable(f"item {payload.get('n')}: {payload['fail']}")
    return int(payload["n"])


def square(job: Job) -> dict[str, int]:
    n = _number(job)
    return {"n": n, "value": n * n}


def cube(job: Job) -> dict[str, int]:
    n = _number(job)
    return {"n": n, "value": n**3}


#: The handlers by queue, for ``echomq worker example.square example.cube --app
#: echomq_worker:HANDLERS`` (what ``deployment.py`` runs).
HANDLERS = {SQUARE_QUEUE: square, CUBE_QUEUE: cube}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    url = os.environ.get("ECHOMQ_URL", "redis://127.0.0.1:6379/0")
    prefix = os.environ.get("ECHOMQ_PREFIX", "emq")
    with EchoMQ(url, prefix=prefix) as mq, Pump(mq, queues=[SQUARE_QUEUE, CUBE_QUEUE]):
        Worker(mq, HANDLERS, concurrency=2).run()


if __name__ == "__main__":
    main()
