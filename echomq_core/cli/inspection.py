"""The inspection commands: ``echomq flow show``, ``echomq queue stats``, ``echomq poison``.

All are reads except ``poison replay``, which moves poisoned signals back to their outbox for
the Pump to try again (after the cause - a missing parent, a bug - was fixed).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..client import EchoMQ
from ..errors import InvalidInput
from ..keyspace import check_job_id, check_queue
from ..pump import parse_signal, poison_list, poison_replay
from .common import (
    CommandFailed,
    Progress,
    add_connection_options,
    add_verbosity,
    env_url,
    int_at_least,
    open_client,
    seconds,
)
from .flowtree import read_tree, render


def add_parsers(sub: Any) -> None:
    flow = sub.add_parser(
        "flow", help="inspect a flow", description="Inspect flows."
    ).add_subparsers(dest="flow_command", metavar="COMMAND", required=True)
    show = flow.add_parser(
        "show",
        help="a flow's parent state and counts (a tree for nested flows)",
        description="Print a flow: parent state, N, outstanding, processed, ignored, failed, "
        "and its sub-flows as a tree. --watch shows a progress bar until the "
        "parent is released (exit 0) or failed (exit 1).",
    )
    show.add_argument("queue", metavar="QUEUE", help="the parent's queue")
    show.add_argument("parent_id", metavar="PARENT_ID", help="the parent's job id")
    show.add_argument("--watch", action="store_true", help="wait until the flow settles")
    show.add_argument(
        "--timeout",
        type=seconds(),
        default=None,
        metavar="S",
        help="with --watch: give up after S seconds (exit 1); default: never",
    )
    show.add_argument(
        "--interval",
        type=seconds(0.01),
        default=0.5,
        metavar="S",
        help="with --watch: seconds between reads (default %(default)s)",
    )
    show.add_argument("--json", action="store_true", help="print one JSON object")
    _common(show, run_flow_show)

    queue = sub.add_parser(
        "queue", help="inspect queues", description="Inspect queues."
    ).add_subparsers(dest="queue_command", metavar="COMMAND", required=True)
    stats = queue.add_parser(
        "stats",
        help="job counts per state",
        description="Counts per state of QUEUE, or of every registered "
        "queue: pending, active, delayed, dead, completed, "
        "outbox (signals in transit), poison.",
    )
    stats.add_argument("queue", nargs="?", metavar="QUEUE", help="one queue (default: all)")
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    _common(stats, run_queue_stats)

    poison = sub.add_parser(
        "poison",
        help="list or replay poisoned signals",
        description="Fan-in signals the Pump could not deliver.",
    )
    psub = poison.add_subparsers(dest="poison_command", metavar="COMMAND", required=True)
    plist = psub.add_parser(
        "list",
        help="show a queue's poisoned signals, oldest first",
        description="Show a queue's poisoned signals with their reasons.",
    )
    plist.add_argument("queue", metavar="QUEUE")
    plist.add_argument(
        "--count",
        type=int_at_least(1, 100_000),
        default=20,
        metavar="N",
        help="how many (default %(default)s)",
    )
    plist.add_argument("--json", action="store_true", help="print one JSON object")
    _common(plist, run_poison_list)
    replay = psub.add_parser(
        "replay",
        help="move poisoned signals back to the outbox",
        description="Move poisoned signals back to the tail of their "
        "queue's outbox, for the Pump to deliver again.",
    )
    replay.add_argument("queue", metavar="QUEUE")
    replay.add_argument(
        "--count",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="how many, oldest first (default: all)",
    )
    _common(replay, run_poison_replay)


def _common(parser: argparse.ArgumentParser, run: Any) -> None:
    add_connection_options(parser, url_default=env_url())
    add_verbosity(parser)
    parser.set_defaults(run=run)


# -- flow show -----------------------------------------------------------------------------


def run_flow_show(args: argparse.Namespace) -> int:
    check_queue(args.queue)
    check_job_id(args.parent_id)
    mq = open_client(args)
    try:
        snap = mq.snapshot(args.queue, args.parent_id)
        if snap.parent_state is None and snap.total == 0:
            raise CommandFailed(f"no flow {args.parent_id} in queue {args.queue!r}")
        failed = False
        if args.watch:
            failed = _watch(mq, args)
        tree = read_tree(mq, args.queue, args.parent_id)
        if args.json:
            print(json.dumps(tree.to_dict()))
        else:
            print("\n".join(render(tree)))
            if tree.snap.failed:
                culprits = sorted(mq.failed_children(args.queue, args.parent_id).items())
                for child_id, error in culprits[:5]:
                    print(f"  failed child  {child_id}: {error}")
        if failed:
            raise CommandFailed(f"flow {args.parent_id} failed")
    finally:
        mq.close()
    return 0


def _watch(mq: EchoMQ, args: argparse.Namespace) -> bool:
    """Show a progress bar until the parent is released (False) or failed (True)."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    progress: Progress | None = None
    try:
        while True:
            snap = mq.snapshot(args.queue, args.parent_id)
            if progress is None:
                progress = Progress(snap.total, enabled=not args.json)
            done = snap.released or snap.parent_state == "failed"
            progress.update(
                snap.settled,
                "" if snap.parent_state == "held" else f"parent {snap.parent_state}",
                final=done,
            )
            if done:
                return snap.parent_state == "failed"
            if deadline is not None and time.monotonic() >= deadline:
                raise CommandFailed(
                    f"flow {args.parent_id} not settled after {args.timeout}s "
                    f"({snap.dependencies:,} outstanding)"
                )
            time.sleep(args.interval)
    finally:
        if progress is not None:
            progress.close()


# -- queue stats ---------------------------------------------------------------------------

COLUMNS = ("pending", "active", "delayed", "dead", "completed", "outbox", "poison")


def run_queue_stats(args: argparse.Namespace) -> int:
    if args.queue is not None:
        check_queue(args.queue)
    mq = open_client(args)
    try:
        names = [args.queue] if args.queue is not None else mq.queues()
        table = {name: mq.queue(name).stats() for name in names}
    finally:
        mq.close()
    if args.json:
        print(json.dumps(table))
        return 0
    if not table:
        print(f"no queues under prefix {args.prefix!r}")
        return 0
    width = max(len("queue"), *(len(n) for n in table))
    print(f"{'queue':<{width}}  " + "  ".join(f"{c:>9}" for c in COLUMNS))
    for name, counts in table.items():
        print(f"{name:<{width}}  " + "  ".join(f"{counts.get(c, 0):>9,}" for c in COLUMNS))
    return 0


# -- poison --------------------------------------------------------------------------------


def _describe(entry: bytes) -> dict[str, Any]:
    try:
        sig = parse_signal(entry)
    except InvalidInput:
        return {"raw": entry.decode(errors="replace")}
    return {
        "kind": {"c": "completed", "i": "ignored", "f": "failed"}[sig.kind],
        "child": sig.child,
        "parent_queue": sig.parent_queue,
        "parent": sig.parent,
        "value": sig.value.decode(errors="replace"),
    }


def run_poison_list(args: argparse.Namespace) -> int:
    check_queue(args.queue)
    mq = open_client(args)
    try:
        items = mq.run(poison_list(mq.keys, args.queue, args.count))
    finally:
        mq.close()
    rows = [{"reason": reason, **_describe(entry)} for reason, entry in items]
    if args.json:
        print(json.dumps({"queue": args.queue, "poisoned": rows}))
        return 0
    if not rows:
        print(f"no poisoned signals in {args.queue!r}")
    for row in rows:
        if "raw" in row:
            print(f"{row['reason']}: {row['raw']!r}")
        else:
            print(
                f"{row['reason']}: {row['kind']} {row['child']} -> {row['parent']} "
                f"in {row['parent_queue']!r}"
            )
    return 0


def run_poison_replay(args: argparse.Namespace) -> int:
    check_queue(args.queue)
    mq = open_client(args)
    try:
        count = args.count if args.count is not None else mq.queue(args.queue).stats()["poison"]
        moved = mq.run(poison_replay(mq.keys, args.queue, count)) if count else 0
    finally:
        mq.close()
    print(f"replayed {moved} signal(s) of {args.queue!r} to its outbox")
    return 0
