"""One module per library under test; each defines a :class:`Peer` and its worker processes.

Modules are named ``*_peer`` so that running one as ``python -m bench.peers.x_peer`` never
shadows the library it drives.
"""

from __future__ import annotations

from typing import Any

#: The workloads, in order, with their full and smoke sizes (items: jobs, children, signals).
WORKLOADS = {
    "W1": ("flat", 20_000, 300),
    "W2": ("fan-in, same queue", 10_000, 200),
    "W3": ("fan-in, cross-queue", 10_000, 200),
    "W4": ("Pump: outbox drain", 100_000, 1_000),
    "W5": ("scale: one large flow", 200_000, 2_000),
    "W6": ("I/O-bound: handlers that wait 50 ms", 10_000, 400),
}
#: Workloads that run at one concurrency whatever ``--concurrency`` says (W6: the issue's 200,
#: where the ideal rate is 200 / 0.05 s = 4,000 jobs/s).
FIXED_CONCURRENCY = {"W6": 200}
#: How long a W6 handler waits (s).
IO_WAIT = 0.05


class Unsupported(Exception):
    """Raised by a peer for a workload it has no equivalent of; the text says why."""


class Peer:
    """A library under test. Subclasses implement ``w1``, ``fan_in`` (W2 and W3), ``w5`` and,
    where they have an equivalent, ``w4`` (each ``-> record``)."""

    name = ""
    #: The library's version and the configuration it runs in (its natural best one).
    version = ""
    config = ""
    #: Where a workload runs at other sizes than the standard one: workload -> [N, ...]
    #: (several sizes show how it scales), with the reason in ``notes``.
    full_sizes: dict[str, list[int]] = {}
    smoke_sizes: dict[str, list[int]] = {}
    notes: dict[str, str] = {}
    #: Jobs one worker process runs at once (set by the harness for each run).
    concurrency = 1
    #: When the worker processes start (set by the harness for each run): ``"before"`` the
    #: window opens (started, connected and ready: their start-up is never timed), or
    #: ``"after"`` the add, which then runs from the window's start with no worker yet: the
    #: workers' start-up and first claims are in the window, as a user's worker pays them.
    worker_start = "before"
    #: The peer can start its workers after the add (W1-W3, W6).
    late_start = False

    def sizes(self, workload: str, smoke: bool) -> list[int]:
        table = self.smoke_sizes if smoke else self.full_sizes
        if workload in table:
            return table[workload]
        return [WORKLOADS[workload][2 if smoke else 1]]

    def run(self, workload: str, url: str, n: int) -> dict[str, Any]:
        table = {
            "W1": self.w1,
            "W2": self.w2,
            "W3": self.w3,
            "W4": self.w4,
            "W5": self.w5,
            "W6": self.w6,
        }
        return table[workload](url, n)

    def w1(self, url: str, n: int) -> dict[str, Any]:
        raise NotImplementedError

    def w2(self, url: str, n: int) -> dict[str, Any]:
        return self.fan_in(url, n, "w2", "w2")

    def w3(self, url: str, n: int) -> dict[str, Any]:
        return self.fan_in(url, n, "w3p", "w3c")

    def fan_in(self, url: str, n: int, parent_q: str, child_q: str) -> dict[str, Any]:
        """One parent in ``parent_q`` over ``n`` children in ``child_q`` (W2: the same queue,
        W3: two queues), timed from the start of the add until its results are read."""
        raise NotImplementedError

    def w4(self, url: str, n: int) -> dict[str, Any]:
        raise Unsupported("n/a")

    def w5(self, url: str, n: int) -> dict[str, Any]:
        raise NotImplementedError

    def w6(self, url: str, n: int) -> dict[str, Any]:
        """N jobs whose handler waits :data:`IO_WAIT` seconds without using the CPU (a sleep
        in a sync handler, an awaited sleep in an async one), at :attr:`concurrency`."""
        raise Unsupported("not implemented for this library")
