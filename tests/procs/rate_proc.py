"""A real worker process for the rate-limit tests: ``python rate_proc.py URL CLUSTER PREFIX
QUEUE``. Its handler records each job's claim time on the server's clock (the job's lease
deadline in ``active`` less the 600 s lease) in the list ``<PREFIX>:test:claimed``, and this
process's pid in the set ``<PREFIX>:test:pids``. Stops on SIGTERM/SIGINT like any worker.
Nothing extends a lease before its handler reads it: no heartbeat falls within a test (every
lease / 3), and the worker's lease check of jobs that waited in its buffer is switched off
(it would re-stamp their deadlines: tests/control/test_rate_limit.py, ``unextended``)."""

from __future__ import annotations

import os
import sys

from echomq_core import EchoMQ, Job, Worker
from echomq_core.wire.connection import Call

LEASE = 600.0


def main() -> None:
    url, cluster, prefix, queue = sys.argv[1:5]
    mq = EchoMQ(url, cluster=cluster == "1", prefix=prefix)
    pid = os.getpid()

    def handle(job: Job) -> int:
        (score,) = mq.connection.execute([Call.cmd("ZSCORE", mq.keys.active(job.queue), job.id)])
        at = int(float(score)) - int(LEASE * 1000)
        mq.connection.execute(
            [
                Call.cmd("RPUSH", f"{prefix}:test:claimed", at),
                Call.cmd("SADD", f"{prefix}:test:pids", pid),
            ]
        )
        return at

    worker = Worker(mq, {queue: handle}, concurrency=4, lease=LEASE, pump=False)
    worker.recheck = float("inf")
    print("ready", flush=True)
    worker.run()


if __name__ == "__main__":
    main()
