"""``echomq queue stats|config|retry-dead``: counts per state, root flows and their memory;
a queue's retention settings (stored on the server for every Pump) and rate limit (for every
worker); dead plain jobs queued again. Also :func:`known_queue`, the check every command that
names a queue makes first.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass
from typing import Any

from ..checks import check_int
from ..client.clients import EchoMQ
from ..control.groups import LOAD_LIMIT, MAX_WEIGHT, GroupLoad
from ..control.rates import RateLimit, parse_burst, parse_rate
from ..errors import InvalidArgument, InvalidInput
from ..flows import sharding
from ..flows.retention import MAX_AGE, MAX_COUNT, SETTINGS
from ..flows.sharding import MAX_SHARDS
from ..seeing.inspection import MEMORY_SAMPLE, FlowMemory, flow_memory
from ..wire.keyspace import FLOW_INDEXES, check_group, check_job_id, check_queue
from .arguments import add_queue, add_queue_or_all, age_or_none, count_or_none, fmt_seconds
from .common import CommandFailed, add_command, add_group, open_client
from .printing import fmt_bytes, table


def add_parsers(sub: Any) -> None:
    commands = (_add_stats, _add_config, _add_retry_dead)
    add_group(
        sub, "queue", "inspect and configure queues", "Inspect and configure queues.", *commands
    )


def _add_stats(queue: Any) -> None:
    stats = queue.add_parser(
        "stats",
        help="job counts per state, flows per state and their memory",
        description="Counts per state of QUEUE, or of every registered "
        "queue: pending, active, delayed, dead, completed, "
        f"outbox (signals in transit), poison; root flows {', '.join(FLOW_INDEXES)}, "
        f"and an estimate of the server memory those flows hold (up to {MEMORY_SAMPLE} "
        "sampled per state with MEMORY USAGE, their children's rows included, average x "
        "count; 'unavailable' when the server refuses MEMORY USAGE). A rate-limited "
        "queue gets a line with its limit and how many starts may go now.",
    )
    add_queue_or_all(stats)
    add_command(stats, run_queue_stats, json_flag=True)


def _add_config(queue: Any) -> None:
    config = queue.add_parser(
        "config",
        help="show (and with options, set) a queue's retention, rate limit and group rule",
        description="Show QUEUE's retention settings, stored on the server and applied by "
        "every Pump's sweep, its rate limit and its group rule; with options, set those "
        "first. Each end "
        "state has an age (seconds, or with a unit: 90s, 15m, 12h, 7d) and a count (the "
        "newest kept); 'none' means no limit. "
        + "; ".join(f"{state}: {what}" for state, what in _END_STATES.items())
        + ". A QUEUE no job was added to is refused when only shown (exit 1, as queue stats "
        "does); with a setting it is configured ahead of its first job (a warning when its "
        "name is close to a known queue's).",
    )
    add_queue(config)
    config.add_argument(
        "--rate",
        type=_rate_arg,
        default=argparse.SUPPRESS,
        metavar="RATE",
        help="at most this many job starts per window across every worker, spread evenly "
        "(every span of the window holds at most that many): 100/s, 6000/min, 5/500ms, "
        "1000/h; none removes the limit (default: none)",
    )
    config.add_argument(
        "--burst",
        type=_burst_arg,
        default=argparse.SUPPRESS,
        metavar="N",
        help="with --rate: up to N may start at once after a pause (then a window can hold "
        "the limit + N - 1; default: 1)",
    )
    config.add_argument(
        "--group-from",
        dest="group_from",
        default=argparse.SUPPRESS,
        metavar="KEY",
        help="take the fairness group of each job or flow child added without one from its "
        "payload's KEY (a tenant, an account: the queue serves the groups in turn); none "
        "removes the rule (default: none)",
    )
    config.add_argument(
        "--group-weight",
        dest="group_weight",
        action="append",
        type=_weight_arg,
        default=argparse.SUPPRESS,
        metavar="GROUP=W",
        help="give GROUP W jobs per turn (1-1000; 1 is every group's default); may repeat",
    )
    config.add_argument(
        "--shards",
        type=int,
        default=argparse.SUPPRESS,
        metavar="K",
        help=f"serve QUEUE from K physical queues (1-{MAX_SHARDS}), each on its own slot, on "
        "distinct masters of a Cluster: one fan-out then runs on K masters. Only while the "
        "queue is empty (refused otherwise); 1 is a plain queue (default: 1)",
    )
    for name in SETTINGS:
        state, kind = name.rsplit("_", 1)
        what, default = _END_STATES[state], SETTINGS[name]
        if kind == "age":
            read, metavar = age_or_none(MAX_AGE), "AGE"
            text = f"keep {what} this long (default {fmt_seconds(default)})"
        else:
            read, metavar = count_or_none(MAX_COUNT), "N"
            text = f"keep the newest N {what} (default {default or 'none'})"
        config.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=read,
            default=argparse.SUPPRESS,
            metavar=metavar,
            help=text,
        )
    add_command(config, run_queue_config, json_flag=True)


def _add_retry_dead(queue: Any) -> None:
    revive = queue.add_parser(
        "retry-dead",
        help="give dead plain jobs fresh attempts",
        description="Give the dead plain jobs JOB_ID... of QUEUE fresh attempts and queue them "
        "again, behind what is pending (their payloads and settings stay). A flow's dead "
        "children are re-run by repairing the flow instead ('echomq flow retry').",
    )
    add_queue(revive)
    revive.add_argument("job_ids", nargs="+", metavar="JOB_ID")
    add_command(revive, run_queue_retry_dead, json_flag=True)


def _rate_arg(text: str) -> str:
    """A rate as ``--rate`` takes it, checked before anything is sent."""
    try:
        parse_rate(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _weight_arg(text: str) -> tuple[str, int]:
    """A ``--group-weight`` value, ``GROUP=W``, checked before anything is sent."""
    group, sep, weight = text.rpartition("=")
    try:
        if not sep:
            raise ValueError
        return check_group(group), check_int("weight", int(weight), 1, MAX_WEIGHT)
    except (ValueError, InvalidInput) as exc:
        why = f"invalid group weight {text!r:.80}: GROUP=W, W an int from 1 to {MAX_WEIGHT}"
        raise argparse.ArgumentTypeError(f"{why} ({exc})" if str(exc) else why) from None


def _burst_arg(text: str) -> int:
    """A burst as ``--burst`` takes it: an int of 1 or more."""
    try:
        return parse_burst(int(text), (1, 1000))
    except ValueError:
        why = f"invalid burst {text!r:.60}: an int of 1 or more"
        raise argparse.ArgumentTypeError(why) from None
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def rate_line(queue: str, rate: RateLimit) -> str:
    """One line on a rate-limited queue: its limit and how many may start now."""
    ready = f"{rate.ready:,} may start now"
    if rate.next_in:
        ready += f" (the next in {rate.next_in:.3f} s)"
    return f"rate limit of {queue!r}: {rate}; {ready}"


def rate_doc(rate: RateLimit) -> dict[str, Any]:
    """A rate limit as the commands' JSON shows it."""
    return {
        "limit": rate.limit,
        "window_s": rate.window,
        "text": rate.text,
        "burst": rate.burst,
        "used": rate.used,
        "ready": rate.ready,
        "next_in_s": rate.next_in,
        "resets_in_s": rate.resets_in,
    }


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


#: How many known queue names an unknown-queue error lists.
SHOWN_QUEUES = 20


def known_queue(mq: EchoMQ, queue: str, prefix: str) -> None:
    """Refuse ``queue`` unless this keyspace's registry holds it (a queue is registered when
    the first job is added to it): a mistyped name or prefix would otherwise print zeros (or
    defaults) and exit 0. The error names the known queues, the closest first."""
    unknown, _ = unknown_queue(mq, queue, prefix)
    if unknown:
        raise CommandFailed(unknown)


def unknown_queue(mq: EchoMQ, queue: str, prefix: str) -> tuple[str, list[str]]:
    """Why ``queue`` is not a queue of this keyspace - naming the known ones, the closest
    first - and those closest names; ('', []) when the registry holds it. One read (the
    registry)."""
    names = sorted(mq.queues())
    if queue in names:
        return "", []
    if not names:
        why = f"no queue {queue!r}: there are no queues under prefix {prefix!r} (wrong --prefix?)"
        return why, []
    close = difflib.get_close_matches(queue, names, n=3, cutoff=0.6)
    listed = [*close, *(n for n in names if n not in close)][:SHOWN_QUEUES]
    more = f" and {len(names) - len(listed):,} more" if len(names) > len(listed) else ""
    hint = f"; did you mean {close[0]!r}?" if close else ""
    why = f"no queue {queue!r} under prefix {prefix!r}{hint} (known: {', '.join(listed)}{more})"
    return why, close


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
        # a sharded queue is one row under its logical name, its shards summed into it
        shards = mq.perform(sharding.resolve(mq.keys, mq.shard_cache, names))
        inner = {s for n in names for s in shards[n][1:]}
        names = [n for n in names if n not in inner]
        counts = {name: mq.queue(name).stats() for name in names}
        memory = {
            name: FlowMemory.merged([mq.perform(flow_memory(mq.keys, s)) for s in shards[name]])
            for name in names
        }
        limits = {name: mq.rate_limit(name) for name in names}
        loads = {name: mq.group_load(name) for name in names}
    finally:
        mq.close()
    rates = {name: rate for name, rate in limits.items() if rate is not None}
    busy = {name: load for name, load in loads.items() if load.waiting}
    if args.json:
        doc = {
            name: {
                **counts[name],
                "flows": memory[name].counts,
                "flow_memory": memory[name].memory_dict(),
                # only a rate-limited queue has the key, only a sharded one "shards"
                **({"rate": rate_doc(rates[name])} if name in rates else {}),
                **({"shards": list(shards[name])} if len(shards[name]) > 1 else {}),
                **({"groups": _groups_doc(busy[name])} if name in busy else {}),
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
    for name, rate in rates.items():
        print(rate_line(name, rate))
    for name, load in busy.items():
        print(_groups_line(name, load))
    for name in names:
        if len(shards[name]) > 1:
            print(f"{name}: {len(shards[name])} shards, summed ({', '.join(shards[name])})")
    refused = [m.reason for m in memory.values() if not m.available]
    if refused:
        print(f"(flow memory unavailable: {refused[0]})")
    return 0


def _groups_doc(load: GroupLoad) -> dict[str, Any]:
    """A queue's fairness groups as the commands' JSON shows them."""
    return {
        "waiting": load.waiting,
        "busiest": [{"group": g, "queued": n} for g, n in load.busiest],
        "complete": load.complete,
    }


def _groups_line(queue: str, load: GroupLoad) -> str:
    """One line on a queue's fairness groups: how many have work queued, the busiest."""
    busiest = ", ".join(f"{g} {n:,}" for g, n in load.busiest)
    more = "" if load.complete else f" (of the first {LOAD_LIMIT:,} groups read)"
    return (
        f"{queue}: {load.waiting:,} groups with work queued{more}, taking turns; "
        f"busiest (jobs queued): {busiest}"
    )


def _memory_cell(mem: FlowMemory) -> str:
    return fmt_bytes(mem.total_bytes) if mem.available else "unavailable"


# -- queue config --------------------------------------------------------------------------


def run_queue_config(args: argparse.Namespace) -> int:
    check_queue(args.queue)
    changes = {name: getattr(args, name) for name in SETTINGS if hasattr(args, name)}
    extra = [n for n in ("rate", "shards", "group_from", "group_weight") if hasattr(args, n)]
    if hasattr(args, "burst") and not hasattr(args, "rate"):
        raise CommandFailed("--burst goes with --rate (the burst is stored with the limit)")
    mq = open_client(args)
    try:
        unknown, close = unknown_queue(mq, args.queue, args.prefix)
        if unknown and not (changes or extra):
            # only showing: the defaults of a mistyped name would read as that queue's
            raise CommandFailed(
                f"{unknown}; to configure a queue before its first job, set a setting"
            )
        if close:
            # configuring a queue before its first job is legitimate (the settings register
            # it), so it goes on; but a name this close to a known one is likely a typo that
            # leaves the real queue as it was: say so
            print(f"echomq: warning: {unknown}; configuring it as a new queue", file=sys.stderr)
        if hasattr(args, "shards"):  # first: refused (nothing else set) while not empty
            mq.set_shards(args.queue, args.shards)
        if changes:
            mq.set_retention(args.queue, **changes)
        if hasattr(args, "rate"):
            mq.set_rate_limit(args.queue, args.rate, getattr(args, "burst", None))
        if hasattr(args, "group_from"):
            mq.set_group_rule(args.queue, args.group_from)
        for group, weight in getattr(args, "group_weight", []):
            mq.set_group_weight(args.queue, group, weight)
        shown = _Config(
            mq.retention(args.queue),
            mq.rate_limit(args.queue),
            mq.shards(args.queue),
            mq.group_rule(args.queue),
        )
    finally:
        mq.close()
    _show_config(args, shown, changes, extra)
    return 0


@dataclass(frozen=True, slots=True)
class _Config:
    settings: dict[str, float | int | None]
    rate: RateLimit | None
    shards: tuple[str, ...]
    rule: str | None


def _show_config(
    args: argparse.Namespace, shown: _Config, changes: dict[str, Any], extra: list[str]
) -> None:
    settings, rate, shards, rule = shown.settings, shown.rate, shown.shards, shown.rule
    if args.json:
        changed = sorted([*changes, *extra])
        doc: dict[str, Any] = {"queue": args.queue, "changed": changed, "retention": settings}
        if rate is not None or hasattr(args, "rate"):  # shown when set or just changed
            doc["rate"] = None if rate is None else rate_doc(rate)
        if len(shards) > 1 or hasattr(args, "shards"):
            doc["shards"] = list(shards)
        if rule is not None or hasattr(args, "group_from"):
            doc["group_from"] = rule
        print(json.dumps(doc))
        return
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
    if rate is not None:
        print(rate_line(args.queue, rate) + (" (set)" if hasattr(args, "rate") else ""))
    elif hasattr(args, "rate"):
        print(f"rate limit of {args.queue!r}: none (set)")
    if len(shards) > 1 or hasattr(args, "shards"):
        mark = " (set)" if hasattr(args, "shards") else ""
        print(f"shards of {args.queue!r}: {len(shards)} ({', '.join(shards)}){mark}")
    if rule is not None or hasattr(args, "group_from"):
        mark = " (set)" if hasattr(args, "group_from") else ""
        what = "none" if rule is None else f"the payload's {rule!r}"
        print(f"fairness groups of {args.queue!r}: {what}{mark}")


def _default_mark(name: str, value: float | int | None) -> str:
    return " (default)" if value == SETTINGS[name] else ""


# -- queue retry-dead -----------------------------------------------------------------------


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
