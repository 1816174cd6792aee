"""The chaos driver's parts: a fleet of real worker / Pump processes that can be SIGKILLed and
replaced, and the evidence readers shared by the fault suites.

Every process is started by this module and ended by it (``Fleet.close`` kills what is left),
by PID - never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import redis

from echomq_core import EchoMQ

from ..waiting import eventually

T = TypeVar("T")

PROC = str(Path(__file__).with_name("chaos_proc.py"))
#: The kill rate of the SIGKILL runs: a random fleet member every 0.2-0.5 s.
KILL_EVERY = (0.2, 0.5)
#: When set, each scenario appends its evidence row (one JSON object per line) to this file:
#: docs/RELIABILITY.md is filled from these rows.
EVIDENCE_ENV = "ECHOMQ_RELIABILITY_OUT"


@dataclass
class Member:
    role: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Fleet:
    """``workers`` worker processes and ``pumps`` Pump processes on one keyspace, each a
    ``python PROC ROLE CONFIG_JSON`` (:attr:`proc`: ``chaos_proc.py`` unless a subclass says)."""

    proc: ClassVar[str] = PROC
    config: dict[str, Any]
    env: dict[str, str]
    logdir: Path  # one log file per process started (pytest's tmp_path: kept for a failure)
    workers: int = 3
    pumps: int = 2
    members: list[Member] = field(default_factory=list)
    kills: Counter[str] = field(default_factory=Counter)
    started: int = 0

    def spawn(self, role: str) -> Member:
        self.started += 1
        self.logdir.mkdir(parents=True, exist_ok=True)
        log = self.logdir / f"{role}-{self.started}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, self.proc, role, json.dumps(self.config)],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        member = Member(role, proc, log)
        self.members.append(member)
        return member

    def start(self) -> Fleet:
        for _ in range(self.workers):
            self.spawn("worker")
        for _ in range(self.pumps):
            self.spawn("pump")
        return self

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until every member logged "ready" (one bound for all of them)."""
        deadline = time.monotonic() + timeout
        for m in self.members:

            def ready(m: Member = m) -> bool:
                if b"ready" in m.log.read_bytes():
                    return True
                if m.proc.poll() is not None:
                    raise AssertionError(f"{m.role} exited early:\n{m.log.read_text()}")
                return False

            eventually(
                ready,
                max(0.0, deadline - time.monotonic()),
                lambda m=m: f"{m.role} to be ready:\n{m.log.read_text()}",
            )

    def kill_one(self, rng: random.Random, role: str | None = None) -> str:
        """SIGKILL a random live member (of ``role``, if given) and start a replacement of
        the same role."""
        live = [m for m in self.members if m.proc.poll() is None]
        if role is not None:  # none of that role (a fleet without Pumps): any member
            live = [m for m in live if m.role == role] or live
        victim = rng.choice(live)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        self.members.remove(victim)
        self.kills[victim.role] += 1
        self.spawn(victim.role)
        return victim.role

    def crashed(self) -> list[str]:
        """Logs of members that exited on their own (nobody here exits unless killed)."""
        return [m.log.read_text() for m in self.members if m.proc.poll() is not None]

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every member (workers drain gracefully), SIGKILL what is left after
        ``timeout``."""
        for m in self.members:
            if m.proc.poll() is None:
                m.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for m in self.members:
            try:
                m.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                m.proc.kill()
                m.proc.wait()

    def close(self) -> None:
        for m in self.members:
            if m.proc.poll() is None:
                m.proc.kill()
                m.proc.wait()


class Killer(threading.Thread):
    """Kills a random fleet member every ``low``..``high`` seconds until stopped; the first
    kills take the roles of ``first`` in turn (a test that needs both kinds killed gets them
    from its first kills, not from the luck of a random pick among 3 workers and 1 Pump)."""

    def __init__(
        self, fleet: Fleet, low: float, high: float, seed: int, first: Sequence[str] = ()
    ) -> None:
        super().__init__(daemon=True, name="chaos-killer")
        self.fleet, self.low, self.high = fleet, low, high
        self.rng = random.Random(seed)
        self.first = list(first)
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.wait(self.rng.uniform(self.low, self.high)):
                role = self.first.pop(0) if self.first else None
                self.fleet.kill_one(self.rng, role)
        except BaseException as exc:  # surfaced by the test, not swallowed
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def run_killed(
    fleet: Fleet,
    seed: int,
    done: Callable[[], Any],
    timeout: float,
    what: str | Callable[[], str],
    drain: Callable[[], T],
) -> tuple[float, T]:
    """Run the started ``fleet`` under a :class:`Killer` (:data:`KILL_EVERY`; its first kills
    a Pump, then a worker, so both kinds are hit) until ``done()`` (``timeout``; ``what`` says
    what was awaited); stop the killer; ``drain()`` (it waits, bounded, for what the kills
    left behind); stop the fleet gracefully (SIGTERM), no member having exited on its own.
    Returns the faulted seconds and what ``drain()`` returned."""
    killer = Killer(fleet, *KILL_EVERY, seed=seed, first=("pump", "worker"))
    try:
        fleet.wait_ready()
        started = time.monotonic()
        killer.start()

        def settled() -> bool:
            assert killer.error is None, killer.error
            return bool(done())

        eventually(settled, timeout, what, every=0.1)
        wall = time.monotonic() - started
        killer.stop()
        assert killer.error is None, killer.error
        drained = drain()
        assert not fleet.crashed(), "no process exited unless killed:\n" + "\n".join(
            fleet.crashed()
        )
        fleet.stop()  # SIGTERM: workers drain; nothing stays leased
    finally:
        killer.stop()
        fleet.close()
    return wall, drained


class Watch(threading.Thread):
    """Reads the invariant of flows ``ids`` in ``queue`` every 50 ms while the chaos runs:
    unless the parent failed, the snapshot's ``counts`` (its fields) add up to its total.
    ``error`` holds the first broken read, ``reads`` counts them."""

    def __init__(self, mq: EchoMQ, queue: str, ids: list[str], counts: Sequence[str]) -> None:
        super().__init__(daemon=True)
        self.mq, self.queue, self.ids, self.counts = mq, queue, ids, counts
        self.stop = threading.Event()
        self.reads = 0
        self.error: str | None = None

    def run(self) -> None:
        while not self.stop.wait(0.05):
            for pid in self.ids:
                snap = self.mq.snapshot(self.queue, pid)
                if snap.parent_state != "failed" and (
                    sum(getattr(snap, name) for name in self.counts) != snap.total
                ):
                    self.error = f"invariant broken: {snap}"
                self.reads += 1


@contextlib.contextmanager
def watched(fleet: Fleet, killer: Killer, watch: Watch) -> Iterator[float]:
    """The started ``fleet`` ready, then ``killer`` and ``watch`` started; yields when (monotonic)
    the kills began. Leaving the block: the killer and the watch stopped, no killer error, no
    member exited on its own, the fleet stopped gracefully (SIGTERM); whatever happens, the
    killer and the watch stopped and the fleet's members killed. The watch's verdict
    (``watch.error``) is the test's to read."""
    try:
        fleet.wait_ready()
        started = time.monotonic()
        killer.start()
        watch.start()
        yield started
        killer.stop()
        watch.stop.set()
        watch.join(5)
        assert killer.error is None, killer.error
        assert not fleet.crashed(), "\n".join(fleet.crashed())
        fleet.stop()
    finally:
        killer.stop()
        watch.stop.set()
        fleet.close()


def row_fields(mq: EchoMQ, queue: str, ids: list[str], field_name: str) -> list[int]:
    """One integer field of many job rows (pipelined, 1000 per round trip)."""
    out: list[int] = []
    client = mq.connection.client
    for i in range(0, len(ids), 1000):
        pipe = client.pipeline(transaction=False)
        for job_id in ids[i : i + 1000]:
            pipe.hget(mq.keys.job(queue, job_id), field_name)
        out += [int(v or 0) for v in pipe.execute()]
    return out


def record(row: dict[str, Any]) -> None:
    """Print one evidence row and append it to ``$ECHOMQ_RELIABILITY_OUT`` when set."""
    line = json.dumps(row, sort_keys=True)
    print("EVIDENCE", line)
    target = os.environ.get(EVIDENCE_ENV)
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


class ConnectionKiller(threading.Thread):
    """``CLIENT KILL``s every connection named ``name`` on every node, every ``low``..``high``
    seconds, from the server side, until stopped. ``kills`` counts the connections killed.

    A round that fails (a node slow to answer its admin connection) is counted in ``misses``
    and the next round goes on: the killer must outlive whatever it provokes."""

    def __init__(self, servers: list[Any], name: str, low: float, high: float, seed: int = 1):
        super().__init__(daemon=True, name=f"killer-{name}")
        self.servers = servers
        self.name, self.low, self.high = name, low, high
        self.rng = random.Random(seed)
        self.halt = threading.Event()
        self.kills = 0
        self.misses: list[str] = []

    def _round(self, admin: redis.Redis) -> None:
        for client in admin.client_list():
            if client.get("name") == self.name:
                try:
                    admin.client_kill_filter(_id=client["id"])
                    self.kills += 1
                except redis.ResponseError:
                    pass  # it closed on its own in between

    def run(self) -> None:
        admins = [redis.Redis(s.host, s.port, socket_timeout=10) for s in self.servers]
        try:
            while not self.halt.wait(self.rng.uniform(self.low, self.high)):
                for admin in admins:
                    try:
                        self._round(admin)
                    except Exception as exc:
                        self.misses.append(f"{type(exc).__name__}: {exc}")
        finally:
            for admin in admins:
                admin.close()

    def stop(self) -> int:
        self.halt.set()
        self.join(15)
        assert len(self.misses) <= max(3, self.kills // 10), self.misses[:5]
        return self.kills

    def __enter__(self) -> ConnectionKiller:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
