"""A real worker process for tests: ``python worker_proc.py URL CLUSTER PREFIX QUEUES SLEEP_MS
CONCURRENCY [PUMP]``. Handlers sleep SLEEP_MS then return the payload doubled (payloads that
are dicts with "fail": true raise). Stops on SIGTERM/SIGINT like any EchoMQ worker."""

from __future__ import annotations

import logging
import sys
import time

from echomq_core import EchoMQ, Job, Pump, Worker


def main() -> None:
    url, cluster, prefix, queues, sleep_ms, concurrency = sys.argv[1:7]
    with_pump = len(sys.argv) > 7 and sys.argv[7] == "pump"
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    mq = EchoMQ(url, cluster=cluster == "1", prefix=prefix)
    delay = int(sleep_ms) / 1000

    def handle(job: Job) -> object:
        if delay:
            time.sleep(delay)
        payload = job.payload
        if isinstance(payload, dict):
            if payload.get("fail"):
                raise RuntimeError(f"asked to fail: {job.id}")
            return {"double": payload.get("n", 0) * 2}
        return payload * 2 if isinstance(payload, int) else payload

    names = queues.split(",")
    worker = Worker(
        mq,
        {q: handle for q in names},
        concurrency=int(concurrency),
        lease=5.0,
        grace=10.0,
        queue_options={"max_attempts": 2},
    )
    pump = Pump(mq, names).start() if with_pump else None
    print("ready", flush=True)
    worker.run()
    if pump is not None:
        pump.stop()
    print(f"stopped completed={worker.completed} failed={worker.failed}", flush=True)


if __name__ == "__main__":
    main()
