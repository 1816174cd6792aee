"""The inspection and lifecycle commands: ``echomq flow show|ls|close|cancel|retry``,
``echomq queue stats|config``, ``echomq poison list|replay``.

All are reads except these writes: ``flow close`` (a reader is done with a released barrier
flow: its ``closed`` retention starts), ``flow cancel`` and ``flow retry`` (cancel a flow,
repair a failed or cancelled one: see :mod:`echomq_core.lifecycle`), ``queue config`` with
options (the queue's retention settings, stored on the server for every Pump), and ``poison
replay``, which moves poisoned signals back to their outbox for the Pump to try again (after
the cause - a missing parent, a bug - was fixed).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import time
from typing import Any

from ..client import EchoMQ
from ..errors import InvalidInput, JobNotFound
from ..keyspace import FLOW_INDEXES, check_job_id, check_queue
from ..models import FlowSummary
from ..pump import parse_signal, poison_list, poison_replay
from ..retention import MAX_AGE, MAX_COUNT, SETTINGS
from .common import (
    CommandFailed,
    Progress,
    add_connection_options,
    add_verbosity,
    age_or_none,
    count_or_none,
    env_prefix,
    env_url,
    fmt_ago,
    fmt_bytes,
    fmt_seconds,
    int_at_least,
    open_client,
    seconds,
    table,
)
from .flowtree import (
    MEMORY_SAMPLE,
    FlowMemory,
    flow_counts,
    flow_memory,
    read_tree,
    render,
    render_failures,
)


def add_parsers(sub: Any) -> None:
    flow = sub.add_parser(
        "flow", help="inspect, list and close flows", description="Inspect, list and close flows."
    ).add_subparsers(dest="flow_command", metavar="COMMAND", required=True)
    show = flow.add_parser(
        "show",
        help="a flow's parent state and counts (a tree for nested flows)",
        description="Print a flow: parent state, N, outstanding, processed, ignored, failed, "
        "and its sub-flows as a tree; then its dead children with their errors (a failed "
        "sub-flow by the leaf that raised) and the last traceback of the first (of each with "
        "--tracebacks). --watch shows a progress bar until the "
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
    show.add_argument(
        "--failures",
        type=int_at_least(1, 10_000),
        default=5,
        metavar="N",
        help="list up to N dead children with their errors, fail-parent ones first "
        "(default %(default)s)",
    )
    show.add_argument(
        "--tracebacks",
        action="store_true",
        help="print the last traceback of every dead child listed (default: the first's)",
    )
    show.add_argument("--json", action="store_true", help="print one JSON object")
    _common(show, run_flow_show)

    ls = flow.add_parser(
        "ls",
        help="list root flows: parent id, state, N, settled, age, time in state",
        description="List the root flows of QUEUE, or of every registered queue: parent id, "
        f"state ({', '.join(FLOW_INDEXES)}), N, settled children, age and time in its "
        "state. Oldest first within each state; paged: --limit flows per state from --offset.",
    )
    ls.add_argument("queue", nargs="?", metavar="QUEUE", help="one queue (default: all)")
    ls.add_argument("--state", choices=FLOW_INDEXES, default=None, help="only flows in this state")
    ls.add_argument(
        "--limit",
        type=int_at_least(1, 10_000),
        default=100,
        metavar="N",
        help="flows per state and queue (default %(default)s)",
    )
    ls.add_argument(
        "--offset",
        type=int_at_least(0),
        default=0,
        metavar="K",
        help="skip the K oldest of each state (default %(default)s)",
    )
    ls.add_argument("--json", action="store_true", help="print one JSON object")
    _common(ls, run_flow_ls)

    close = flow.add_parser(
        "close",
        help="close a released barrier flow (its retention starts)",
        description="A reader is done with a released barrier flow (added with "
        "barrier=True): close it, which starts its 'closed' retention. Idempotent; a flow "
        "that already ended otherwise (failed, completed) is left as it is. Prints the "
        "state after the call. Exit 1 when there is no such flow, or it is still held.",
    )
    _root_args(close)
    _common(close, run_flow_close, json_flag=True)

    cancel = flow.add_parser(
        "cancel",
        help="cancel a flow: nothing of it that has not started starts",
        description="Cancel a flow and every child below it, in every queue: pending and "
        "retrying children are removed, leased ones lose their lease (their worker drops "
        "them before they start), running ones finish but change nothing. The parent's state "
        "becomes 'cancelled' with the reason; the reads still work; its 'cancelled' "
        "retention runs. Idempotent. Exit 1 when there is no such flow.",
    )
    _root_args(cancel)
    cancel.add_argument("--reason", default="", help="why (shown by flow show and in waits)")
    _common(cancel, run_flow_cancel, json_flag=True)

    retry = flow.add_parser(
        "retry",
        help="repair a failed or cancelled flow: re-run only what died (or never ran)",
        description="Put a failed flow's dead children back to pending with fresh attempts "
        "(with --ignored its ignored failures too), or a cancelled flow's cancelled children; "
        "the parent is held again; children that completed keep their values and never run "
        "again; sub-flows are repaired bottom-up. Idempotent. Exit 1 when there is nothing "
        "to repair.",
    )
    _root_args(retry)
    retry.add_argument(
        "--ignored", action="store_true", help="also re-run children whose failure was ignored"
    )
    _common(retry, run_flow_retry, json_flag=True)

    queue = sub.add_parser(
        "queue", help="inspect and configure queues", description="Inspect and configure queues."
    ).add_subparsers(dest="queue_command", metavar="COMMAND", required=True)
    stats = queue.add_parser(
        "stats",
        help="job counts per state, flows per state and their memory",
        description="Counts per state of QUEUE, or of every registered "
        "queue: pending, active, delayed, dead, completed, "
        f"outbox (signals in transit), poison; root flows {', '.join(FLOW_INDEXES)}, "
        f"and an estimate of the server memory those flows hold (up to {MEMORY_SAMPLE} "
        "sampled per state with MEMORY USAGE, their children's rows included, average x "
        "count; 'unavailable' when the server refuses MEMORY USAGE).",
    )
    stats.add_argument("queue", nargs="?", metavar="QUEUE", help="one queue (default: all)")
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    _common(stats, run_queue_stats)

    config = queue.add_parser(
        "config",
        help="show (and with options, set) a queue's retention",
        description="Show QUEUE's retention settings, stored on the server and applied by "
        "every Pump's sweep; with options, set those first. Each end state has an age "
        "(seconds, or with a unit: 90s, 15m, 12h, 7d) and a count (the newest kept); 'none' "
        "means no limit. "
        + "; ".join(f"{state}: {what}" for state, what in _END_STATES.items())
        + ".",
    )
    config.add_argument("queue", metavar="QUEUE")
    for name in SETTINGS:
        state, kind = name.rsplit("_", 1)
        flag = "--" + name.replace("_", "-")
        if kind == "age":
            config.add_argument(
                flag,
                dest=name,
                type=age_or_none(MAX_AGE),
                default=argparse.SUPPRESS,
                metavar="AGE",
                help=f"keep {_END_STATES[state]} this long (default {fmt_seconds(SETTINGS[name])})",
            )
        else:
            config.add_argument(
                flag,
                dest=name,
                type=count_or_none(MAX_COUNT),
                default=argparse.SUPPRESS,
                metavar="N",
                help=f"keep the newest N {_END_STATES[state]} (default {SETTINGS[name] or 'none'})",
            )
    config.add_argument("--json", action="store_true", help="print one JSON object")
    _common(config, run_queue_config)

    revive = queue.add_parser(
        "retry-dead",
        help="give dead plain jobs fresh attempts",
        description="Give the dead plain jobs JOB_ID... of QUEUE fresh attempts and queue them "
        "again, behind what is pending (their payloads and settings stay). A flow's dead "
        "children are re-run by repairing the flow instead ('echomq flow retry').",
    )
    revive.add_argument("queue", metavar="QUEUE")
    revive.add_argument("job_ids", nargs="+", metavar="JOB_ID")
    _common(revive, run_queue_retry_dead, json_flag=True)

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


#: What each retention setting keeps (``queue config``); a setting not named here is shown
#: by its name.
_KNOWN_END_STATES = {
    "completed": "completed jobs and worker-run flows",
    "dead": "dead jobs",
    "failed": "failed flows",
    "closed": "barrier flows a reader closed",
    "unclosed": "released barrier flows nobody closed",
    "cancelled": "cancelled flows",
    "poison": "poisoned signals",
}
_END_STATES = {
    state: _KNOWN_END_STATES.get(state, f"{state} entries")
    for state in dict.fromkeys(name.rsplit("_", 1)[0] for name in SETTINGS)
}


def _root_args(parser: argparse.ArgumentParser) -> None:
    """QUEUE PARENT_ID of a flow's root (close, cancel, retry)."""
    parser.add_argument("queue", metavar="QUEUE", help="the parent's queue")
    parser.add_argument("parent_id", metavar="PARENT_ID", help="the root parent's job id")


def _common(parser: argparse.ArgumentParser, run: Any, *, json_flag: bool = False) -> None:
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_connection_options(parser, url_default=env_url(), prefix_default=env_prefix())
    add_verbosity(parser)
    parser.set_defaults(invoke=run)


#: How many known queue names an unknown-queue error lists.
SHOWN_QUEUES = 20


def known_queue(mq: EchoMQ, queue: str, prefix: str) -> None:
    """Refuse ``queue`` unless this keyspace's registry holds it (a queue is registered when
    the first job is added to it): a mistyped name or prefix would otherwise print zeros and
    exit 0. The error names the known queues, the closest first."""
    names = sorted(mq.queues())
    if queue in names:
        return
    if not names:
        raise CommandFailed(
            f"no queue {queue!r}: there are no queues under prefix {prefix!r} (wrong --prefix?)"
        )
    close = difflib.get_close_matches(queue, names, n=3, cutoff=0.6)
    listed = [*close, *(n for n in names if n not in close)][:SHOWN_QUEUES]
    more = f" and {len(names) - len(listed):,} more" if len(names) > len(listed) else ""
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise CommandFailed(
        f"no queue {queue!r} under prefix {prefix!r}{hint} (known: {', '.join(listed)}{more})"
    )


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
        died = tree.snap.failed + tree.snap.ignored
        failures = (
            mq.child_failures(args.queue, args.parent_id, limit=args.failures) if died else []
        )
        if args.json:
            doc = tree.to_dict()
            doc["failures"] = [dataclasses.asdict(f) for f in failures]
            print(json.dumps(doc))
        else:
            print("\n".join(render(tree)))
            if failures:
                shown = render_failures(failures, args.failures, died, tracebacks=args.tracebacks)
                print("\n".join(shown))
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


# -- flow ls / close ------------------------------------------------------------------------


def run_flow_ls(args: argparse.Namespace) -> int:
    if args.queue is not None:
        check_queue(args.queue)
    states = [args.state] if args.state else list(FLOW_INDEXES)
    mq = open_client(args)
    try:
        if args.queue is not None:
            known_queue(mq, args.queue, args.prefix)
        names = [args.queue] if args.queue is not None else mq.queues()
        flows: list[FlowSummary] = []
        counts: dict[str, dict[str, int]] = {}
        for name in names:
            flows += mq.list_flows(name, args.state, limit=args.limit, offset=args.offset)
            counts[name] = {
                state: n
                for state, n in mq.perform(flow_counts(mq.keys, name)).items()
                if state in states
            }
    finally:
        mq.close()
    # flows of each (queue, state) beyond this page
    more = sum(
        max(0, n - args.offset - args.limit)
        for by_state in counts.values()
        for n in by_state.values()
    )
    if args.json:
        doc = {
            "queues": names,
            "state": args.state,
            "limit": args.limit,
            "offset": args.offset,
            "counts": counts,
            "more": more,
            "flows": [f.to_dict() for f in flows],
        }
        print(json.dumps(doc))
        return 0
    if not flows:
        where = f"queue {args.queue!r}" if args.queue is not None else f"prefix {args.prefix!r}"
        state = f"{args.state} " if args.state else ""
        past = f" past offset {args.offset}" if args.offset else ""
        print(f"no {state}flows under {where}{past}")
        return 0
    errors = any(f.error for f in flows)
    headers = ["queue", "parent id", "state", "N", "settled", "age", "in state"]
    rows = [
        [
            f.queue,
            f.parent_id,
            f.state,
            f"{f.total:,}",
            f"{f.settled:,}",
            fmt_ago(f.age),
            fmt_ago(f.since),
            *([_clip(f.error or "")] if errors else []),
        ]
        for f in flows
    ]
    print("\n".join(table([*headers, *(["error"] if errors else [])], rows, left=3)))
    if more:
        print(
            f"({more:,} more beyond this page of {args.limit:,} per state: "
            f"--offset {args.offset + args.limit})"
        )
    return 0


def _clip(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def _on_flow(args: argparse.Namespace, action: Any) -> Any:
    """Run ``action(mq)`` on the flow QUEUE PARENT_ID names; a missing flow is one line."""
    check_queue(args.queue)
    check_job_id(args.parent_id)
    mq = open_client(args)
    try:
        return action(mq)
    except JobNotFound:
        raise CommandFailed(
            f"no flow {args.parent_id} in queue {args.queue!r} (never added, or expired)"
        ) from None
    finally:
        mq.close()


def _say(args: argparse.Namespace, doc: dict[str, Any], text: str) -> int:
    where = {"queue": args.queue, "parent_id": args.parent_id}
    print(
        json.dumps({**where, **doc})
        if args.json
        else f"flow {args.parent_id} in {args.queue!r}: {text}"
    )
    return 0


def run_flow_close(args: argparse.Namespace) -> int:
    state = _on_flow(args, lambda mq: mq.close_flow(args.queue, args.parent_id))
    if state == "closed":
        return _say(args, {"state": state}, "closed (its retention runs)")
    return _say(
        args,
        {"state": state},
        f"{state} (it ended otherwise: nothing to close, its own retention runs)",
    )


def run_flow_cancel(args: argparse.Namespace) -> int:
    result = _on_flow(
        args, lambda mq: mq.cancel_flow(args.queue, args.parent_id, reason=args.reason)
    )
    doc = {"state": result.state, "children_stopped": result.children, "nodes": result.nodes}
    if result.state == "cancelled":
        return _say(
            args, doc, f"cancelled ({result.children:,} children stopped, {result.nodes} node(s))"
        )
    return _say(args, doc, f"{result.state} (it had ended: nothing to cancel)")


def run_flow_retry(args: argparse.Namespace) -> int:
    result = _on_flow(
        args, lambda mq: mq.retry_flow(args.queue, args.parent_id, ignored=args.ignored)
    )
    doc = {
        "state": result.state,
        "requeued": result.requeued,
        "nodes": result.nodes,
        "repairs": result.repairs,
    }
    return _say(
        args,
        doc,
        f"{result.state}; {result.requeued:,} children back to work "
        f"({result.nodes} node(s)); repair #{result.repairs}",
    )


# -- queue stats ---------------------------------------------------------------------------

COLUMNS = ("pending", "active", "delayed", "dead", "completed", "outbox", "poison")


def run_queue_stats(args: argparse.Namespace) -> int:
    if args.queue is not None:
        check_queue(args.queue)
    mq = open_client(args)
    try:
        if args.queue is not None:
            known_queue(mq, args.queue, args.prefix)
        names = [args.queue] if args.queue is not None else mq.queues()
        counts = {name: mq.queue(name).stats() for name in names}
        memory = {name: mq.perform(flow_memory(mq.keys, name)) for name in names}
    finally:
        mq.close()
    if args.json:
        doc = {
            name: {
                **counts[name],
                "flows": memory[name].counts,
                "flow_memory": memory[name].memory_dict(),
            }
            for name in names
        }
        print(json.dumps(doc))
        return 0
    if not names:
        print(f"no queues under prefix {args.prefix!r}")
        return 0
    headers = ["queue", *COLUMNS, *FLOW_INDEXES, "flow memory (est.)"]
    rows = [
        [
            name,
            *(f"{counts[name].get(c, 0):,}" for c in COLUMNS),
            *(f"{memory[name].counts[s]:,}" for s in FLOW_INDEXES),
            _memory_cell(memory[name]),
        ]
        for name in names
    ]
    print("\n".join(table(headers, rows)))
    refused = [m.reason for m in memory.values() if not m.available]
    if refused:
        print(f"(flow memory unavailable: {refused[0]})")
    return 0


def _memory_cell(mem: FlowMemory) -> str:
    return fmt_bytes(mem.total_bytes) if mem.available else "unavailable"


# -- queue config --------------------------------------------------------------------------


def run_queue_config(args: argparse.Namespace) -> int:
    check_queue(args.queue)
    changes = {name: getattr(args, name) for name in SETTINGS if hasattr(args, name)}
    mq = open_client(args)
    try:
        if changes:
            mq.set_retention(args.queue, **changes)
        settings = mq.retention(args.queue)
    finally:
        mq.close()
    if args.json:
        doc = {"queue": args.queue, "changed": sorted(changes), "retention": settings}
        print(json.dumps(doc))
        return 0
    title = f"retention of queue {args.queue!r}"
    if changes:
        title += f" (set: {', '.join(n.replace('_', '-') for n in changes)})"
    rows = []
    for state in _END_STATES:
        age, count = settings[f"{state}_age"], settings[f"{state}_count"]
        rows.append(
            [
                state,
                fmt_seconds(age) + _default_mark(f"{state}_age", age),
                ("none" if count is None else f"{count:,}")
                + _default_mark(f"{state}_count", count),
            ]
        )
    print(title)
    print("\n".join(table(["end state", "age", "count"], rows, left=3)))
    return 0


def _default_mark(name: str, value: float | int | None) -> str:
    return " (default)" if value == SETTINGS[name] else ""


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


def run_queue_retry_dead(args: argparse.Namespace) -> int:
    check_queue(args.queue)
    for job_id in args.job_ids:
        check_job_id(job_id)
    mq = open_client(args)
    try:
        revived, left = mq.queue(args.queue).retry_dead(args.job_ids)
    finally:
        mq.close()
    if args.json:
        print(json.dumps({"queue": args.queue, "revived": revived, "left": left}))
    else:
        print(f"{revived} dead job(s) of {args.queue!r} queued again")
        for job_id in left:
            print(f"left as it is (not dead, or a flow's: repair the flow): {job_id}")
    return 0 if not left else 1


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
