"""What every peer's workloads share: the measuring window, the counted probe, worker processes.

The harness owns one server for the run. Before each workload run it flushes the data
(``FLUSHALL``); the peer then starts its worker processes and, once they are ready, opens a
:class:`Window`. Everything the libraries send to the server between :meth:`Window.begin` and
:meth:`Window.end` is what the run is charged for: ``INFO commandstats`` after a
``CONFIG RESETSTAT`` counts every command, including those run inside scripts, so the figure
is deterministic and does not depend on the machine.

The harness's own traffic inside the window (the ``CONFIG RESETSTAT`` itself, one
``INFO memory``, and the cheap probes that watch for the end of a workload) goes through
:meth:`Window.cmd`, which counts it by command name, and is subtracted: no library is charged
for the harness polling it. Waiting that a library does itself (a worker's idle poll or
blocking pop, EchoMQ's Pump ticks) is the library's and stays in its count.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parent.parent
READY = "BENCH-READY"
#: How often the harness looks for the end of a workload (one counted command per look).
PROBE_EVERY = 0.01
#: A workload whose progress count has not moved for this long has hung (see wait_for).
STALL = 60.0
#: How long one harness command may wait for a busy server (s).
PROBE_TIMEOUT = 120.0


class BenchError(RuntimeError):
    """Raised when a workload cannot finish: a worker died, a timeout passed, a result was
    incomplete. The harness records it for that library and workload and goes on."""


@dataclass
class Measure:
    """What one window saw."""

    seconds: float
    splits: dict[str, float]
    commands: dict[str, int]  # library commands by name, harness traffic removed
    memory_delta: int  # used_memory after - before, script cache and client buffers excluded
    #: CPU seconds spent in the window: ``server`` (INFO cpu), ``workers`` (this process's
    #: child processes and theirs: worker processes, Node drivers), ``driver`` (this process:
    #: the add, EchoMQ's Pump thread in W3, the harness's probes). A noisy machine stretches
    #: wall-clock time; CPU per item moves far less with the load.
    cpu: dict[str, float] = field(default_factory=dict)

    @property
    def total_commands(self) -> int:
        return sum(self.commands.values())


class Window:
    """The measuring window of one workload run (see the module doc)."""

    def __init__(self, url: str) -> None:
        self.url = url
        # a probe waits as long as the server is busy (a peer's 50,000-child MULTI blocks it
        # for seconds on a loaded machine): redis-py 8's 5 s default failed such runs; a hung
        # workload is caught by wait_for's stall check instead
        self.r = redis.Redis.from_url(url, socket_timeout=PROBE_TIMEOUT)
        self.harness: Counter[str] = Counter()
        self.t0 = 0.0
        self.mem0 = 0
        self.cpu0: dict[str, float] = {}
        self.splits: dict[str, float] = {}

    def close(self) -> None:
        self.r.close()

    def cmd(self, *args: Any) -> Any:
        """One harness command inside the window, counted so it can be subtracted."""
        self.harness[str(args[0]).lower()] += 1
        return self.r.execute_command(*args)

    def counted(self, fn: Callable[..., Any], *sample: Any) -> Callable[..., Any]:
        """Wrap a library read used as a probe (for EchoMQ: its public API, so the harness
        needs no knowledge of the keyspace). Call before :meth:`begin`: the read's command
        footprint is measured now, on ``sample`` arguments (its second call, once any script
        is loaded), and each call made inside the window is subtracted by that footprint."""
        fn(*sample)
        before = self._calls()
        fn(*sample)
        footprint = self._calls()
        footprint.subtract(before)
        footprint["info"] -= 1  # the first INFO is counted by the second
        footprint = Counter({k: v for k, v in footprint.items() if v > 0})

        def probe(*args: Any) -> Any:
            self.harness.update(footprint)
            return fn(*args)

        return probe

    def _calls(self) -> Counter[str]:
        stats = self.r.info("commandstats")
        return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})

    def _memory(self) -> int:
        """What the server holds for data: ``used_memory`` less the script cache (loaded once
        per server, not per job) and the clients' buffers (``mem_clients_normal``: a bulk
        add's query buffer or a big reply still in an output buffer is traffic, not
        retention, and is freed at a moment of its own)."""
        mem = self.r.info("memory")
        deadline = time.monotonic() + 5.0
        while int(mem.get("lazyfree_pending_objects", 0)) and time.monotonic() < deadline:
            # a big key deleted during the run is freed in the background: let that finish
            time.sleep(0.01)
            mem = self.r.info("memory")
            self.harness["info"] += 1  # inside the window when called by begin()
        return (
            int(mem["used_memory"])
            - int(mem.get("used_memory_scripts", 0))
            - int(mem.get("mem_clients_normal", 0))
        )

    def _cpu(self) -> dict[str, float]:
        info = self.r.info("cpu")
        own = os.times()
        return {
            "server": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            "workers": _children_cpu(),
            "driver": own.user + own.system,
        }

    def begin(self) -> None:
        self.r.config_resetstat()
        self.harness = Counter({"config|resetstat": 1, "info": 2})
        self.mem0 = self._memory()
        self.splits = {}
        self.cpu0 = self._cpu()
        self.t0 = time.perf_counter()

    def split(self, name: str) -> float:
        """Record the time since :meth:`begin` under ``name`` (e.g. ``added``)."""
        self.splits[name] = time.perf_counter() - self.t0
        return self.splits[name]

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def end(self) -> Measure:
        seconds = time.perf_counter() - self.t0
        calls = self._calls()  # INFO does not count itself
        calls.subtract(self.harness)
        commands = {k: v for k, v in calls.items() if v > 0}
        cpu1 = self._cpu()
        cpu = {k: cpu1[k] - self.cpu0[k] for k in cpu1}
        mem1 = self._memory()
        return Measure(seconds, dict(self.splits), commands, mem1 - self.mem0, cpu)

    def wait_for(
        self,
        done: Callable[[], Any],
        *,
        timeout: float,
        what: str,
        procs: Sequence[Proc] = (),
        stall: float | None = None,
    ) -> None:
        """Call ``done`` every :data:`PROBE_EVERY` s until it returns ``True``; raise
        :class:`BenchError` after ``timeout`` s or as soon as a worker process died.

        Anything else ``done`` returns is progress (a count): with ``stall``, a value that
        has not changed for ``stall`` s fails the run at once - a hung worker costs a minute,
        not the whole timeout (and the run is reported as failed, not silently dropped)."""
        deadline = time.monotonic() + timeout
        last, changed = None, time.monotonic()
        while (value := done()) is not True:
            now = time.monotonic()
            for proc in procs:
                proc.check_alive()
            if value != last:
                last, changed = value, now
            if now > deadline:
                raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
            if stall is not None and now - changed > stall:
                tails = "".join(f"\n{p.name}: {p.tail(5)}" for p in procs)
                raise BenchError(
                    f"no progress for {stall:.0f}s (stuck at {last!r}) waiting for {what}{tails}"
                )
            time.sleep(PROBE_EVERY)


def reached(count: int, n: int) -> int | bool:
    """For :meth:`Window.wait_for`: True once ``count`` reached ``n``, else the count."""
    return True if count >= n else count


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, get SIGTERM when the harness dies, even by
    SIGKILL, so a killed run leaves no worker behind (elsewhere: nothing)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Proc:
    """A worker (or reader) subprocess of the harness: ``python -m <module> <args>`` run from
    the repository root, output to a log file, ready when it prints :data:`READY`."""

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        *,
        name: str,
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
        stdin: bool = False,
    ) -> None:
        """``command``: run this instead of ``python -m module`` (a Node peer); ``stdin``:
        keep a pipe to the process's input (a driver that is told when to start)."""
        self.name = name
        self.log = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")[1])
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO), full_env.get("PYTHONPATH")])
        )
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env.update(env or {})
        with self.log.open("wb") as out:
            self.popen = subprocess.Popen(
                [*(command or [sys.executable, "-m", module]), *args],
                cwd=REPO,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def send(self, line: str) -> None:
        """Write one line to the process's input (started with ``stdin=True``)."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(line.encode() + b"\n")
        self.popen.stdin.flush()

    def wait_line(self, prefix: str, timeout: float) -> str:
        """The first output line after the READY line that starts with ``prefix`` (waits)."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.output().split(READY, 1)[-1].splitlines():
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
            self.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: no {prefix!r} after {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.005)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise BenchError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")

    def wait_ready(self, timeout: float = 60.0, settle: float = 0.0) -> Proc:
        """Wait for :data:`READY`; then ``settle`` s more for start-up traffic that follows it
        (a worker's first connection and registration), so the window does not see it."""
        deadline = time.monotonic() + timeout
        while READY not in self.output():
            self.check_alive()
            if time.monotonic() > deadline:
                self.kill()
                raise BenchError(f"{self.name} not ready after {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.02)
        time.sleep(settle)
        return self

    def wait_exit(self, timeout: float = 120.0) -> str:
        """Wait for a process that ends by itself (a reader); its output."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BenchError(f"{self.name} did not finish in {timeout:.0f}s") from None
        if self.popen.returncode != 0:
            raise BenchError(f"{self.name} failed ({self.popen.returncode}):\n{self.tail()}")
        return self.output()

    def json_result(self, timeout: float = 300.0) -> dict[str, Any]:
        """Wait for a process that prints one JSON line last (a reader) and return it."""
        text = self.wait_exit(timeout)
        self.stop()
        return json.loads(text.strip().splitlines()[-1])  # type: ignore[no-any-return]

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a graceful stop for every library's worker), SIGKILL after ``timeout``."""
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL this process's own session (its pool children too)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)


@dataclass
class Stopper:
    """Processes started by one workload run, stopped whatever happens."""

    procs: list[Proc] = field(default_factory=list)

    def add(self, proc: Proc) -> Proc:
        self.procs.append(proc)
        return proc

    def __enter__(self) -> Stopper:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's live descendants, from ``/proc`` (0.0
    where there is none). Processes that ended are not counted: read it while workers run."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        todo = [str(os.getpid())]
        total = 0
        first = True
        while todo:
            pid = todo.pop()
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    todo += (task / "children").read_text().split()
            if not first:
                with contextlib.suppress(OSError):
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    total += int(fields[11]) + int(fields[12])  # utime, stime
            first = False
        return total / tick
    except OSError:
        return 0.0


def result(
    measure: Measure, *, n: int, unit: str, rate_of: str | None = None, **extra: Any
) -> dict[str, Any]:
    """One run's record: time, rate (items per second over ``rate_of`` seconds, the whole
    window by default), commands per item with the top commands, memory per item."""
    seconds = measure.splits[rate_of] if rate_of else measure.seconds
    top = sorted(measure.commands.items(), key=lambda kv: (-kv[1], kv[0]))[:8]
    return {
        "n": n,
        "unit": unit,
        "seconds": round(measure.seconds, 4),
        "splits": {k: round(v, 4) for k, v in measure.splits.items()},
        "rate": round(n / seconds, 1) if seconds > 0 else None,
        "commands": measure.total_commands,
        "commands_per_item": round(measure.total_commands / n, 3),
        "top_commands": {k: round(v / n, 3) for k, v in top},
        "memory_bytes": measure.memory_delta,
        "memory_per_item": round(measure.memory_delta / n, 1),
        "cpu_us_per_item": {
            **{k: round(v * 1e6 / n, 2) for k, v in measure.cpu.items()},
            "total": round(sum(measure.cpu.values()) * 1e6 / n, 2),
        },
        **extra,
    }


def summarize(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def peak_rss_kib() -> int:
    """This process's peak resident set size (KiB).

    ``VmHWM`` from ``/proc/self/status`` where there is one: ``getrusage(RUSAGE_SELF).ru_maxrss``
    is the same figure on Linux except that it keeps the high-water mark of the process it
    was forked from (the harness, which may hold a 200,000-child plan), so it would report
    the parent's peak, not the reader's. Elsewhere, ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
