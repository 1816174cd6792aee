"""Interleaved A/B of EchoMQ's server CPU per item on W1-W3 between two source trees.

    python bench/cpu_ab.py --a /tmp/bench-main --b /tmp/bench-branch --rounds 6 \
        --sizes W1=100000,W2=50000,W3=50000 --out ab.json

``--b-env NAME=VALUE`` sets a variable for side B only: ``--a T --b T --b-env
ECHOMQ_BENCH_GROUPS=50`` measures one tree with and without fairness groups.

Each tree is a clone of the commit it measures (worker processes import the tree when they
start, so a working tree edited meanwhile would change what they load). A round runs side A,
then side B, each in a fresh process with ``PYTHONPATH`` set to its tree, on a fresh embedded
server per workload: the bench's own peer (bench/peers/echomq_peer.py, concurrency 1) and
measuring window (bench/common.py), so a figure is the one ``bench.run`` reports, at a size
of our choosing. Reported: per workload and side the median server CPU per item (``INFO cpu``,
user + sys, over the window) and throughput, and the median of the per-round B/A ratios: on a
shared machine the load drifts between rounds, and a ratio taken within one round cancels
most of it (what a single figure cannot).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKLOADS = ("W1", "W2", "W3")


def one_side(sizes: dict[str, int]) -> dict[str, Any]:
    """Run the workloads once in this process (its tree is on ``sys.path``)."""
    from bench.peers.echomq_peer import EchoMQPeer
    from echomq_core.server import EmbeddedServer

    peer = EchoMQPeer()
    peer.concurrency = 1
    out: dict[str, Any] = {}
    for workload, n in sizes.items():
        server = EmbeddedServer(appendonly=False).start()
        try:
            if workload == "W1":
                res = peer.w1(server.url, n)
            elif workload == "W2":
                res = peer.fan_in(server.url, n, "w2", "w2")
            else:
                res = peer.fan_in(server.url, n, "w3p", "w3c")
        finally:
            server.stop()
        out[workload] = {
            "server_us": res["cpu_us_per_item"]["server"],
            "workers_us": res["cpu_us_per_item"].get("workers"),
            "per_second": res["rate"],
            "commands": res["commands_per_item"],
        }
    return out


def _spawn(tree: Path, sizes: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), **(extra or {})}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--one", sizes],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"side {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for w in WORKLOADS:
        got = [r for r in rounds if w in r["A"]]
        if not got:
            continue
        row: dict[str, Any] = {}
        for key in ("server_us", "workers_us", "per_second", "commands"):
            a = [r["A"][w][key] for r in got]
            b = [r["B"][w][key] for r in got]
            row[key] = {
                "A": round(statistics.median(a), 2),
                "B": round(statistics.median(b), 2),
                "B/A (median of rounds)": round(
                    statistics.median(y / x for x, y in zip(a, b, strict=True)), 3
                ),
            }
        out[w] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, help="tree A (the baseline)")
    parser.add_argument("--b", type=Path, help="tree B")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sizes", default="W1=100000,W2=50000,W3=50000")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--a-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for side A only; may repeat",
    )
    parser.add_argument(
        "--b-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for side B only (e.g. ECHOMQ_BENCH_GROUPS=50: the same "
        "tree with fairness groups); may repeat",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        sizes = {k: int(v) for k, v in (p.split("=") for p in args.one.split(","))}
        print(json.dumps(one_side(sizes)))
        return 0
    if args.a is None or args.b is None:
        parser.error("--a and --b are required")
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        a_env = dict(pair.split("=", 1) for pair in args.a_env)
        b_env = dict(pair.split("=", 1) for pair in args.b_env)
        done = {"A": _spawn(args.a, args.sizes, a_env), "B": _spawn(args.b, args.sizes, b_env)}
        rounds.append(done)
        line = {w: (done["A"][w]["server_us"], done["B"][w]["server_us"]) for w in done["A"]}
        print(f"round {i + 1}: server us/item (A, B) {line}", flush=True)
        if args.out:
            record = {"rounds": rounds, "summary": summary(rounds)}
            args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps(summary(rounds), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
