"""``echomq workers``: the worker processes serving this prefix, as they registered
themselves (:mod:`echomq_core.queues.registry`): host, pid, kind, queues, concurrency, jobs
in flight, when it started and when it last beat. A worker that stopped beating is gone once
its entry expires (a lease at most); reading trims its registry member. One read of at most
:data:`~echomq_core.queues.registry.READ_LIMIT` entries.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..queues.registry import read_workers
from .common import add_command, open_client
from .printing import fmt_ago, table


def add_parser(sub: Any) -> None:
    workers = sub.add_parser(
        "workers",
        help="list the live worker processes",
        description="The worker processes serving this prefix (each registers itself and "
        "beats; one that stopped beating disappears within its lease).",
    )
    add_command(workers, run_workers, json_flag=True)


def run_workers(args: argparse.Namespace) -> int:
    mq = open_client(args)
    try:
        found = mq.perform(read_workers(mq.keys))
    finally:
        mq.close()
    if args.json:
        print(json.dumps({"workers": [w.to_dict() for w in found]}))
        return 0
    if not found:
        print(f"no live workers under prefix {args.prefix!r}")
        return 0
    now = time.time()
    headers = ["worker", "host", "pid", "kind", "queues", "concurrency", "in flight", "up", "beat"]
    rows = [
        [
            w.id,
            w.host,
            str(w.pid),
            w.kind,
            ",".join(w.queues),
            str(w.concurrency),
            str(w.inflight),
            fmt_ago(now - w.started / 1000),
            fmt_ago(now - w.beat / 1000),
        ]
        for w in found
    ]
    print("\n".join(table(headers, rows, left=5)))
    return 0
