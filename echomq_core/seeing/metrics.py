"""Prometheus metrics: what a queue holds (read from the server); what a process did is
:mod:`echomq_core.seeing.process_metrics`.

Needs the ``metrics`` extra (``pip install 'echomq[metrics]'``, ``prometheus-client``); nothing
else in EchoMQ imports this module, so workers that do not export metrics do not need it.

Two sources, two kinds of metric:

* **The server** (:class:`QueueCollector`, behind ``echomq dashboard``'s ``/metrics``): gauges
  read at scrape time - jobs per queue and state, outbox and poison lengths, root flows per
  state, the Pump's lag, a rate-limited queue's limit and how far ahead its starts are booked,
  and the flow
  controls of up to :data:`FLOW_GAUGES` held root flows per queue (:func:`read_controls`:
  three round trips, bounded by that number), the age of each queue's oldest pending job
  (:func:`~echomq_core.seeing.browse.oldest_pending`: two round trips, two commands per queue and
  one TIME), the live workers per queue (:func:`~echomq_core.queues.registry.read_workers`:
  two round trips, one HMGET per live worker, at most 1,000), each queue's fairness groups
  (:func:`~echomq_core.control.groups.load`: one script per queue, its HGET and - only for a
  queue with groups - an HSCAN of them, at most 20,000 fields) and the build's version. The
  queues: one pipelined read per scrape,
  :data:`COMMANDS_PER_QUEUE` commands per queue (ZCARD/LLEN/LINDEX/HGET, each O(1) or
  O(log n); a rate-limited queue's TIME and GET more) plus one SMEMBERS for the
  registry - whatever the number of jobs, so a queue of 10 jobs and one of 10,000,000 cost the
  same (tests/seeing/test_metrics.py counts them with ``INFO commandstats``).
* **A worker or a Pump process** (:class:`~echomq_core.seeing.process_metrics.ProcessMetrics`,
  ``echomq worker|pump --metrics-port``): counters and histograms of what this process did.

The Pump's lag, ``echomq_outbox_head_age_seconds``: a signal carries no timestamp, so the lag
is measured by looking: at each scrape the collector reads the head of every outbox and
remembers since when it has seen that same entry there. A Pump that keeps up moves the head
between scrapes (age ~0); a stalled Pump, or a head that does not deliver, shows an age that
grows - what an alert needs. Resolution: the scrape interval; the age is a lower bound of the
signal's true age (it was in the outbox before it reached the head).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..checks import text as _s
from ..control import rates
from ..control.groups import load
from ..control.rates import RateLimit
from ..errors import EchoMQError
from ..flows import sharding
from ..queues import reads
from ..queues.registry import per_queue, read_workers
from ..wire.calls import Call, Op
from ..wire.keyspace import FLOW_INDEXES, Keyspace, check_queue
from .browse import oldest_pending

if TYPE_CHECKING:
    from ..client.clients import EchoMQ

#: The job states counted per queue (the zsets of the keyspace).
JOB_STATES = reads.STATS[:5]  # then outbox and poison: reads.stat_calls reads all seven
#: Commands one scrape sends per queue: 5 job-state ZCARDs, outbox and poison LLEN, the
#: outbox head (LINDEX 0), 5 flow-index ZCARDs, and the rate script (its EVALSHA and its HGET
#: of the limit; a rate-limited queue's TIME and GET of its TAT more: booked is measured on the
#: server's clock, so it is read on the queue's slot).
COMMANDS_PER_QUEUE = len(JOB_STATES) + 3 + len(FLOW_INDEXES) + 2
#: Replies of one queue's read: the rate script is one call of its two commands.
_REPLIES_PER_QUEUE = COMMANDS_PER_QUEUE - 1
#: The most held root flows per queue whose flow controls (``max_running``, ``min_success``)
#: a scrape reports - the newest; a gauge per flow, so the number of series stays bounded.
FLOW_GAUGES = 20


def _gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
    """A gauge made at collect time, with its labels."""
    return GaugeMetricFamily(name, doc, labels=list(labels))


@dataclass(slots=True)
class QueueReading:
    """One queue's counts at one moment (one pipelined read for every queue)."""

    queue: str
    jobs: dict[str, int]
    outbox: int
    poison: int
    flows: dict[str, int]
    head_age: float = 0.0  # seconds the current outbox head has been seen there
    rate: RateLimit | None = None  # the queue's rate limit and what its starts booked

    @property
    def rate_text(self) -> str:
        """The limit and how many may start now (``100/s, 1 ready``, ``100/s burst 20, 12
        ready``), or '' without a limit."""
        return f"{self.rate}, {self.rate.ready:,} ready" if self.rate else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            **self.jobs,
            "outbox": self.outbox,
            "poison": self.poison,
            "flows": dict(self.flows),
            "outbox_head_age": round(self.head_age, 3),
            "rate": self.rate_text,
        }


def read_queues(ks: Keyspace, queues: Sequence[str]) -> Op[list[tuple[QueueReading, bytes]]]:
    """Each queue's counts and its outbox head (b'' when empty): one round trip,
    :data:`COMMANDS_PER_QUEUE` commands per queue."""
    calls: list[Call] = []
    for q in queues:
        calls += [
            *reads.stat_calls(ks, q),
            Call.cmd("LINDEX", ks.outbox(q), 0),
            *(Call.cmd("ZCARD", ks.flows(q, state)) for state in FLOW_INDEXES),
            Call.lua("rate", [ks.config(q), ks.rate_tat(q)], []),
        ]
    if not calls:
        return []
    replies = yield calls
    out = []
    for i, q in enumerate(queues):
        r = replies[i * _REPLIES_PER_QUEUE : (i + 1) * _REPLIES_PER_QUEUE]
        jobs = {state: int(n) for state, n in zip(JOB_STATES, r[:5], strict=True)}
        flows = {state: int(n) for state, n in zip(FLOW_INDEXES, r[8:-1], strict=True)}
        rate = RateLimit.booked(r[-1][0], int(r[-1][1])) if r[-1] else None
        reading = QueueReading(q, jobs, int(r[5]), int(r[6]), flows, rate=rate)
        out.append((reading, bytes(r[7] or b"")))
    return out


def _summed(parts: list[QueueReading]) -> QueueReading:
    """A sharded queue's reading under its logical name (shard 0's): counts summed over its
    shards, the oldest outbox head's age, its rate limit as the shards' shares and starts
    summed (each shard counts its share of the limit: :mod:`echomq_core.control.rates`)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    jobs, flows = dict(first.jobs), dict(first.flows)
    for part in parts[1:]:
        for state, n in part.jobs.items():
            jobs[state] = jobs.get(state, 0) + n
        for state, n in part.flows.items():
            flows[state] = flows.get(state, 0) + n
    return QueueReading(
        first.queue,
        jobs,
        sum(p.outbox for p in parts),
        sum(p.poison for p in parts),
        flows,
        max(p.head_age for p in parts),
        _rate_summed([p.rate for p in parts]),
    )


def _rate_summed(parts: list[RateLimit | None]) -> RateLimit | None:
    found = [r for r in parts if r is not None]
    if not found:
        return None
    limit, burst = sum(r.limit for r in found), sum(r.burst for r in found)
    return rates.summed(found, RateLimit(limit, found[0].window_ms, burst=burst))


@dataclass(slots=True)
class FlowControls:
    """A held root flow's flow controls at one moment: ``running`` children holding a token of
    its ``cap`` (None: no cap), ``failed`` children so far of the ``allowed`` (None: no
    threshold)."""

    queue: str
    parent_id: str
    cap: int | None
    running: int
    allowed: int | None
    failed: int


def read_controls(
    ks: Keyspace, queues: Sequence[str], limit: int = FLOW_GAUGES
) -> Op[list[FlowControls]]:
    """The flow controls of each queue's newest ``limit`` held root flows that have any: three
    round trips (the held flows; their rows' ``cap`` / ``allow`` / child queues; the gates'
    counts and the threshold flows' failure counts), bounded by ``limit`` per queue, never by
    a flow's size. A flow without controls costs one HMGET."""
    if not queues:
        return []
    held = yield [Call.cmd("ZRANGE", ks.flows(q, "held"), -limit, -1) for q in queues]
    flows = [(q, _s(pid)) for q, ids in zip(queues, held, strict=True) for pid in ids]
    if not flows:
        return []
    rows = yield [Call.cmd("HMGET", ks.job(q, pid), "cap", "allow", "cq") for q, pid in flows]
    calls: list[Call] = []
    plans: list[tuple[FlowControls, int]] = []  # (controls, replies it reads)
    for (q, pid), (cap, allow, cq) in zip(flows, rows, strict=True):
        if cap is None and allow is None:
            continue
        found = FlowControls(
            q, pid, None if cap is None else int(cap), 0, None if allow is None else int(allow), 0
        )
        n = 0
        if found.allowed is not None:
            calls.append(Call.cmd("HLEN", ks.failed(q, pid)))
            n += 1
        if found.cap is not None:
            for child_queue in _s(cq).split() if cq else []:
                calls.append(Call.cmd("HGET", ks.gate_keys(child_queue, q, pid)[1], "admitted"))
                n += 1
        plans.append((found, n))
    replies = (yield calls) if calls else []
    at = 0
    for found, n in plans:
        mine = replies[at : at + n]
        at += n
        if found.allowed is not None:
            found.failed, mine = int(mine[0]), mine[1:]
        found.running = sum(int(x or 0) for x in mine)
    return [found for found, _ in plans]


class QueueCollector(Collector):
    """The server-side exporter: register it in a :class:`~prometheus_client.CollectorRegistry`
    and every scrape reads the queues (``queues``, or every registered queue) once.

    A scrape that cannot reach the server yields ``echomq_up 0`` and no queue metrics (a
    scrape never raises). :meth:`read` is the same read for other callers (the dashboard).
    """

    def __init__(
        self,
        client: EchoMQ,
        queues: Iterable[str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.fixed = [check_queue(q) for q in queues] if queues is not None else None
        self.clock = clock
        self._heads: dict[str, tuple[bytes, float]] = {}  # queue -> (head digest, first seen)
        self._logical: dict[str, str] = {}  # each shard of a sharded queue -> its logical name
        self._lock = threading.Lock()

    def read(self) -> list[QueueReading]:
        """Every queue's counts and the age of its outbox head (see the module doc)."""
        names = self.fixed if self.fixed is not None else self.client.queues()
        shards = self.client.perform(
            sharding.resolve(self.client.keys, self.client.shard_cache, names)
        )
        inner = {s for n in names for s in shards[n][1:]}
        logical = [n for n in names if n not in inner]
        physical = [s for n in logical for s in shards[n]]
        self._logical = {s: n for n in logical for s in shards[n]}
        pairs = self.client.perform(read_queues(self.client.keys, physical))
        now = self.clock()
        with self._lock:
            for reading, head in pairs:
                if not head:
                    self._heads.pop(reading.queue, None)
                    continue
                digest = hashlib.sha1(head).digest()
                seen = self._heads.get(reading.queue)
                if seen is None or seen[0] != digest:
                    self._heads[reading.queue] = (digest, now)
                else:
                    reading.head_age = now - seen[1]
        readings = {reading.queue: reading for reading, _ in pairs}
        return [_summed([readings[s] for s in shards[n]]) for n in logical]

    def _controls(self, queues: list[str]) -> Iterable[Metric]:
        """Gauges per held root flow with flow controls (:func:`read_controls`)."""
        labels = ["queue", "flow"]
        running = _gauge(
            "echomq_flow_running", "Children of a capped flow holding a token", *labels
        )
        cap = _gauge("echomq_flow_max_running", "A flow's max_running cap", *labels)
        failed = _gauge(
            "echomq_flow_failed_children",
            "Children of a flow with min_success that died so far",
            *labels,
        )
        allowed = _gauge(
            "echomq_flow_allowed_failures",
            "How many children of a flow with min_success may die without failing it",
            *labels,
        )
        try:
            found = self.client.perform(read_controls(self.client.keys, self._shards_of(queues)))
        except EchoMQError:
            found = []  # the queue gauges were read: a scrape never raises
        for f in found:
            labels = [self._logical.get(f.queue, f.queue), f.parent_id]
            if f.cap is not None:
                running.add_metric(labels, f.running)
                cap.add_metric(labels, f.cap)
            if f.allowed is not None:
                failed.add_metric(labels, f.failed)
                allowed.add_metric(labels, f.allowed)
        yield from (running, cap, failed, allowed)

    def _latency_and_workers(self, queues: list[str]) -> Iterable[Metric]:
        """The build's version, each queue's oldest pending age and its live workers (a
        queue no live worker serves reports 0, which is what the no-workers alert needs)."""
        from .. import __version__

        build = _gauge(
            "echomq_build_info", "The EchoMQ version of this exporter (value 1)", "version"
        )
        build.add_metric([__version__], 1)
        oldest = _gauge(
            "echomq_queue_oldest_pending_age_seconds",
            "Seconds since the job the next claim takes was added (0: nothing pending)",
            "queue",
        )
        workers = _gauge("echomq_workers", "Live worker processes serving the queue", "queue")
        ks = self.client.keys
        try:
            ages = self._folded(self.client.perform(oldest_pending(ks, self._shards_of(queues))))
            served = self._folded(per_queue(self.client.perform(read_workers(ks))))
        except EchoMQError:
            ages, served = {}, {}
        for q in queues:
            oldest.add_metric([q], ages.get(q) or 0.0)
        for q in sorted(set(queues) | set(served)):
            workers.add_metric([q], served.get(q, 0))
        yield from (build, oldest, workers)

    def _groups(self, queues: list[str]) -> Iterable[Metric]:
        """Two gauges per queue with fairness groups waiting - how many, and the busiest one's
        jobs queued - never a series per group (100,000 groups would be 100,000 series)."""
        waiting = _gauge(
            "echomq_queue_groups_waiting",
            "Fairness groups with work queued in the queue (they take turns)",
            "queue",
        )
        busiest = _gauge(
            "echomq_queue_group_busiest_queued",
            "Jobs queued of the queue's busiest fairness group",
            "queue",
        )
        ks = self.client.keys
        by_queue = {n: [s for s, m in self._logical.items() if m == n] or [n] for n in queues}
        try:
            loads = self.client.perform(
                sharding.together([load(ks, shards, top=1) for shards in by_queue.values()])
            )
        except EchoMQError:
            loads = []  # the queue gauges were read: a scrape never raises
        for queue, got in zip(by_queue, loads, strict=False):
            if got.waiting:
                waiting.add_metric([queue], got.waiting)
                busiest.add_metric([queue], got.busiest[0][1])
        yield from (waiting, busiest)

    def _shards_of(self, queues: list[str]) -> list[str]:
        """The physical queues of ``queues`` (logical names, as :meth:`read` returns them)."""
        return [s for s, n in self._logical.items() if n in set(queues)] or queues

    def _folded(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Per-shard values under their logical name: the largest (the oldest head; the
        workers of a sharded queue serve every shard, so any shard counts them all)."""
        out: dict[str, Any] = {}
        for queue, value in values.items():
            name = self._logical.get(queue, queue)
            if value is not None and (out.get(name) is None or value > out[name]):
                out[name] = value
            else:
                out.setdefault(name, value)
        return out

    def describe(self) -> Iterable[Metric]:
        return []  # the metrics are made at collect time; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        started = time.perf_counter()
        up = _gauge("echomq_up", "1 when the last scrape read the server, else 0")
        try:
            readings = self.read()
        except EchoMQError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        jobs = _gauge("echomq_queue_jobs", "Jobs per queue and state", "queue", "state")
        outbox = _gauge(
            "echomq_outbox_signals",
            "Fan-in signals waiting in the queue's outbox for the Pump",
            "queue",
        )
        poison = _gauge(
            "echomq_poison_signals", "Signals the Pump moved aside (poison list)", "queue"
        )
        flows = _gauge("echomq_flows", "Root flows per queue and state", "queue", "state")
        lag = _gauge(
            "echomq_outbox_head_age_seconds",
            "How long the queue's oldest undelivered signal has been at the head of its "
            "outbox, as seen by this exporter (0: empty or moving); the Pump's lag",
            "queue",
        )
        limit = _gauge(
            "echomq_queue_rate_limit_per_second",
            "The queue's rate limit in job starts per second (queues with a limit only)",
            "queue",
        )
        booked = _gauge(
            "echomq_queue_rate_booked_seconds",
            "How far ahead of the server's clock the queue's starts are booked by its rate "
            "limit (TAT - now: 0 when idle, its whole burst may start; up to burst x interval "
            "when busy; queues with a limit only)",
            "queue",
        )
        for r in readings:
            if r.rate is not None:
                limit.add_metric([r.queue], r.rate.limit * 1000 / r.rate.window_ms)
                booked.add_metric([r.queue], r.rate.resets_in)
            for state, n in r.jobs.items():
                jobs.add_metric([r.queue, state], n)
            outbox.add_metric([r.queue], r.outbox)
            poison.add_metric([r.queue], r.poison)
            for state, n in r.flows.items():
                flows.add_metric([r.queue, state], n)
            lag.add_metric([r.queue], r.head_age)
        yield from self._controls([r.queue for r in readings])
        yield from self._groups([r.queue for r in readings])
        yield from self._latency_and_workers([r.queue for r in readings])
        took = _gauge("echomq_scrape_duration_seconds", "How long the last read of the server took")
        took.add_metric([], time.perf_counter() - started)
        yield from (up, jobs, outbox, poison, flows, lag, limit, booked, took)


__all__ = [
    "COMMANDS_PER_QUEUE",
    "QueueCollector",
    "QueueReading",
    "read_queues",
]
