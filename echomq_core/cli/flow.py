"""``echomq flow show|ls|close|cancel|retry``: a flow read as a tree, root flows listed by
state, and the three lifecycle writes of a flow's root.

The reads are :mod:`echomq_core.seeing.inspection`'s (the dashboard renders the same ones); this
module prints them as JSON, :mod:`.flowtext` as text. The writes: ``flow close`` (a reader is
done with a released barrier flow: its ``closed`` retention starts), ``flow cancel`` and
``flow retry`` (cancel a flow, repair a failed or cancelled one: see
:mod:`echomq_core.flows.lifecycle`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

from ..client.clients import EchoMQ
from ..errors import JobNotFound
from ..flows.waiting import FlowWait
from ..models import FlowCap, FlowSummary
from ..seeing.inspection import flow_counts, read_tree
from ..wire.keyspace import FLOW_LISTS, check_job_id, check_queue
from .arguments import add_count, add_queue, add_queue_or_all, add_seconds, int_at_least
from .common import CommandFailed, add_command, add_group, open_client
from .flowtext import render, render_failures
from .printing import Progress, fmt_ago, table
from .queue import known_queue


def add_parsers(sub: Any) -> None:
    commands = (_add_show, _add_ls, _add_writes)
    add_group(
        sub, "flow", "inspect, list and close flows", "Inspect, list and close flows.", *commands
    )


def _add_show(flow: Any) -> None:
    show = flow.add_parser(
        "show",
        help="a flow's parent state and counts (a tree for nested flows)",
        description="Print a flow: parent state, N, outstanding, processed, ignored, failed, "
        "and its sub-flows as a tree; then its dead children with their errors (a failed "
        "sub-flow by the leaf that raised) and the last traceback of the first (of each with "
        "--tracebacks). --watch shows a progress bar until the "
        "parent is released (exit 0), or failed or cancelled (exit 1).",
    )
    _root_args(show, "the parent's job id")
    show.add_argument("--watch", action="store_true", help="wait until the flow settles")
    add_seconds(
        show,
        "--timeout",
        0.0,
        None,
        "with --watch: give up after S seconds (exit 1); default: never",
    )
    add_seconds(
        show,
        "--interval",
        0.01,
        0.5,
        "with --watch: the most seconds between reads, the first ones come sooner "
        "(default %(default)s)",
    )
    add_count(
        show,
        "--failures",
        1,
        10_000,
        5,
        "list up to N dead children with their errors, fail-parent ones first "
        "(default %(default)s)",
    )
    show.add_argument(
        "--tracebacks",
        action="store_true",
        help="print the last traceback of every dead child listed (default: the first's)",
    )
    add_command(show, run_flow_show, json_flag=True)


def _add_ls(flow: Any) -> None:
    ls = flow.add_parser(
        "ls",
        help="list root flows: parent id, state, N, settled, age, time in state",
        description="List the root flows of QUEUE, or of every registered queue: parent id, "
        f"state ({', '.join(FLOW_LISTS)}), N, settled children, age and time in its "
        "state. Completed: worker-run flows whose parent job completed, as long as the "
        "queue's completed retention keeps them. Oldest first within each state; paged: "
        "--limit flows per state from --offset.",
    )
    add_queue_or_all(ls)
    ls.add_argument("--state", choices=FLOW_LISTS, default=None, help="only flows in this state")
    add_count(ls, "--limit", 1, 10_000, 100, "flows per state and queue (default %(default)s)")
    ls.add_argument(
        "--offset",
        type=int_at_least(0),
        default=0,
        metavar="K",
        help="skip the K oldest of each state (default %(default)s)",
    )
    add_command(ls, run_flow_ls, json_flag=True)


def _add_writes(flow: Any) -> None:
    """``flow close``, ``flow cancel``, ``flow retry``: the lifecycle writes of a root."""
    close = flow.add_parser(
        "close",
        help="close a released barrier flow (its retention starts)",
        description="A reader is done with a released barrier flow (added with "
        "barrier=True): close it, which starts its 'closed' retention. Idempotent; a flow "
        "that already ended otherwise (failed, completed) is left as it is. Prints the "
        "state after the call. Exit 1 when there is no such flow, or it is still held.",
    )
    _root_args(close)
    add_command(close, run_flow_close, json_flag=True)

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
    add_command(cancel, run_flow_cancel, json_flag=True)

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
    add_command(retry, run_flow_retry, json_flag=True)


def _root_args(parser: argparse.ArgumentParser, parent: str = "the root parent's job id") -> None:
    """QUEUE PARENT_ID of a flow's root (show, close, cancel, retry)."""
    add_queue(parser, "the parent's queue")
    parser.add_argument("parent_id", metavar="PARENT_ID", help=parent)


# -- flow show -----------------------------------------------------------------------------


def run_flow_show(args: argparse.Namespace) -> int:
    check_queue(args.queue)
    check_job_id(args.parent_id)
    mq = open_client(args)
    try:
        args.queue = mq.home(args.queue, args.parent_id)  # a sharded queue: the parent's shard
        snap = mq.snapshot(args.queue, args.parent_id)
        if snap.parent_state is None and snap.total == 0:
            raise CommandFailed(f"no flow {args.parent_id} in queue {args.queue!r}")
        ended = _watch(mq, args) if args.watch else None
        tree = read_tree(mq, args.queue, args.parent_id)
        died = tree.snap.failed + tree.snap.ignored
        failures = (
            mq.child_failures(args.queue, args.parent_id, limit=args.failures) if died else []
        )
        cap = mq.flow_cap(args.queue, args.parent_id)
        if args.json:
            doc = tree.to_dict()
            doc["failures"] = [dataclasses.asdict(f) for f in failures]
            doc["cap"] = None if cap is None else cap.to_dict()
            print(json.dumps(doc))
        else:
            print("\n".join(render(tree)))
            if cap is not None:
                print(cap_line(cap))
            if failures:
                shown = render_failures(failures, args.failures, died, tracebacks=args.tracebacks)
                print("\n".join(shown))
        if ended:
            raise CommandFailed(f"flow {args.parent_id} {ended}")
    finally:
        mq.close()
    return 0


def cap_line(cap: FlowCap) -> str:
    """``running <admitted> / cap <K>``, what waits, and each child queue's share: admitted
    children hold a token (leased, pending or waiting for a retry); never more than K."""
    shares = ", ".join(f"{q} {a}/{s}" for q, (a, s) in sorted(cap.shares.items()))
    return (
        f"running {cap.admitted:,} / cap {cap.cap:,} (admitted: leased, pending or retrying), "
        f"{cap.waiting:,} waiting; per queue: {shares or '-'}"
    )


def _watch(mq: EchoMQ, args: argparse.Namespace) -> str | None:
    """Show a progress bar until the parent is released (None), or failed or cancelled (which
    of the two)."""
    wait = FlowWait(args.queue, args.parent_id, poll=args.interval, timeout=args.timeout)
    progress: Progress | None = None
    try:
        while True:
            verdict = mq.perform(wait.read(mq.keys))
            snap = verdict.snap
            if progress is None:
                progress = Progress(snap.total, enabled=not args.json)
            progress.update(
                snap.settled,
                "" if snap.parent_state == "held" else f"parent {snap.parent_state}",
                final=verdict.done and not verdict.gave_up,
            )
            if verdict.gave_up:  # what EchoMQ.wait says: the text names what holds it up
                raise verdict.timeout_error(args.timeout)
            if verdict.done:
                return verdict.kind if verdict.never_released else None
            time.sleep(verdict.pause)
    finally:
        if progress is not None:
            progress.close()


# -- flow ls / close ------------------------------------------------------------------------


def run_flow_ls(args: argparse.Namespace) -> int:
    if args.queue is not None:
        check_queue(args.queue)
    states = [args.state] if args.state else list(FLOW_LISTS)
    mq = open_client(args)
    try:
        if args.queue is not None:
            known_queue(mq, args.queue, args.prefix)
        names = [args.queue] if args.queue is not None else mq.queues()
        flows: list[FlowSummary] = []
        counts: dict[str, dict[str, int]] = {}
        for name in names:
            flows += mq.list_flows(name, args.state, limit=args.limit, offset=args.offset)
            counts[name] = mq.perform(flow_counts(mq.keys, name, states))
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
    controls = any(f.controls for f in flows)
    headers = ["queue", "parent id", "state", "N", "settled", "age", "in state"]
    if controls:
        headers.append("controls")
    rows = [
        [
            f.queue,
            f.parent_id,
            f.state,
            f"{f.total:,}",
            f"{f.settled:,}",
            fmt_ago(f.age),
            fmt_ago(f.since),
            *([f.controls] if controls else []),
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
