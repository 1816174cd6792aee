"""A worker or Pump process for the chaos runs: ``python chaos_proc.py ROLE CONFIG_JSON``.

ROLE is ``worker`` or ``pump``; CONFIG_JSON holds url, cluster, prefix, queues and optional
tuning: client_name, concurrency, max_batch, lease (workers); pump_lease, max_stalls, page
(Pumps). A queue may be sharded (its logical name): a worker serves every shard, a Pump drains
every shard's outbox. With ``"pump_options": true`` a worker's own Pump (it drains its queues'
outboxes and recovers their leases too) takes the Pumps' pump_lease, max_stalls and page
instead of the defaults (10 s outbox lease, 5 stalls): under a driver that kills workers every
fraction of a second, a killed worker must not hold an outbox for 10 s, nor its Pump bury a
job the Pump processes would still retry. It prints ``ready`` once it is set up, then runs
until it is killed (the point of the exercise) or gets SIGTERM.

Children's payloads are ``{"n": i}`` plus optional ``"pause": ms`` (sleeps), ``"slow": ms``
(the handler first counts a start in ``<prefix>:chaos:starts`` - so a run interrupted by a
kill shows up as a second start - then sleeps), ``"fail": true`` (always raises),
``"broken": true`` (raises while the key ``<prefix>:chaos:broken`` exists: a bug that gets
fixed) and ``"log": true`` (appends ``[id, unix time]`` to ``<prefix>:chaos:started`` as the
handler starts). The
parent's payload is ``{"parent": true}``: its handler reads every child's result, logs the
run in ``<prefix>:chaos:parent-runs`` and returns ``{"count", "sum"}`` (it may be slow too).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from echomq_core import Backoff, EchoMQ, Job, Pump, Worker
from echomq_core.control.options import PumpOptions


def starts_key(prefix: str) -> str:
    return f"{prefix}:chaos:starts"


def runs_key(prefix: str) -> str:
    return f"{prefix}:chaos:parent-runs"


def started_key(prefix: str) -> str:
    return f"{prefix}:chaos:started"


def broken_key(prefix: str) -> str:
    return f"{prefix}:chaos:broken"


def make_handler(mq: EchoMQ, prefix: str) -> Any:
    raw = mq.connection.client

    def handle(job: Job) -> Any:
        payload = job.payload
        if payload.get("log"):
            raw.rpush(started_key(prefix), json.dumps([job.id, time.time()]))
        if payload.get("pause"):  # a plain delay: no server write, so no outage can fail it
            time.sleep(payload["pause"] / 1000)
        if payload.get("slow"):
            raw.hincrby(starts_key(prefix), job.id, 1)
            time.sleep(payload["slow"] / 1000)
        if payload.get("parent"):
            values = mq.children_values(job.queue, job.id)
            total = sum(v["sq"] for v in values.values())
            raw.rpush(runs_key(prefix), json.dumps([job.id, os.getpid(), len(values), total]))
            return {"count": len(values), "sum": total}
        if payload.get("fail"):
            raise RuntimeError(f"child {payload['n']} always fails")
        if payload.get("broken") and raw.exists(broken_key(prefix)):
            raise RuntimeError(f"child {payload['n']} hits the bug")
        return {"sq": payload["n"] * payload["n"]}

    return handle


def pump_options(config: dict[str, Any]) -> PumpOptions:
    return PumpOptions(
        lease=config.get("pump_lease", 1.0),
        max_stalls=config.get("max_stalls", 20),
        page=config.get("page", 1000),
    )


def main() -> None:
    role, config = sys.argv[1], json.loads(sys.argv[2])
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    prefix = config["prefix"]
    options = {"client_name": config["client_name"]} if config.get("client_name") else {}
    mq = EchoMQ(config["url"], cluster=config["cluster"], prefix=prefix, **options)
    queues = config["queues"]
    if role == "worker":
        handle = make_handler(mq, prefix)
        worker = Worker(
            mq,
            {q: handle for q in queues},
            concurrency=config.get("concurrency", 4),
            max_batch=config.get("max_batch", 50),
            lease=config.get("lease", 1.0),
            grace=1.0,
            queue_options={"backoff": Backoff(base_ms=20, cap_ms=200)},
            pump=pump_options(config) if config.get("pump_options") else True,
        )
        print("ready", flush=True)
        worker.run()
    else:
        # a Pump drains outboxes, which are per physical queue: a sharded queue's every shard
        pump = Pump(
            mq,
            [shard for q in queues for shard in mq.shards(q)],
            lease=config.get("pump_lease", 1.0),
            max_stalls=config.get("max_stalls", 20),
            page=config.get("page", 1000),
        )
        print("ready", flush=True)
        pump.run()


if __name__ == "__main__":
    main()
