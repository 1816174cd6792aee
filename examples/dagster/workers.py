"""The workers of the Dagster example: one process serving both child queues.

Run it next to ``dagster dev -f examples/dagster/definitions.py`` (same ``ECHOMQ_URL`` and
``ECHOMQ_PREFIX``)::

    python examples/dagster/workers.py            # SIGTERM / Ctrl-C drains and stops

Like every worker, it also runs a Pump for the queues it serves (``Worker(..., pump=True)``, the
default), so the children settle their parent (in another queue) with the workers alone; the
Pump ``EchoMQResource`` runs while a step waits does the same, and outbox leases make the two
take turns.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from echomq_core import EchoMQ, Job, Worker

SQUARES = "example-squares"
CUBES = "example-cubes"


def square(job: Job) -> dict[str, Any]:
    n = int(job.payload["n"])
    return {"queue": job.queue, "n": n, "value": n * n}


def cube(job: Job) -> dict[str, Any]:
    n = int(job.payload["n"])
    return {"queue": job.queue, "n": n, "value": n**3}


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    url = os.environ.get("ECHOMQ_URL", "redis://127.0.0.1:6379/0")
    with EchoMQ(url, prefix=os.environ.get("ECHOMQ_PREFIX", "emq")) as mq:
        Worker(mq, {SQUARES: square, CUBES: cube}, concurrency=2).run()


if __name__ == "__main__":
    main()
