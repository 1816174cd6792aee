"""Fairness groups (issue 50): how soon do light keys finish behind a heavy one - on an
embedded server.

    python -m bench.fairness [--heavy 100000] [--light 50] [--per-light 100] [--workers 4]
                             [--concurrency 50] [--handler-ms 1] [--rounds 3] [--skip-bullmq]
                             [--pump-page N] [--out DIR] [--note TEXT]

One key with ``heavy`` children is added first, then ``light`` keys with ``per_light`` children
each; then W worker processes of concurrency C start (their start-up is timed, as a user's is)
and work everything off. A key's **time to finish** runs from the moment the worker processes
are started to the moment it is done (the issue's figure: the light keys' median, groups
against no groups, at most 1/10):

* **EchoMQ, groups**: each key is a barrier flow (``add_flow`` to a parent queue, its
  children in the work queue), the heavy key's children ``group="heavy"``, light key i's
  ``group=f"tenant-{i}"``: a claim serves the groups with waiting work in turn. A Pump runs in
  this process (the flows are cross-queue); the workers run their own, as by default. A key
  finishes when its flow is released; the release moment is read from the server after the
  run (``list_flows(state="released")``: time in state, against the server's clock, read
  against ``TIME`` taken when the workers were started). Each key's last child's completion
  is given too (the work queue's completed set, scored by completion time): the release
  follows it once the Pump has delivered the children's signals. ``--pump-page`` sets every
  Pump's page (the driver's and the workers').
* **EchoMQ, no groups**: the same flows without groups (a queue is FIFO within a priority).
* **BullMQ Node**: BullMQ for Node's plain queue (the free BullMQ has no groups; BullMQ Pro
  has them) - the reference a user leaves. Plain jobs, ``Queue.addBulk``: the heavy key's
  jobs, then each light key's; W Node worker processes with ``Worker`` concurrency C. A key
  finishes with its last job: the completed set's scores (``finishedOn``, ms).

Every handler waits ``handler_ms`` (1 ms: ``time.sleep`` / ``setTimeout``): a small remote
call's worth of waiting, the same in every system, that does not compete with the servers
and libraries for the machine's two cores (a CPU step would measure the core contention more
than the queue). Each round runs the three systems in turn on a flushed server; the figures
are medians over rounds with their ranges, each time also counted from the first worker ready
(start-up left out). Writes fairness.json and fairness.md to ``--out``
(bench/results/issue50/).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing as mp
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import redis

from echomq_core import Child, EchoMQ, Pump
from echomq_core.server import EmbeddedServer

RESULTS = Path(__file__).resolve().parent / "results" / "issue50"
NODE_SCRIPT = Path(__file__).resolve().parent / "peers" / "node" / "fairness.js"
PARENTS, WORK, BULL_QUEUE = "fair-keys", "fair-work", "fair"
PREFIX = "fair"
TIMEOUT = 1800.0  # one run's limit (s)
SYSTEMS = ("echomq_groups", "echomq_plain", "bullmq_node")


def worker_main(
    url: str, concurrency: int, handler_ms: float, pump_page: int, ready: Any, stop: Any
) -> None:
    """One worker process: the work queue's handler sleeps ``handler_ms``; puts its ready
    moment (wall clock) on ``ready`` once the worker runs. ``pump_page``: its Pump's page
    (0: the worker's default Pump)."""
    from echomq_core import Worker
    from echomq_core.pump.pump import WORKER_PUMP

    def handle(job: Any) -> Any:
        time.sleep(handler_ms / 1000)
        return job.payload

    mq = EchoMQ(url, prefix=PREFIX)
    pump = dataclasses.replace(WORKER_PUMP, page=pump_page) if pump_page else True
    worker = Worker(mq, {WORK: handle}, concurrency=concurrency, pump=pump).start()
    ready.put(time.time())
    stop.wait()
    worker.stop()
    mq.close()


def _server_ms(r: redis.Redis) -> float:
    secs, micros = r.time()
    return float(secs) * 1000 + float(micros) / 1000


def _wait(done: Callable[[], bool], alive: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not done():
        if not alive():
            raise RuntimeError(f"a worker process died before {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {TIMEOUT:.0f} s")
        time.sleep(0.05)


def _keys(args: argparse.Namespace) -> list[str]:
    return [f"tenant-{i}" for i in range(args.light)]


def echomq_run(url: str, args: argparse.Namespace, grouped: bool) -> dict[str, Any]:
    """One EchoMQ run (module doc): {key: seconds to finish}, plus the add and start-up."""
    r = redis.Redis.from_url(url)
    r.flushall()
    mq = EchoMQ(url, prefix=PREFIX)
    t = time.perf_counter()
    heavy = [Child(i, queue=WORK, group="heavy" if grouped else None) for i in range(args.heavy)]
    mq.add_flow(PARENTS, heavy, parent_id="JOB-heavy", barrier=True)
    for key in _keys(args):
        kids = [Child(j, queue=WORK, group=key if grouped else None) for j in range(args.per_light)]
        mq.add_flow(PARENTS, kids, parent_id=f"JOB-{key}", barrier=True)
    add_s = time.perf_counter() - t
    ctx = mp.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=worker_main,
            args=(url, args.concurrency, args.handler_ms, args.pump_page, ready, stop),
        )
        for _ in range(args.workers)
    ]
    page = {"page": args.pump_page} if args.pump_page else {}
    pump = Pump(mq, [PARENTS, WORK], **page).start()  # the flows are cross-queue
    start_ms, start_wall = _server_ms(r), time.time()
    for p in procs:
        p.start()
    try:
        _wait(
            lambda: not mq.list_flows(PARENTS, "held", limit=1),
            lambda: all(p.is_alive() for p in procs),
            "every flow's release",
        )
        before = _server_ms(r)
        released = mq.list_flows(PARENTS, "released", limit=10_000)
        now_ms = (before + _server_ms(r)) / 2  # list_flows' own TIME is between the two
        readies = [ready.get(timeout=60) for _ in procs]
    finally:
        stop.set()
        for p in procs:
            p.join(60)
        pump.stop()
        mq.close()
    finish = {
        f.parent_id.removeprefix("JOB-"): (now_ms - f.since * 1000 - start_ms) / 1000
        for f in released
    }
    # the work queue's completed set is scored by each child's completion (server ms); a
    # child's id is <parent id>.<index>
    last = _last_done(r, mq.keys.completed(WORK), lambda i: i.rsplit(".", 1)[0][4:], start_ms)
    return _outcome(args, finish, add_s, [w - start_wall for w in readies], last)


def _last_done(
    r: redis.Redis, completed: str, key_of: Callable[[str], str], start_ms: float
) -> dict[str, float]:
    """{key: seconds from ``start_ms`` to its last job's completion}, from a completed set
    scored by completion time in ms."""
    last: dict[str, float] = {}
    done = r.zrange(completed, 0, -1, withscores=True)
    for member, score in cast(list[tuple[bytes, float]], done):
        key = key_of(member.decode())
        last[key] = max(last.get(key, 0.0), float(score))
    return {key: (ms - start_ms) / 1000 for key, ms in last.items()}


def bullmq_run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One BullMQ Node run (module doc)."""
    node = shutil.which("node") or "node"
    r = redis.Redis.from_url(url)
    r.flushall()
    total = args.heavy + args.light * args.per_light
    t = time.perf_counter()
    sizes = [str(args.heavy), str(args.light), str(args.per_light)]
    subprocess.run(
        [node, str(NODE_SCRIPT), "add", url, BULL_QUEUE, *sizes],
        check=True,
        timeout=TIMEOUT,
        stdout=subprocess.DEVNULL,
    )
    add_s = time.perf_counter() - t
    start_ms, readies = _node_workers(url, args, r, total)
    failed = int(r.zcard(f"bull:{BULL_QUEUE}:failed"))
    if failed:
        raise RuntimeError(f"{failed} BullMQ jobs failed")
    completed = f"bull:{BULL_QUEUE}:completed"
    finish = _last_done(r, completed, lambda i: i.rsplit("-", 1)[0], start_ms)
    return _outcome(args, finish, add_s, readies)


def _node_workers(
    url: str, args: argparse.Namespace, r: redis.Redis, total: int
) -> tuple[float, list[float]]:
    """Start the Node worker processes, wait for ``total`` completions, stop them: (the start
    moment in ms, each worker's seconds from it to ready)."""
    node = shutil.which("node") or "node"
    command = [node, str(NODE_SCRIPT), "worker", url, BULL_QUEUE]
    command += [str(args.concurrency), str(args.handler_ms)]
    completed = f"bull:{BULL_QUEUE}:completed"
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(args.workers)]
        start_ms = time.time() * 1000
        procs = [subprocess.Popen(command, stdout=log) for log in logs]
        try:
            _wait(
                lambda: int(r.zcard(completed)) >= total,
                lambda: all(p.poll() is None for p in procs),
                f"{total} completions",
            )
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(60)
        readies = []
        for log in logs:
            log.seek(0)
            words = log.read().decode().split()
            readies.append((float(words[words.index("READY") + 1]) - start_ms) / 1000)
    return start_ms, readies


def _outcome(
    args: argparse.Namespace,
    finish: dict[str, float],
    add_s: float,
    readies: list[float],
    last: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One run's figures from {key: seconds to finish}; ``last``: {key: seconds to its last
    child's completion}, when a key's finish is a flow's release that follows it."""
    keys = _keys(args)
    for times in (finish, last or finish):
        if set(times) != {"heavy", *keys}:
            raise RuntimeError(f"finish times for {sorted(times)[:5]}..., not every key")
    extra = {}
    if last is not None:
        tail = [last[k] for k in keys]
        extra = {
            "light_last_child_median_s": round(statistics.median(tail), 3),
            "light_last_child_min_s": round(min(tail), 3),
            "light_last_child_max_s": round(max(tail), 3),
            "heavy_last_child_s": round(last["heavy"], 3),
            "light_last_child_after_ready_s": round(statistics.median(tail) - min(readies), 3),
        }
    light = [finish[k] for k in keys]
    total = args.heavy + args.light * args.per_light
    end = max(finish.values())
    return {
        "light_median_s": round(statistics.median(light), 3),
        "light_min_s": round(min(light), 3),
        "light_max_s": round(max(light), 3),
        "heavy_s": round(finish["heavy"], 3),
        "all_done_s": round(end, 3),
        "throughput_per_s": round(total / end, 1),
        "add_s": round(add_s, 3),
        "workers_ready_s": [round(x, 3) for x in readies],
        # the same median counted from the first worker ready (start-up left out: not the
        # issue's figure, which counts it, but what the queue alone does)
        "light_median_after_ready_s": round(statistics.median(light) - min(readies), 3),
        **extra,
        "light_s": [round(x, 3) for x in light],
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


#: The figures summarised per system (those a run has), and those whose groups / no groups
#: ratio is given: the issue's (the release, start-up counted) first.
FIELDS = (
    "light_median_s",
    "heavy_s",
    "throughput_per_s",
    "workers_ready_s",
    "light_median_after_ready_s",
    "light_last_child_median_s",
    "heavy_last_child_s",
    "light_last_child_after_ready_s",
)
RATIOS = (
    "light_median_s",
    "light_median_after_ready_s",
    "light_last_child_median_s",
    "light_last_child_after_ready_s",
)


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over rounds (with ranges) of each system's figures, and the ratios."""
    out: dict[str, Any] = {}
    for system, rounds in runs.items():
        if rounds:
            present = [f for f in FIELDS if f in rounds[0]]
            out[system] = {f: _spread([_one(r[f]) for r in rounds]) for f in present}
            out[system]["light_all_s"] = _spread([x for r in rounds for x in r["light_s"]])
    pairs = list(zip(runs["echomq_groups"], runs["echomq_plain"], strict=False))
    if pairs:
        # per field: the ratio of the medians over rounds, and each round's ratio's spread
        out["ratios_groups_vs_plain"] = {
            f: {
                "of_medians": round(
                    out["echomq_groups"][f]["median"] / out["echomq_plain"][f]["median"], 4
                ),
                "per_round": _spread([g[f] / p[f] for g, p in pairs]),
            }
            for f in RATIOS
        }
        out["ratio_of_medians"] = out["ratios_groups_vs_plain"]["light_median_s"]["of_medians"]
        out["target_met"] = out["ratio_of_medians"] <= 0.1
    if runs.get("bullmq_node") and runs["echomq_groups"]:
        out["ratio_groups_vs_bullmq_node"] = round(
            out["echomq_groups"]["light_median_s"]["median"]
            / out["bullmq_node"]["light_median_s"]["median"],
            4,
        )
    return out


def _one(value: Any) -> float:
    """A figure of one run: the slowest worker's ready time for a list of them."""
    return float(max(value)) if isinstance(value, list) else float(value)


NAMES = {
    "echomq_groups": "EchoMQ, groups",
    "echomq_plain": "EchoMQ, no groups",
    "bullmq_node": "BullMQ Node, plain queue",
}


def _cell(spread: dict[str, float], fmt: str = "{:,.2f}") -> str:
    return (
        f"{fmt.format(spread['median'])} ({fmt.format(spread['min'])}-{fmt.format(spread['max'])})"
    )


RATIO_NAMES = {
    "light_median_s": "flow released, from the workers' start (the issue's figure)",
    "light_median_after_ready_s": "flow released, from the first worker ready",
    "light_last_child_median_s": "last child done, from the workers' start",
    "light_last_child_after_ready_s": "last child done, from the first worker ready",
}


def markdown(doc: dict[str, Any]) -> str:
    """The summary tables of :func:`summarize`'s figures, with the command and the machine."""
    summary, meta = doc["summary"], doc["meta"]
    lines = [
        "# Fairness groups (issue 50): light keys behind a heavy one",
        "",
        f"One key of {meta['heavy']:,} children added first, then {meta['light']} keys of "
        f"{meta['per_light']} each; {meta['workers']} worker processes x concurrency "
        f"{meta['concurrency']}, started after the add (start-up timed); handler: "
        f"{meta['handler_ms']:g} ms sleep. Times in seconds from the workers' start (a key "
        "finishes when its flow is released; BullMQ: when its last job completes); medians "
        f"over {meta['rounds']} rounds (min-max).",
        "",
        "| | light keys' median | light keys, every round | heavy key | throughput, jobs/s "
        "| slowest worker ready |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for system in SYSTEMS:
        if system in summary:
            s = summary[system]
            lines.append(
                f"| {NAMES[system]} | {_cell(s['light_median_s'])} | {_cell(s['light_all_s'])} "
                f"| {_cell(s['heavy_s'])} | {_cell(s['throughput_per_s'], '{:,.0f}')} "
                f"| {_cell(s['workers_ready_s'])} |"
            )
    lines += _where_lines(summary) + _ratio_lines(summary)
    lines += [
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Run: {meta['date']}, commit {meta['commit']}, {meta['machine']}, "
        f"server {meta['server']}, BullMQ {meta['bullmq']}. {meta['note']}",
        "",
    ]
    return "\n".join(lines)


def _where_lines(summary: dict[str, Any]) -> list[str]:
    """EchoMQ's keys: their last child's completion against their flow's release."""
    lines = [
        "",
        "Where EchoMQ's time goes: a key's last child done (the work queue's completed set) "
        "and its flow released (the Pump delivers the children's signals to the parent queue).",
        "",
        "| | light: last child done | light: released | light from the first worker ready: "
        "last child done | heavy: last child done | heavy: released |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for system in ("echomq_groups", "echomq_plain"):
        if system in summary:
            s = summary[system]
            lines.append(
                f"| {NAMES[system]} | {_cell(s['light_last_child_median_s'])} "
                f"| {_cell(s['light_median_s'])} | {_cell(s['light_last_child_after_ready_s'])} "
                f"| {_cell(s['heavy_last_child_s'])} | {_cell(s['heavy_s'])} |"
            )
    return lines if len(lines) > 5 else []


def _ratio_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    if "ratios_groups_vs_plain" in summary:
        verdict = "met" if summary["target_met"] else "NOT met"
        lines += [
            "",
            f"Light keys' median, groups / no groups: **{summary['ratio_of_medians']:.3f}**; "
            f"target <= 0.1: {verdict}. The same ratio by other ends:",
            "",
            "| light keys' median, groups / no groups | ratio of the medians | per round |",
            "|---|---:|---:|",
        ]
        for field, ratio in summary["ratios_groups_vs_plain"].items():
            lines.append(
                f"| {RATIO_NAMES[field]} | {ratio['of_medians']:.3f} "
                f"| {_cell(ratio['per_round'], '{:.3f}')} |"
            )
    if "ratio_groups_vs_bullmq_node" in summary:
        lines += [
            "",
            "Light keys' median, EchoMQ with groups / BullMQ Node's plain queue: "
            f"**{summary['ratio_groups_vs_bullmq_node']:.3f}**.",
        ]
    return lines


def _meta(args: argparse.Namespace, server: str) -> dict[str, Any]:
    def out(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    try:
        package = NODE_SCRIPT.parent / "node_modules" / "bullmq" / "package.json"
        bullmq = f"{json.loads(package.read_text())['version']} (Node {out('node', '--version')})"
    except (OSError, ValueError, KeyError):
        bullmq = "not installed"
    return {
        **{k: v for k, v in vars(args).items() if k not in ("note", "out")},
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": out(
            "git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"
        ),
        "machine": f"{platform.machine()}, {mp.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "server": server,
        "bullmq": bullmq,
        "command": "python -m bench.fairness " + shlex.join(_shown(sys.argv[1:])),
        "note": args.note,
    }


def _shown(argv: list[str]) -> list[str]:
    """The command line without ``--note`` (the summary quotes the note itself)."""
    out, skip = [], False
    for arg in argv:
        if skip or arg == "--note" or arg.startswith("--note="):
            skip = arg == "--note"
            continue
        out.append(arg)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heavy", type=int, default=100_000)
    parser.add_argument("--light", type=int, default=50)
    parser.add_argument("--per-light", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--handler-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-bullmq", action="store_true")
    parser.add_argument(
        "--pump-page",
        type=int,
        default=0,
        help="signals a Pump delivers per outbox per tick, in every Pump (0: the defaults)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--note", default="", help="the machine's condition, for the summary")
    args = parser.parse_args()
    systems = [s for s in SYSTEMS if not (args.skip_bullmq and s == "bullmq_node")]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    server = EmbeddedServer(appendonly=False).start()
    try:
        info = redis.Redis.from_url(server.url).info("server")
        version = f"{info.get('server_name', 'redis')} {info.get('redis_version', '?')}"
        for i in range(args.rounds):
            for system in systems:
                if system == "bullmq_node":
                    run = bullmq_run(server.url, args)
                else:
                    run = echomq_run(server.url, args, grouped=system == "echomq_groups")
                runs[system].append(run)
                print(
                    f"round {i + 1} {system}: "
                    + json.dumps({k: v for k, v in run.items() if k != "light_s"}),
                    flush=True,
                )
    finally:
        server.stop()
    doc = {"meta": _meta(args, version), "summary": summarize(runs), "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fairness.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "fairness.md").write_text(markdown(doc))
    print(json.dumps(doc["summary"], indent=2))


if __name__ == "__main__":
    main()
