"""One fan-out over a sharded child queue (issue 30) on a real 3-master Cluster: spread, scale,
the add, memory per child - K = 1, 2, 3 side by side in one run, interleaved.

    python -m bench.shards [--children 100000] [--rounds 3] [--ks 1,2,3] [--workers 2]
                           [--concurrency 16] [--out bench/results/issue30/shards.json]

The Cluster is the test suite's own (``tests/clusterkit.py``: three EmbeddedServer masters,
no replicas), started once; every run flushes it. One run, for one K:

1. ``set_shards("kids", K)``; W worker processes (``Worker(mq, {"kids": ...})``, their own
   Pump each) start, connect and wait for a go; an adder process builds the N children and
   waits too (so neither's start-up is timed).
2. **The add**: the adder runs one ``add_flow("top", N children in "kids", barrier=True)``,
   timing it and reading its peak RSS over the call (``VmHWM`` after resetting it through
   ``/proc/self/clear_refs``, less the RSS before). Meanwhile this process polls the shards'
   ``pending`` (one ZCARD each, every 2 ms) from the go: **first claimable** is when a child
   is first there to claim. After the add, each master's new keys (DBSIZE) and memory
   (``used_memory``) give the **busiest master's share of the new keys** and **keys and
   bytes per child**.
3. **The work**: the workers get the go; the run ends when the parent's counter reads 0
   (polled every 20 ms; then every child is checked settled once: ``processed == N``).
   **Throughput** is N over go-to-settled. Each master's ``INFO cpu`` (user + sys) from
   before the add to the end gives the **busiest master's share of the servers' CPU** and
   the **CPU per child** of every master; the parent's master is named (it also runs the
   deliveries of every child's signal).

Every master shares this machine's cores with the others, the workers and the adder, so
the throughput shows no speed-up with K here; the per-master CPU per child is what scales:
with one core per master, one fan-out's ceiling is about ``1 / max(CPU per child of the
busiest master)`` children per second (see docs/concepts/sharding.md for the model).

Prints one JSON object (runs and medians per K) and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

from echomq_core import Child, EchoMQ
from echomq_core.wire.calls import Call

from .common import READY, Proc, Stopper

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "results" / "issue30" / "shards.json"
PREFIX, PARENTS, KIDS, PARENT_ID = "sb", "top", "kids", "JOB-af/bench/fan/shards"


# -- the subprocesses --------------------------------------------------------------------------


def _status(field: str) -> int:
    """A ``/proc/self/status`` figure in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def adder_main(url: str, n: int) -> None:
    """Build the flow's children, wait for the go, add it, print ``ADD <json>``."""
    mq = EchoMQ(url, cluster=True, prefix=PREFIX)
    mq.shards(KIDS)  # the shard names are read once per process, as a user's first add does
    children = [Child({"i": i}, queue=KIDS) for i in range(n)]
    print(READY, flush=True)
    sys.stdin.readline()
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the RSS now
    started = time.perf_counter()
    mq.add_flow(PARENTS, children, parent_id=PARENT_ID, barrier=True)
    seconds = time.perf_counter() - started
    peak = _status("VmHWM")
    print("ADD " + json.dumps({"add_s": seconds, "peak_kib": peak - before}), flush=True)
    sys.stdin.readline()  # held until told, so its exit is not inside the add's figures
    mq.close()


def worker_main(url: str, concurrency: int) -> None:
    """One worker process of the child queue (its own Pump), started at the go."""
    from echomq_core import Worker

    mq = EchoMQ(url, cluster=True, prefix=PREFIX)
    worker = Worker(mq, {KIDS: lambda job: job.payload["i"]}, concurrency=concurrency)
    print(READY, flush=True)
    sys.stdin.readline()
    worker.start()
    sys.stdin.readline()  # until the harness stops it (SIGTERM or stdin closed)
    worker.stop()
    mq.close()


# -- one run -----------------------------------------------------------------------------------


def _masters(cluster: Any) -> list[redis.Redis]:
    return [redis.Redis(host=s.host, port=s.port) for s in cluster.current_masters()]


def _reading(nodes: list[redis.Redis]) -> list[dict[str, float]]:
    out = []
    for node in nodes:
        cpu, mem = node.info("cpu"), node.info("memory")
        out.append(
            {
                "cpu": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
                "keys": float(node.dbsize()),
                "memory": float(mem["used_memory"]),
            }
        )
    return out


def _delta(after: list[dict[str, float]], before: list[dict[str, float]], what: str) -> list[float]:
    return [a[what] - b[what] for a, b in zip(after, before, strict=True)]


def _share(parts: list[float]) -> float:
    total = sum(parts)
    return max(parts) / total if total > 0 else 0.0


def one_run(cluster: Any, k: int, args: argparse.Namespace) -> dict[str, Any]:
    nodes = _masters(cluster)
    for node in nodes:
        node.flushall()
    mq = EchoMQ(cluster.url, cluster=True, prefix=PREFIX)
    names = mq.set_shards(KIDS, k)
    ports = [n.connection_pool.connection_kwargs["port"] for n in nodes]
    parent_port = cluster.server_for_key(mq.keys.config(PARENTS)).port
    shard_ports = [cluster.server_for_key(mq.keys.config(s)).port for s in names]
    n = args.children
    module = "bench.shards"
    with Stopper() as procs:
        workers = [
            procs.add(Proc(module, ["--worker", cluster.url, str(args.concurrency)],
                           name=f"shards-worker-{i}", stdin=True))
            for i in range(args.workers)
        ]  # fmt: skip
        adder = procs.add(Proc(module, ["--adder", cluster.url, str(n)], name="shards-adder",
                               stdin=True))  # fmt: skip
        for p in [*workers, adder]:
            p.wait_ready(120)
        pending = [Call.cmd("ZCARD", mq.keys.pending(s)) for s in names]
        before = _reading(nodes)
        adder.send("go")
        go = time.monotonic()
        first = None
        while first is None:
            if sum(int(x) for x in mq.connection.execute(pending)) > 0:
                first = time.monotonic() - go
            else:
                adder.check_alive()
                time.sleep(0.002)
        added = json.loads(adder.wait_line("ADD", 600))
        after_add = _reading(nodes)
        adder.send("done")
        for w in workers:
            w.send("go")
        started = time.monotonic()
        while mq.dependencies(PARENTS, PARENT_ID) > 0:
            if time.monotonic() - started > 1800:
                raise RuntimeError("the flow did not settle in 30 min")
            time.sleep(0.02)
        settled = time.monotonic() - started
        end = _reading(nodes)
        for w in workers:
            w.send("stop")
    snap = mq.snapshot(PARENTS, PARENT_ID)
    if snap.processed != n or snap.parent_state != "released":
        raise RuntimeError(f"K={k}: {snap.processed} of {n} settled, parent {snap.parent_state}")
    keys = _delta(after_add, before, "keys")
    memory = _delta(after_add, before, "memory")
    cpu = _delta(end, before, "cpu")
    add_cpu = _delta(after_add, before, "cpu")
    mq.close()
    for node in nodes:
        node.close()
    return {
        "k": k,
        "children": n,
        "shards": list(names),
        "masters": ports,
        "parent_master": parent_port,
        "shard_masters": shard_ports,
        "add_s": added["add_s"],
        "add_peak_mib": added["peak_kib"] / 1024,
        "first_claimable_s": first,
        "work_s": settled,
        "throughput": n / settled,
        "new_keys": keys,
        "busiest_keys_share": _share(keys),
        "keys_per_child": sum(keys) / n,
        "bytes_per_child": sum(memory) / n,
        "cpu_s": cpu,
        "add_cpu_s": add_cpu,
        "busiest_cpu_share": _share(cpu),
        "cpu_us_per_child": [c / n * 1e6 for c in cpu],
        "cpu_us_per_child_total": sum(cpu) / n * 1e6,
        "parent_master_cpu_us_per_child": cpu[ports.index(parent_port)] / n * 1e6,
    }


SUMMED = (
    "add_s",
    "add_peak_mib",
    "first_claimable_s",
    "work_s",
    "throughput",
    "busiest_keys_share",
    "keys_per_child",
    "bytes_per_child",
    "busiest_cpu_share",
    "cpu_us_per_child_total",
    "parent_master_cpu_us_per_child",
)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in sorted({r["k"] for r in runs}):
        mine = [r for r in runs if r["k"] == k]
        row = {f: statistics.median(r[f] for r in mine) for f in SUMMED}
        row["busiest_master_cpu_us_per_child"] = statistics.median(
            max(r["cpu_us_per_child"]) for r in mine
        )
        row["runs"] = len(mine)
        out[str(k)] = row
    if "1" in out:
        base = out["1"]
        for row in out.values():
            row["keys_per_child_vs_k1"] = row["keys_per_child"] / base["keys_per_child"]
            row["bytes_per_child_vs_k1"] = row["bytes_per_child"] / base["bytes_per_child"]
            # the ceiling with one core per master: the busiest master's CPU per child
            row["ceiling_per_s_one_core_per_master"] = 1e6 / row["busiest_master_cpu_us_per_child"]
            row["ceiling_vs_k1"] = (
                base["busiest_master_cpu_us_per_child"] / row["busiest_master_cpu_us_per_child"]
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--children", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ks", default="1,2,3", help="shard counts, run in turn each round")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--adder", nargs=2, metavar=("URL", "N"), help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, metavar=("URL", "C"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.adder:
        adder_main(args.adder[0], int(args.adder[1]))
        return 0
    if args.worker:
        worker_main(args.worker[0], int(args.worker[1]))
        return 0
    sys.path.insert(0, str(REPO))
    from tests.clusterkit import EmbeddedCluster

    ks = [int(x) for x in args.ks.split(",")]
    runs: list[dict[str, Any]] = []
    with EmbeddedCluster(3) as cluster:
        for round_ in range(args.rounds):
            order = ks[round_ % len(ks) :] + ks[: round_ % len(ks)]  # interleaved, rotated
            for k in order:
                run = one_run(cluster, k, args)
                runs.append(run)
                print(json.dumps({f: run[f] for f in ("k", *SUMMED)}), file=sys.stderr,
                      flush=True)  # fmt: skip
    doc = {
        "children": args.children,
        "rounds": args.rounds,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
        "summary": summary(runs),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
