"""Soak: barrier flows added, read and closed for minutes; does retention give the memory back?

On an embedded server (no persistence) with a 30 s retention (``closed_age`` and
``completed_age`` on the parent and the child queue), for ``--minutes``:

    add a barrier flow of 2,000 children (children in a second queue)
    -> a Worker works them off, a Pump (``sweep_every=1.0``) delivers their signals
    -> wait for the release, read ``children_values`` (checked), close the flow

one flow after another, while a sampler records ``INFO memory`` every 10 s. Then it stops
adding and keeps the Worker and the Pump running until every flow has expired: no flow listed
by ``list_flows`` in either queue and no ``:job:`` key left (``SCAN``), then measures the final
``used_memory`` against two baselines, both with the scripts loaded and the Worker and Pump
connected (so they hold what the final does: the script cache, the clients' buffers):

* ``baseline``: before the first add;
* ``baseline_warm``: after one warm-up flow (in two other queues, retention 0) ran through
  every script and expired. The server keeps some memory once scripts have RUN (the
  scripting engine's own state, ~0.6 MB on Valkey 9, once, whatever the number of flows):
  the distance from this baseline is what the flows left behind.

Phase 2, the sweep's cost per expired child: with nothing else running, K (20) closed flows
of 2,000 children, all past their retention, are swept in one go by the Pump's own sweep
(:func:`echomq_core.flows.retention.sweep`, limit 200, called in a loop until a pass forgets
nothing); ``INFO commandstats`` before and after gives calls and server microseconds.
``cmdstat_evalsha`` is the sweep scripts themselves (its time includes the commands they run);
the commands run inside the scripts are counted under their own names (``cmdstat_del``,
``cmdstat_zrem`` ...), so "commands per child" counts both levels and "us per child" is the
scripts' time only (the inner commands' time is inside it).

Run::

    .venv/bin/python -m bench.soak_lifecycle --minutes 10     # ~12 min
    .venv/bin/python -m bench.soak_lifecycle --minutes 1      # a short check

It prints one JSON summary and writes it to ``bench/results/soak_lifecycle.json`` (``--out``).
Exit status 1 when a flow did not settle as expected or something did not expire.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file: python bench/soak_lifecycle.py
    sys.path.insert(0, str(REPO))

from echomq_core import Child, EchoMQ, Job, Pump, Worker  # noqa: E402
from echomq_core.flows.retention import sweep  # noqa: E402
from echomq_core.server import EmbeddedServer  # noqa: E402
from echomq_core.wire.keyspace import FLOW_INDEXES  # noqa: E402
from echomq_core.wire.scripts import all_scripts  # noqa: E402

PARENTS, KIDS = "soak-parents", "soak-kids"
#: A warm-up flow runs here before the warm baseline (retention 0: it expires at once).
WARM_PARENTS, WARM_KIDS = "warm-parents", "warm-kids"
QUEUES = [PARENTS, KIDS, WARM_PARENTS, WARM_KIDS]
PREFIX = "soak"
MEMORY_FIELDS = (
    "used_memory",
    "used_memory_dataset",
    "used_memory_overhead",
    "used_memory_scripts",
    "mem_clients_normal",
    "lazyfree_pending_objects",
)


def say(text: str) -> None:
    print(f"soak: {text}", file=sys.stderr, flush=True)


def child(job: Job) -> Any:
    return job.payload * 2


class Sampler(threading.Thread):
    """``INFO memory`` (and the number of keys) every ``every`` seconds, stamped with the
    phase the soak is in."""

    def __init__(self, admin: redis.Redis, every: float, started: float) -> None:
        super().__init__(daemon=True, name="soak-sampler")
        self.admin, self.every, self.started = admin, every, started
        self.samples: list[dict[str, Any]] = []
        self.phase = "baseline"
        self.flows_done = 0
        self._halt = threading.Event()

    def take(self) -> dict[str, Any]:
        info = self.admin.info("memory")
        sample = {
            "t": round(time.monotonic() - self.started, 1),
            "phase": self.phase,
            "flows_done": self.flows_done,
            **{name: int(info.get(name, 0)) for name in MEMORY_FIELDS},
            "keys": int(self.admin.dbsize()),
        }
        self.samples.append(sample)
        return sample

    def detail(self) -> dict[str, Any]:
        """A sample plus what makes it up: ``MEMORY STATS`` and, when few, every key's size."""
        sample = self.take()
        stats = self.admin.memory_stats()
        sample["memory_stats"] = {
            k: v for k, v in stats.items() if isinstance(v, int | float) and "." in k
        }
        if sample["keys"] <= 50:
            sample["key_sizes"] = {
                key.decode(): self.admin.memory_usage(key, samples=0)
                for key in sorted(self.admin.scan_iter(count=1000))
            }
        return sample

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.take()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(5)


def job_keys(admin: redis.Redis, prefix: str) -> int:
    return sum(1 for _ in admin.scan_iter(match=f"{prefix}:*:job:*", count=5000))


def flows_left(mq: EchoMQ) -> int:
    return sum(len(mq.list_flows(q, limit=10_000)) for q in QUEUES)


def run_flow(
    mq: EchoMQ,
    n: int,
    parent_id: str,
    timeout: float,
    *,
    parents: str = PARENTS,
    kids: str = KIDS,
) -> dict[str, float]:
    """Add one barrier flow, wait for its release, read and check it, close it."""
    began = time.monotonic()
    ref = mq.add_flow(
        parents, [Child(i, queue=kids) for i in range(n)], parent_id=parent_id, barrier=True
    )
    added = time.monotonic()
    snap = mq.wait(parents, ref.parent_id, timeout=timeout, poll=0.02)
    released = time.monotonic()
    values = mq.children_values(parents, ref.parent_id)
    if snap.parent_state != "released" or len(values) != n or sum(values.values()) != n * (n - 1):
        raise RuntimeError(
            f"flow {parent_id} did not settle as expected: state {snap.parent_state}, "
            f"{len(values)} values"
        )
    read = time.monotonic()
    state = mq.close_flow(parents, ref.parent_id)
    if state != "closed":
        raise RuntimeError(f"closing {parent_id} left it {state!r}")
    return {
        "add": added - began,
        "settle": released - added,
        "read": read - released,
        "close": time.monotonic() - read,
        "total": time.monotonic() - began,
    }


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"{what}: not after {timeout:.0f}s")
        time.sleep(0.5)
    return time.monotonic() - began


def code_version() -> dict[str, Any]:
    """Which code ran: the commit, and the files that differed from it."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = [line[3:] for line in git("status", "--porcelain").splitlines() if line[3:]]
    return {
        "commit": git("rev-parse", "HEAD") or None,
        "changed_files": [f for f in changed if f.startswith(("echomq_core/", "lua/"))],
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def commandstats(admin: redis.Redis) -> dict[str, dict[str, int]]:
    raw = admin.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): {"calls": int(v["calls"]), "usec": int(v["usec"])}
        for name, v in raw.items()
    }


def per_minute(samples: list[dict[str, Any]], baseline: int) -> list[dict[str, Any]]:
    """The soak's samples grouped by minute: the last used_memory of each minute, its
    range, and flows done by then."""
    minutes: dict[int, list[dict[str, Any]]] = {}
    for s in samples:
        if s["phase"] in ("soak", "drain"):
            minutes.setdefault(int(s["t"] // 60), []).append(s)
    out = []
    for minute, group in sorted(minutes.items()):
        used = [s["used_memory"] for s in group]
        out.append(
            {
                "minute": minute + 1,
                "phase": group[-1]["phase"],
                "used_memory": used[-1],
                "used_memory_mib": round(used[-1] / 2**20, 2),
                "min": min(used),
                "max": max(used),
                "over_baseline_mib": round((used[-1] - baseline) / 2**20, 2),
                "flows_done": group[-1]["flows_done"],
                "keys": group[-1]["keys"],
            }
        )
    return out


def sweep_cost(
    args: argparse.Namespace, mq: EchoMQ, admin: redis.Redis, sampler: Sampler
) -> dict[str, Any]:
    """Phase 2: K closed flows past their retention, swept in one go, nothing else running."""
    k, n = args.sweep_flows, args.children
    sampler.phase = "sweep-build"
    worker = Worker(
        EchoMQ(mq.url, prefix=PREFIX), {KIDS: child}, concurrency=args.concurrency, max_batch=500
    )
    pump = Pump(EchoMQ(mq.url, prefix=PREFIX), QUEUES, sweep_every=None)
    worker.start()
    pump.start()
    try:
        for i in range(k):
            run_flow(mq, n, f"JOB-sweep-{i}", args.flow_timeout)
        last_close = time.monotonic()
    finally:
        worker.stop()
        pump.stop()
        worker.client.close()
        pump.client.close()
    due = last_close + args.retention + 1.5
    say(f"sweep phase: {k} flows of {n:,} closed; waiting {due - time.monotonic():.0f}s for them")
    time.sleep(max(0.0, due - time.monotonic()))
    sampler.phase = "sweep"
    children = k * n
    assert len(mq.list_flows(PARENTS, "closed", limit=10_000)) == k
    keys_before = job_keys(admin, PREFIX)
    before = commandstats(admin)
    began = time.monotonic()
    passes = flows = rows = swept = 0
    while True:
        stats = mq.perform(
            sweep(mq.keys, [PARENTS, KIDS], "soak-sweeper", lease_ms=10_000, limit=200)
        )
        passes += 1
        flows += len(stats.flows)
        rows += stats.rows
        swept += stats.swept
        if not (stats.flows or stats.rows or stats.swept):
            break
    seconds = time.monotonic() - began
    after = commandstats(admin)
    diff = {
        name: {
            "calls": v["calls"] - before.get(name, {}).get("calls", 0),
            "usec": v["usec"] - before.get(name, {}).get("usec", 0),
        }
        for name, v in after.items()
    }
    # the sampler's INFO and DBSIZE are not the sweep's
    diff = {n: v for n, v in diff.items() if v["calls"] and n not in ("info", "dbsize")}
    left = job_keys(admin, PREFIX)
    if flows != k or left or flows_left(mq):
        raise RuntimeError(f"sweep phase: {flows} of {k} flows expired, {left} job keys left")
    scripts = diff.get("evalsha", {"calls": 0, "usec": 0})
    inner = {name: v for name, v in diff.items() if name != "evalsha"}
    all_calls = sum(v["calls"] for v in diff.values())
    return {
        "flows": k,
        "children_per_flow": n,
        "children": children,
        "job_keys_before": keys_before,
        "passes": passes,
        "flows_expired": flows,
        "child_rows_deleted": rows,
        "index_entries_swept": swept,
        "seconds": round(seconds, 3),
        "script_calls": scripts["calls"],
        "script_usec": scripts["usec"],
        "inner_commands": dict(sorted(inner.items(), key=lambda kv: -kv[1]["calls"])),
        "per_child": {
            "commands": round(all_calls / children, 3),
            "script_calls": round(scripts["calls"] / children, 5),
            "inner_commands": round((all_calls - scripts["calls"]) / children, 3),
            "usec": round(scripts["usec"] / children, 3),
            "inner_commands_by_name": {
                name: round(v["calls"] / children, 3) for name, v in inner.items()
            },
        },
    }


def soak(args: argparse.Namespace) -> dict[str, Any]:
    code = code_version()
    server = EmbeddedServer().start()
    started = time.monotonic()
    admin = redis.Redis(host=server.host, port=server.port, decode_responses=False)
    sampler = Sampler(admin, args.sample_every, started)
    clients: list[EchoMQ] = []

    def client() -> EchoMQ:
        c = EchoMQ(server.url, prefix=PREFIX)
        clients.append(c)
        return c

    try:
        say(
            f"{server.binary.name} on {server.url}; {args.minutes:g} min of flows of "
            f"{args.children:,} children, retention {args.retention:g}s"
        )
        info = admin.info("server")
        version = info.get("valkey_version") or info.get("redis_version")
        mq = client()
        for queue in (PARENTS, KIDS):
            mq.set_retention(queue, closed_age=args.retention, completed_age=args.retention)
        for queue in (WARM_PARENTS, WARM_KIDS):
            mq.set_retention(queue, closed_age=0, completed_age=0)
        for script in all_scripts():  # the script cache belongs in the baseline
            admin.script_load(script.source)
        handlers = {KIDS: child, WARM_KIDS: child}
        worker = Worker(client(), handlers, concurrency=args.concurrency, max_batch=500)
        pump = Pump(client(), QUEUES, sweep_every=1.0)
        worker.start()
        pump.start()
        time.sleep(3.0)  # idle Worker and Pump: their connections exist, nothing else moves
        baseline = sampler.detail()
        # One flow through every script, expired at once: what the server keeps after its
        # first script runs (the scripting engine's own state) is not the flows' memory.
        sampler.phase = "warm-up"
        run_flow(
            mq, args.children, "JOB-warm", args.flow_timeout, parents=WARM_PARENTS, kids=WARM_KIDS
        )
        wait_until(
            lambda: flows_left(mq) == 0 and job_keys(admin, PREFIX) == 0, 60, "warm-up expired"
        )
        time.sleep(3.0)
        sampler.phase = "baseline-warm"
        warm = sampler.detail()
        sampler.phase = "soak"
        sampler.started = time.monotonic()
        sampler.start()
        timings: list[dict[str, float]] = []
        soak_began = sampler.started
        end = soak_began + args.minutes * 60
        next_note = soak_began + 60
        i = 0
        while time.monotonic() < end:
            timings.append(run_flow(mq, args.children, f"JOB-soak-{i}", args.flow_timeout))
            i += 1
            sampler.flows_done = i
            if time.monotonic() >= next_note:
                next_note += 60
                info = admin.info("memory")
                alive = sum(int(admin.zcard(mq.keys.flows(PARENTS, s))) for s in FLOW_INDEXES)
                say(
                    f"{(time.monotonic() - soak_began) / 60:.0f} min: {i} flows, "
                    f"{alive} not yet expired, used_memory {info['used_memory'] / 2**20:.1f} MiB"
                )
        soak_seconds = time.monotonic() - soak_began
        say(f"stopped adding after {i} flows; waiting for every flow to expire")
        sampler.phase = "drain"
        drain = wait_until(
            lambda: flows_left(mq) == 0 and job_keys(admin, PREFIX) == 0,
            args.drain_timeout,
            "every flow expired",
        )
        at_expiry = sampler.take()
        time.sleep(5.0)  # lazily freed values (UNLINK, lazyfree) return to the allocator
        sampler.phase = "final"
        final = sampler.detail()
        say(f"everything expired {drain:.0f}s after the last add; measuring the sweep")
        worker.stop()
        pump.stop()
        sweep_phase = sweep_cost(args, mq, admin, sampler)
        sampler.stop()
        after_sweep = sampler.detail()
        totals = [t["total"] for t in timings]
        base, warm_base = baseline["used_memory"], warm["used_memory"]
        peak = max(s["used_memory"] for s in sampler.samples)
        return {
            "server": server.binary.name,
            "server_version": version,
            "code": code,
            "children_per_flow": args.children,
            "retention_s": args.retention,
            "minutes": args.minutes,
            "soak_seconds": round(soak_seconds, 1),
            "flows_done": i,
            "children_done": i * args.children,
            "flows_per_minute": round(i / (soak_seconds / 60), 1),
            "flow_seconds": {
                "median": round(statistics.median(totals), 3) if totals else None,
                "max": round(max(totals), 3) if totals else None,
                **{
                    f"median_{part}": round(statistics.median(t[part] for t in timings), 3)
                    for part in ("add", "settle", "read", "close")
                    if timings
                },
            },
            "baseline": baseline,
            "baseline_warm": warm,
            "peak_used_memory": peak,
            "peak_over_baseline_mib": round((peak - base) / 2**20, 2),
            "drain_seconds": round(drain, 1),
            "at_last_expiry": at_expiry,
            "final": final,
            "final_vs_baseline_bytes": final["used_memory"] - base,
            "final_vs_baseline_pct": round(100 * (final["used_memory"] - base) / base, 2),
            "final_vs_warm_baseline_bytes": final["used_memory"] - warm_base,
            "final_vs_warm_baseline_pct": round(
                100 * (final["used_memory"] - warm_base) / warm_base, 2
            ),
            "dataset_final_vs_warm_bytes": final["used_memory_dataset"]
            - warm["used_memory_dataset"],
            "keys_baseline_warm_final": [baseline["keys"], warm["keys"], final["keys"]],
            "used_memory_per_minute": per_minute(sampler.samples, base),
            "sweep_cost": sweep_phase,
            "after_sweep_phase": after_sweep,
            "after_sweep_vs_final_bytes": after_sweep["used_memory"] - final["used_memory"],
            "samples": sampler.samples,
        }
    finally:
        sampler.stop()
        for c in clients:
            c.close()
        admin.close()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to add flows")
    parser.add_argument("--children", type=int, default=2000, help="children per flow")
    parser.add_argument(
        "--retention", type=float, default=30.0, help="closed_age and completed_age (s)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="worker runner threads")
    parser.add_argument("--sample-every", type=float, default=10.0, help="INFO memory period (s)")
    parser.add_argument(
        "--sweep-flows", type=int, default=20, help="K: closed flows swept in the cost phase"
    )
    parser.add_argument("--flow-timeout", type=float, default=120.0, help="per flow (s)")
    parser.add_argument(
        "--drain-timeout", type=float, default=600.0, help="for everything to expire (s)"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "soak_lifecycle.json"
    )
    args = parser.parse_args(argv)
    try:
        summary = soak(args)
    except RuntimeError as exc:
        say(f"FAILED: {exc}")
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    shown = {k: v for k, v in summary.items() if k != "samples"}
    print(json.dumps(shown, indent=2))
    say(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
