"""The chaos driver's parts: a fleet of real worker / Pump processes that can be SIGKILLed and
replaced, and the evidence readers shared by the fault suites.

Every process is started by this module and ended by it (``Fleet.close`` kills what is left),
by PID - never by name.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import redis

from echomq_core import EchoMQ

from ..waiting import eventually

PROC = str(Path(__file__).with_name("chaos_proc.py"))
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
