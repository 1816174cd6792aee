"""The worker process's own cost, two EchoMQ trees side by side: CPU per job, start-up.

Usage (from the repository root; each TREE is an exported commit, e.g.
``git archive <commit> | tar -x -C /tmp/tree-<commit>``, so edits in progress cannot leak in)::

    python -m bench.worker_cpu cpu TREE_A TREE_B [--n 20000] [--levels 1,4,50]
        [--modes threaded,async] [--rounds 5] [--callgrind] [--out FILE.json]
    python -m bench.worker_cpu startup TREE_A TREE_B [--n 100000] [--concurrency 4]
        [--ways cli,python] [--rounds 5] [--out FILE.json]

``cpu``: W1 (no-op jobs). The worker (``bench.peers.echomq_peer worker``, the tree's own) is
started and left to go idle (blocked on its wake-up hint, its CPU clock still); then a
separate process of the same tree adds N jobs and the harness waits for N completions. The
worker's CPU over that span is the sum of its threads' run time (``/proc/<pid>/task/*/
schedstat``, nanoseconds: the process's tick-based ``utime`` is too coarse for a second of
work); its start-up is not in it. With ``--callgrind`` the worker runs under
``valgrind --tool=callgrind`` and the instructions it runs over the same span are counted
instead (near-deterministic, where CPU time on a shared machine moves by tens of percent).
Sides alternate A B, B A from round to round, so a noisy minute does not land on one side
only; the summary is each side's median and the median of the per-round ratios B / A.

``startup``: a queue that already holds N jobs; the harness notes the time, starts the
worker (``cli``: ``python -m echomq_core.cli worker``, as ``echomq worker`` runs; ``python``:
``Worker(EchoMQ(url), ...).run()`` in a fresh ``python -c``) and polls the server every
millisecond: the first claim is when the queue's ``active`` set first holds a job (the claim
script ran; its reply is on the way), the first completion when ``completed`` first holds
one; the worker's CPU time at each (its threads' run time, read the moment it is seen) is
recorded beside the wall time, which a loaded machine stretches. Also measured: the CPU time
of ``python -c "import echomq_core"`` (and with ``redis``) less that of ``python -c pass``.
Both trees are byte-compiled first, as an installed package is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from echomq_core.server import EmbeddedServer

from .common import READY

QUEUE = "w1"
PREFIX = "emq"
#: The harness's poll of the server while it waits for a start-up step (s).
FINE_POLL = 0.001
#: What a side's adding process runs (argv: URL, N): the tree's own client, bulk adds of 20,000.
_ADD = (
    "import sys\nfrom echomq_core import EchoMQ\nmq = EchoMQ(sys.argv[1])\n"
    "q = mq.queue('w1')\nn = int(sys.argv[2])\n"
    "for i in range(0, n, 20000):\n    q.add_bulk(range(i, min(n, i + 20000)))\nmq.close()\n"
)
APP = "def noop(job):\n    return None\n\nHANDLERS = {'w1': noop}\n"


def key(name: str) -> str:
    return f"{PREFIX}:{{{QUEUE}}}:{name}"


def env_for(tree: Path, extra: str | None = None) -> dict[str, str]:
    paths = [str(tree), *([extra] if extra else [])]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1")


def add_jobs(tree: Path, url: str, n: int) -> float:
    """Add ``n`` no-op jobs with the tree's own client, in a process of its own; its wall
    time (s)."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", _ADD, url, str(n)], env=env_for(tree), check=True, timeout=600
    )
    return time.perf_counter() - started


def cpu_ns(pid: int) -> int:
    """The run time of every live thread of ``pid`` (ns)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


def poll(check: Callable[[], bool], timeout: float, what: str, every: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def idle(r: redis.Redis, pid: int) -> bool:
    """The worker is blocked on a wake-up hint and its CPU clock is still (50 ms)."""
    clients = r.execute_command("CLIENT", "LIST").decode()
    if not any("cmd=bzpopmin" in line and "flags=b" in line for line in clients.splitlines()):
        return False
    before = cpu_ns(pid)
    time.sleep(0.05)
    return cpu_ns(pid) - before < 1_000_000


def cpu_run(
    tree: Path, url: str, r: redis.Redis, n: int, level: int, mode: str, grind: bool
) -> dict[str, Any]:
    """One W1 run of ``tree``'s worker: its CPU per job (us), the run's wall time; with
    ``grind``, the instructions it ran per job under callgrind instead."""
    r.execute_command("FLUSHALL", "SYNC")
    with tempfile.TemporaryFile() as log, tempfile.TemporaryDirectory() as out:
        return _cpu_run(tree, url, r, n, level, mode, log, Path(out) if grind else None)


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, check=False)


def _instructions(pid: int, out: Path) -> int:
    """Dump the instructions counted since instrumentation was switched on (callgrind)."""
    before = set(out.glob("cg.*"))
    _control(pid, "--dump=phase")
    poll(lambda: bool(set(out.glob("cg.*")) - before), 60, "the callgrind dump")
    time.sleep(0.5)  # the dump is being written
    dump = max(set(out.glob("cg.*")) - before, key=os.path.getmtime)
    found = re.search(r"^totals:\s*(\d+)", dump.read_text(), re.M)
    if found is None:
        raise RuntimeError(f"no totals in {dump}")
    return int(found.group(1))


def _cpu_run(
    tree: Path, url: str, r: redis.Redis, n: int, level: int, mode: str, log: Any,
    grind: Path | None,
) -> dict[str, Any]:
    worker = [sys.executable, "-m", "bench.peers.echomq_peer", "worker", url, QUEUE, str(level)]
    if grind is not None:
        worker = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={grind}/cg.%p", *worker,
        ]
    proc = subprocess.Popen(
        [*worker, mode],
        cwd=tree,
        env=env_for(tree),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def ready() -> bool:
            log.seek(0)
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited: {log.read().decode()[-2000:]}")
            return READY in log.read().decode()

        poll(ready, 300, "the worker's READY")
        poll(lambda: idle(r, proc.pid), 120, "the worker to go idle")
        if grind is not None:
            _control(proc.pid, "-z")
            _control(proc.pid, "-i", "on")
        cpu0, t0 = cpu_ns(proc.pid), time.perf_counter()
        adder = subprocess.Popen(
            [sys.executable, "-c", _ADD, url, str(n)], env=env_for(tree)
        )
        poll(lambda: int(r.zcard(key("completed"))) >= n, 1800, f"{n} completions")
        seconds, cpu1 = time.perf_counter() - t0, cpu_ns(proc.pid)
        adder.wait(60)
        if r.zcard(key("pending")) or r.zcard(key("active")):
            raise RuntimeError("jobs left pending or active")
        if grind is not None:
            return {"instructions_per_job": round(_instructions(proc.pid, grind) / n)}
        return {"us_per_job": round((cpu1 - cpu0) / 1000 / n, 2), "seconds": round(seconds, 3)}
    finally:
        stop(proc)



def startup_run(
    tree: Path, url: str, r: redis.Redis, n: int, level: int, way: str, app_dir: str
) -> dict[str, Any]:
    """One start of ``tree``'s worker on a queue holding ``n`` jobs: seconds from the
    process's start to its first claim and to its first completed job."""
    r.execute_command("FLUSHALL", "SYNC")
    add_jobs(tree, url, n)
    if way == "cli":
        argv = [
            sys.executable, "-m", "echomq_core.cli", "worker", QUEUE, "--app",
            "wcpu_app:HANDLERS", "--url", url, "--concurrency", str(level),
        ]
    else:
        code = (
            "import sys\nfrom echomq_core import EchoMQ, Worker\nfrom wcpu_app import HANDLERS\n"
            f"Worker(EchoMQ(sys.argv[1]), HANDLERS, concurrency={level}).run()\n"
        )
        argv = [sys.executable, "-c", code, url]
    pipe = r.pipeline(transaction=False)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=app_dir, env=env_for(tree, app_dir), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        claimed = done = None
        claimed_cpu = done_cpu = 0
        deadline = time.monotonic() + 60
        while done is None:
            pipe.zcard(key("active"))
            pipe.zcard(key("completed"))
            active, completed = pipe.execute()
            now = time.perf_counter() - t0
            if claimed is None and (active or completed):
                claimed, claimed_cpu = now, cpu_ns(proc.pid)
            if completed:
                done, done_cpu = now, cpu_ns(proc.pid)
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker ({way}) exited or hung before its first completion")
            time.sleep(FINE_POLL)
        return {
            "first_claim_s": round(claimed or done, 4),
            "first_done_s": round(done, 4),
            "first_claim_cpu_s": round((claimed_cpu or done_cpu) / 1e9, 4),
            "first_done_cpu_s": round(done_cpu / 1e9, 4),
        }
    finally:
        stop(proc)


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """The CPU time (user + sys, s) of a process run to its end."""
    proc = subprocess.Popen(argv, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{argv} failed ({proc.returncode})")
    return usage.ru_utime + usage.ru_stime


def median(xs: list[float]) -> float:
    return round(statistics.median(xs), 4)


def summary(runs: dict[str, list[dict[str, Any]]], field: str) -> dict[str, Any]:
    a = [x[field] for x in runs["A"]]
    b = [x[field] for x in runs["B"]]
    ratios = [y / x for x, y in zip(a, b, strict=True) if x]
    return {
        "A": median(a),
        "B": median(b),
        "ratio_B_over_A": median(ratios) if ratios else None,
        "A_range": [min(a), max(a)],
        "B_range": [min(b), max(b)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["cpu", "startup"])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--levels", default="1,4,50")
    parser.add_argument("--modes", default="threaded,async")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--ways", default="cli,python")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="cpu: count the worker's instructions per job under callgrind (deterministic, "
        "about 50 times slower) instead of its CPU time",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    for tree in trees.values():  # as an installed package is: its modules byte-compiled
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", "echomq_core", "bench"],
            cwd=tree, check=True, stdout=subprocess.DEVNULL,
        )
    server = EmbeddedServer(appendonly=False).start()
    r = redis.Redis.from_url(server.url)
    doc: dict[str, Any] = {
        "what": args.what,
        "trees": {k: str(v) for k, v in trees.items()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": list(os.getloadavg()),
        "results": {},
    }
    try:
        if args.what == "cpu":
            n = args.n or 20_000
            combos = [
                (mode, int(c)) for mode in args.modes.split(",") for c in args.levels.split(",")
            ]
            runs: dict[str, dict[str, list[dict[str, Any]]]] = {
                f"{m}@c{c}": {"A": [], "B": []} for m, c in combos
            }
            for rnd in range(args.rounds):
                for mode, level in combos:
                    for side in ("A", "B") if rnd % 2 == 0 else ("B", "A"):
                        got = cpu_run(trees[side], server.url, r, n, level, mode, args.callgrind)
                        runs[f"{mode}@c{level}"][side].append(got)
                        print(f"round {rnd + 1} {mode}@c{level} {side}: {got}", flush=True)
            doc["n"] = n
            fields = ["instructions_per_job"] if args.callgrind else ["us_per_job", "seconds"]
            doc["callgrind"] = args.callgrind
            for name, sides in runs.items():
                doc["results"][name] = {f: summary(sides, f) for f in fields}
                doc["results"][name]["runs"] = sides
        else:
            n = args.n or 100_000
            app_dir = tempfile.mkdtemp(prefix="wcpu-app-")
            Path(app_dir, "wcpu_app.py").write_text(APP)
            ways = args.ways.split(",")
            sruns: dict[str, dict[str, list[dict[str, Any]]]] = {
                w: {"A": [], "B": []} for w in [*ways, "import"]
            }
            for rnd in range(args.rounds):
                for way in ways:
                    for side in ("A", "B") if rnd % 2 == 0 else ("B", "A"):
                        got = startup_run(
                            trees[side], server.url, r, n, args.concurrency, way, app_dir
                        )
                        sruns[way][side].append(got)
                        print(f"round {rnd + 1} {way} {side}: {got}", flush=True)
                for side in ("A", "B") if rnd % 2 == 0 else ("B", "A"):
                    env = env_for(trees[side])
                    base = cpu_of([sys.executable, "-c", "pass"], env)
                    imp = cpu_of([sys.executable, "-c", "import echomq_core"], env)
                    both = cpu_of([sys.executable, "-c", "import echomq_core, redis"], env)
                    sruns["import"][side].append(
                        {
                            "import_cpu_s": round(imp - base, 4),
                            "with_redis_cpu_s": round(both - base, 4),
                        }
                    )
            doc["n"], doc["concurrency"] = n, args.concurrency
            fields = ["first_claim_s", "first_done_s", "first_claim_cpu_s", "first_done_cpu_s"]
            for way in ways:
                doc["results"][way] = {f: summary(sruns[way], f) for f in fields}
                doc["results"][way]["runs"] = sruns[way]
            doc["results"]["import"] = {
                f: summary(sruns["import"], f) for f in ("import_cpu_s", "with_redis_cpu_s")
            }
            doc["results"]["import"]["runs"] = sruns["import"]
    finally:
        r.close()
        server.stop()
    doc["load_after"] = list(os.getloadavg())
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    summary_only = {k: {f: v[f] for f in v if f != "runs"} for k, v in doc["results"].items()}
    print(json.dumps(summary_only, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
