"""``echomq poison list|replay``: the fan-in signals the Pump could not deliver, and moving
them back to their outbox for the Pump to try again (after the cause - a missing parent, a
bug - was fixed).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import InvalidInput
from ..pump.drain import parse_signal, poison_list, poison_replay
from ..wire.keyspace import check_queue
from .arguments import add_count, add_queue
from .common import add_command, add_group, open_client
from .queue import known_queue


def add_parsers(sub: Any) -> None:
    what = "Fan-in signals the Pump could not deliver."
    add_group(sub, "poison", "list or replay poisoned signals", what, _add_list, _add_replay)


def _add_list(psub: Any) -> None:
    plist = psub.add_parser(
        "list",
        help="show a queue's poisoned signals, oldest first",
        description="Show a queue's poisoned signals with their reasons.",
    )
    add_queue(plist)
    add_count(plist, "--count", 1, 100_000, 20, "how many (default %(default)s)")
    add_command(plist, run_poison_list, json_flag=True)


def _add_replay(psub: Any) -> None:
    replay = psub.add_parser(
        "replay",
        help="move poisoned signals back to the outbox",
        description="Move poisoned signals back to the tail of their "
        "queue's outbox, for the Pump to deliver again.",
    )
    add_queue(replay)
    add_count(replay, "--count", 1, None, None, "how many, oldest first (default: all)")
    add_command(replay, run_poison_replay)


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
        known_queue(mq, args.queue, args.prefix)
        items = mq.perform(poison_list(mq.keys, args.queue, args.count))
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
        known_queue(mq, args.queue, args.prefix)
        count = args.count if args.count is not None else mq.queue(args.queue).stats()["poison"]
        moved = mq.perform(poison_replay(mq.keys, args.queue, count)) if count else 0
    finally:
        mq.close()
    print(f"replayed {moved} signal(s) of {args.queue!r} to its outbox")
    return 0
