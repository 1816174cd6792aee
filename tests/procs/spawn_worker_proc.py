"""A real worker process that spawns, for tests: ``python spawn_worker_proc.py URL CLUSTER PREFIX
QUEUES``. A job whose payload is "seed" spawns 5 batches of 10 siblings ({"n": k}) - "seed-own"
the same as children of its own, and returns the sum of their n when it runs again; on its first
run (no stall yet) it prints "mid-spawn" after the second batch and then waits for ever - the
test SIGKILLs the process there, between two spawn calls. Every other job returns its payload.
Prints "ready" once it serves."""

from __future__ import annotations

import sys
import threading

from echomq_core import Child, EchoMQ, Job, Worker


def main() -> None:
    url, cluster, prefix, queues = sys.argv[1:5]
    mq = EchoMQ(url, cluster=cluster == "1", prefix=prefix)

    def handle(job: Job) -> object:
        if job.payload in ("seed", "seed-own"):
            own = job.payload == "seed-own"
            if own and job.resumed:
                return sum(v["n"] for v in job.children_values().values())
            for batch in range(5):
                job.spawn([Child({"n": batch * 10 + i}) for i in range(10)], own=own)
                if batch == 1 and job.stalls == 0 and job.attempts == 0:
                    print("mid-spawn", flush=True)
                    threading.Event().wait()  # until the SIGKILL
        return job.payload

    names = queues.split(",")
    worker = Worker(mq, {q: handle for q in names}, concurrency=2, lease=1.0)
    print("ready", flush=True)
    worker.run()


if __name__ == "__main__":
    main()
