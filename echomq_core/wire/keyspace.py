"""The whole keyspace, built in one place.

Every key of queue ``q`` is ``<prefix>:{q}:<suffix>``: the hash tag ``{q}`` puts a queue on one
Cluster slot, so every script of that queue is single-slot. Nothing else in EchoMQ
concatenates key strings, and no Lua script derives a key from a value it read: keys travel
in ``KEYS`` so Cluster routing stays honest.

Per queue:

========================  ======  ===========================================================
key                       type    holds
========================  ======  ===========================================================
``job:<id>``              hash    the job row: payload, attempts, parent fields, and ``run``
                                  (lua/includes/run.lua): max_attempts, attempts, stalls,
                                  timeout, created and the parent's policy, gate mark and queue
                                  in one value, for the claim's read
                                  (claiming.ROW_FIELDS); a leaf's max_attempts and created
                                  live only there (a parent keeps its own),
                                  state (parents: held/pending/failed; dead), error, a kept
                                  row's ``done`` (its last lease token and its result in one
                                  value, complete.lua; rows completed before it: ``result``
                                  and ``token``, or ``started`` and ``worker``), the last
                                  failed attempt's traceback (at most 16 KiB, the tail;
                                  dropped by a revive or repair), the last 10 failed
                                  attempts (``history``, at most 1.6 KiB); a
                                  parent's ``log`` (it keeps a settle log) and ``grown``
                                  (how many of its ``total`` were spawned: spawn.lua)
``job:<id>:dependencies`` string  a parent's outstanding-child counter
``job:<id>:processed``    hash    child id -> result, for each child that completed
``job:<id>:unsuccessful`` hash    child id -> error, for each child that died under ``id``
``job:<id>:failed``       hash    child id -> error, for each child that died under ``fp``
``job:<id>:repair``       hash    child id -> kind, the dead (or cancelled) children a repair
                                  is putting back to work; emptied when the repair is done
``job:<id>:explicit``     hash    child id -> queue, for a parent's children whose ids were
                                  given by the caller (derived ids need no record: they are
                                  ``<id>.<index>``); read when the flow expires
``job:<id>:log``          stream  the settle log of a root added with ``stream=True``: one
                                  entry (kind -> child id) per child recorded, written in the
                                  step that counts it (settle_current.lua); what
                                  ``iter_results`` follows; deleted with the flow's expiry
``pending``               zset    claimable jobs, scored priority * 2^40 + arrival number
``seq``                   string  the arrival counter (FIFO that does not trust clocks)
``active``                zset    leased jobs, scored by lease deadline (ms)
``leases``                hash    job id -> current lease token (one HSET per claimed batch;
                                  ``<worker id tail>.<claim ms>.<random>``)
``delayed``               zset    jobs waiting for a due time (retries, delayed adds)
``dead``                  zset    the morgue, scored by time of death
``completed``             zset    finished jobs by finish time (ms): "completed" is membership
                                  here, so finishing a flow child never writes its row
``wake``                  zset    one member while jobs may be waiting: every script that
                                  makes jobs claimable sets it, idle workers block on it
                                  (BZPOPMIN) instead of polling; a hint, never needed for
                                  correctness
``flow:outbox``           list    signals of this queue's children whose parent is elsewhere
``flow:outbox:head``      hash    the Pump's ageing record of a head that does not deliver
``flow:outbox:lease``     string  which Pump drains this outbox now (SET NX PX)
``flow:outbox:wake``      zset    one member while signals may be waiting: every script that
                                  pushes to the outbox sets it, an idle Pump blocks on it
                                  (BZPOPMIN) instead of sleeping; a hint, never needed for
                                  correctness
``flow:poison``           list    signals moved aside after repeated failures: ``<ms> <reason>``
                                  newline signal
``flows:held``            zset    root flows whose parent is held, by creation time (ms)
``flows:released``        zset    released barrier flows (read from outside) not yet closed,
                                  by release time: the ``unclosed`` retention runs on it
``flows:closed``          zset    closed flows, by close time: the ``closed`` retention
``flows:failed``          zset    failed root flows, by failure time: the ``failed`` retention
``flows:cancelled``       zset    cancelled root flows, by cancel time: the ``cancelled``
                                  retention
``flows:completed``       zset    worker-run root flows whose parent job completed, by finish
                                  time (complete.lua, told by the claim's read of the row);
                                  what ``flow ls --state completed`` pages. Not one of the
                                  :data:`QUEUE_KEYS`: only complete.lua, expire.lua and
                                  reset.lua take it. An entry goes with its flow: when the
                                  ``completed`` retention expires the parent (expire.lua) or a
                                  replace resets it (reset.lua)
``watch:<name>``          string  release watcher ``<name>``'s cursor, ``<release ms>:<id>`` of
                                  the last flow it took (:mod:`echomq_core.flows.release_watch`);
                                  expires a week after its last poll
``gate:<pq>:<id>``        zset    the children of parent ``<id>`` (of queue ``<pq>``) that
                                  wait for a token of the flow's ``max_running`` cap, scored
                                  as in ``pending``; the settling step that frees a token
                                  moves the head to ``pending``; emptied by cancel (a
                                  zset with no member is no key), deleted with the flow
``gate:<pq>:<id>:cap``    hash    ``cap`` (this queue's share of the cap), ``admitted``
                                  (children holding a token: pending, leased or retrying),
                                  ``off`` (set by cancel: nothing is admitted); deleted with
                                  the flow (forget.lua)
``config``                hash    this queue's retention settings (ages in ms, counts); absent
                                  fields take the defaults of :mod:`echomq_core.flows.retention`;
                                  and its rate limit (``rate``: ``<limit> <window ms>``, and
                                  `` <burst>`` above 1, :mod:`echomq_core.control.rates`); a
                                  sharded queue's shard names (``shards``,
                                  :mod:`echomq_core.flows.sharding`: shard i > 0 is the queue
                                  ``<q>+s<i>.<n>``, a queue like any other)
``rate:tat``              string  the rate limit's theoretical arrival time (GCRA, µs on the
                                  server's clock); written by claims of a rate-limited queue
                                  (claim.lua, its owner), expires by itself at that time, when
                                  it no longer holds a start back
``fair``                  hash    turns between fairness groups (lua/includes/fair.lua):
                                  ``max`` (the highest tag given) and ``g:<group>`` (the tag
                                  of the group's last job); written by adds of grouped jobs
                                  and, once it exists, by every add; ``max`` lives as long
                                  as the queue (as ``seq``), a group's field is deleted by
                                  the retention sweep once its tag is behind the claims
``sweep:lease``           string  which Pump sweeps this queue now (SET NX PX, taken only when
                                  something is due)
``minutes``               hash    completed and failed attempts per minute of the last 24 h:
                                  field minute mod 1440, value ``<minute> <done> <failed>``
                                  (includes/tally.lua, in each completion or failure call of a
                                  worker, :mod:`echomq_core.queues.throughput`); overwritten a day
                                  later, expires 25 h after the last batch
========================  ======  ===========================================================

Every key has an owner that deletes it. Rows, counters and result hashes of a flow (its
parent's and every node's below it, in any queue) are deleted together when the flow expires:
by the retention sweep of the root's end state (``completed`` for a worker-run root,
``flows:closed``, ``flows:released`` for an unclosed barrier, ``flows:failed``). A plain job's
row goes with its own end state (``completed``, ``dead``); a flow child's index entries in
``completed``/``dead`` are dropped by its queue's sweep, but its row stays until its flow
expires.

Global (not per queue): ``<prefix>:queues``, a set of queue names written when a queue is
first used, so Pumps and operators can discover queues without ``KEYS``/``SCAN``; and
``<prefix>:ref:<name>``, strings holding named flow references (``EchoMQ.save_ref``), which
adapters use to hand a flow from one process to another.

Workers (:mod:`echomq_core.queues.registry`): ``<prefix>:workers``, a zset of worker ids by
last beat (ms), and ``<prefix>:worker:<id>``, a hash per worker process (host, pid, queues,
concurrency, in flight, started, beat) with a PEXPIRE of three beats. Owners: the worker
deletes both at a clean stop; a worker that dies leaves its hash to expire, and its zset member
to the readers (the dashboard, the collector, ``echomq workers``), which ZREM members whose
hash is gone, and to every beat of any worker, which drops members not seen for a day.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ..errors import ConfigurationError, InvalidArgument, InvalidJobId, InvalidQueueName

#: A queue name: letters, digits and ``. _ - / @ +``; no braces (hash tag), no colon (key
#: grammar), no whitespace or control characters. Bounded so keys stay small.
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9._\-/@+]{1,128}")
#: A job id: ``JOB-`` plus a safe tail; the same rule is enforced by the scripts (EMQKIND).
JOB_ID_RE = re.compile(r"JOB-[A-Za-z0-9._\-/@+=~#]{1,200}")
#: The longest id JOB_ID_RE accepts ("JOB-" and 200 characters).
MAX_ID_LENGTH = 204
PREFIX_RE = re.compile(r"[A-Za-z0-9._\-]{1,32}")
#: The per-queue indexes of root flows, by state (``flows:<state>``), in the order every
#: script that moves a flow between them takes their keys.
FLOW_INDEXES = ("held", "released", "closed", "failed", "cancelled")
#: The states root flows are listed by (``flow ls``, :meth:`EchoMQ.list_flows`): the five
#: :data:`FLOW_INDEXES` and ``completed``, worker-run roots whose parent job completed
#: (``flows:completed``, which only the scripts that finish or delete such a root take).
FLOW_LISTS = (*FLOW_INDEXES, "completed")
#: A stored reference's name: printable, no whitespace or braces (adapters key them by asset).
REF_NAME_RE = re.compile(r"[!-z|~]{1,512}")
#: The shared keys of a queue, in the ONE order every script that touches a queue's sets takes
#: them, as ``KEYS[1..15]`` (``lua/includes/queue_keys.lua`` names them for the script; a
#: script's own keys follow). One order for all, so no call site maps keys to a script's
#: positions; a script that uses a few of them still takes all fifteen (all one slot).
QUEUE_KEYS = (
    "pending",
    "wake",
    "seq",
    "active",
    "leases",
    "delayed",
    "dead",
    "completed",
    "flow:outbox",
    "flow:outbox:wake",
    *(f"flows:{state}" for state in FLOW_INDEXES),
)


def check_queue(name: object) -> str:
    """Return ``name`` if it is a valid queue name, else raise :class:`InvalidQueueName`."""
    if not isinstance(name, str):
        raise InvalidQueueName(f"queue name must be a string, got {type(name).__name__}")
    if not QUEUE_NAME_RE.fullmatch(name):
        shown = name if len(name) <= 60 else name[:60] + "..."
        raise InvalidQueueName(
            f"invalid queue name {shown!r}: use 1-128 of letters, digits and . _ - / @ + "
            "(no braces, colons, whitespace or control characters)"
        )
    return name


def check_job_id(job_id: object) -> str:
    """Return ``job_id`` if it is ``JOB-`` plus a safe tail, else raise :class:`InvalidJobId`."""
    if not isinstance(job_id, str):
        raise InvalidJobId(f"job id must be a string, got {type(job_id).__name__}")
    if not JOB_ID_RE.fullmatch(job_id):
        shown = job_id if len(job_id) <= 60 else job_id[:60] + "..."
        raise InvalidJobId(
            f"invalid job id {shown!r}: must be 'JOB-' followed by 1-200 of letters, digits "
            "and . _ - / @ + = ~ #"
        )
    return job_id


#: The longest fairness group, in UTF-8 bytes (as a job id's bound; lua/add.lua checks it too).
MAX_GROUP_BYTES = 204


def check_group(group: object, name: str = "group") -> str:
    """Return ``group`` (a job's fairness group: a tenant, an account) if it is a non-empty str
    of at most :data:`MAX_GROUP_BYTES` UTF-8 bytes without control characters, else raise
    :class:`InvalidArgument` naming ``name``."""
    if not isinstance(group, str):
        raise InvalidArgument(f"{name} must be a str, got {type(group).__name__}")
    size = len(group.encode(errors="replace"))
    if not group or size > MAX_GROUP_BYTES or not group.isprintable():
        shown = group if len(group) <= 60 else group[:60] + "..."
        raise InvalidArgument(
            f"invalid {name} {shown!r}: 1-{MAX_GROUP_BYTES} bytes of printable characters "
            f"(got {size} bytes)"
        )
    return group


def child_stem(parent_id: str, gen: str = "") -> str:
    """What the derived ids of a node's children start with: ``<parent id>.``, or
    ``<parent id>.g<n>.`` for the children of a root in generation n of a replaced flow (so no
    new child has an old child's id). Child i's derived id is the stem and ``i``. The one place
    that writes this grammar; :func:`derived_index` reads it back."""
    return f"{parent_id}.g{gen}." if gen else f"{parent_id}."


def derived_index(parent_id: str, child_id: str) -> int | None:
    """The index i of ``child_id`` when it is a derived id of a child of ``parent_id``
    (``<parent id>.<i>`` or ``<parent id>.g<n>.<i>``: :func:`child_stem`), else None (an id
    given explicitly)."""
    if not child_id.startswith(parent_id) or child_id[len(parent_id) : len(parent_id) + 1] != ".":
        return None
    rest = child_id[len(parent_id) + 1 :]
    if rest.startswith("g"):
        gen, dot, rest = rest[1:].partition(".")
        if not (dot and _decimal(gen)):
            return None
    return int(rest) if _decimal(rest) else None


def _decimal(text: str) -> bool:
    return text.isascii() and text.isdigit()


#: Characters that may not appear in a job id's tail (JOB_ID_RE's complement) ...
ID_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._\-/@+=~#]")
#: ... and those that may not appear in a part that ``/``-separated ids are built from (a
#: word: no separators of any kind).
WORD_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._\-]")


def id_part(text: str, limit: int = 80, *, word: bool = False, mark: bool = True) -> str:
    """``text`` made usable inside a derived job id (the adapters' one rule for turning DAG,
    task, run, asset and partition names into ids).

    Unsafe characters become ``_`` (``word=True``: also the separators ``/ @ + = ~ #``). With
    ``mark`` (the default), a part that had to change or be cut to ``limit`` ends in ``~`` and
    10 hex digits of SHA-1 over the original, so distinct inputs stay distinct; without it the
    part is only cut, for ids whose uniqueness comes from a digest of their own.
    """
    import hashlib

    cleaned = (WORD_UNSAFE_RE if word else ID_UNSAFE_RE).sub("_", text)
    if not mark:
        return cleaned[:limit]
    if cleaned == text and len(text) <= limit:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    return f"{cleaned[: max(1, limit - 11)]}~{digest}"


@lru_cache(maxsize=4096)
def _queue_keys(prefix: str, queue: str) -> tuple[str, ...]:
    base = f"{prefix}:{{{check_queue(queue)}}}:"
    return tuple(base + name for name in QUEUE_KEYS)


@lru_cache(maxsize=4096)
def _claim_keys(prefix: str, queue: str) -> tuple[str, ...]:
    base = f"{prefix}:{{{check_queue(queue)}}}:"
    return (*_queue_keys(prefix, queue), base + "config", base + "rate:tat")


@dataclass(frozen=True, slots=True)
class Keyspace:
    """Typed key builders for one key prefix."""

    prefix: str = "emq"

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not PREFIX_RE.fullmatch(self.prefix):
            raise ConfigurationError(
                f"invalid key prefix {self.prefix!r}: use 1-32 of letters, digits and . _ -"
            )

    # -- global ---------------------------------------------------------------------------
    def queues(self) -> str:
        """The set of known queue names (the Pump's discovery registry)."""
        return f"{self.prefix}:queues"

    def ref(self, name: str) -> str:
        """A named flow reference (adapters hand flows between processes through these).
        No hash tag: one plain string, read and written on its own, on any node."""
        if not isinstance(name, str) or not REF_NAME_RE.fullmatch(name):
            raise InvalidArgument(
                f"invalid reference name {name!r}: 1-512 printable characters, "
                "no whitespace or braces"
            )
        return f"{self.prefix}:ref:{name}"

    # -- per queue ------------------------------------------------------------------------
    def base(self, queue: str) -> str:
        """``<prefix>:{queue}:``: every key of the queue starts with it (validated here)."""
        return f"{self.prefix}:{{{check_queue(queue)}}}:"

    def queue_key(self, queue: str, name: str) -> str:
        """A per-queue structure: ``pending``, ``active``, ``flow:outbox`` ..."""
        return self.base(queue) + name

    def pending(self, queue: str) -> str:
        return self.base(queue) + "pending"

    def active(self, queue: str) -> str:
        return self.base(queue) + "active"

    def seq(self, queue: str) -> str:
        return self.base(queue) + "seq"

    def leases(self, queue: str) -> str:
        return self.base(queue) + "leases"

    def delayed(self, queue: str) -> str:
        return self.base(queue) + "delayed"

    def dead(self, queue: str) -> str:
        return self.base(queue) + "dead"

    def completed(self, queue: str) -> str:
        return self.base(queue) + "completed"

    def wake(self, queue: str) -> str:
        return self.base(queue) + "wake"

    def watch(self, queue: str, watcher: str) -> str:
        """A release watcher's cursor (:mod:`echomq_core.flows.release_watch`)."""
        return self.base(queue) + "watch:" + watcher

    def outbox(self, queue: str) -> str:
        return self.base(queue) + "flow:outbox"

    def outbox_head(self, queue: str) -> str:
        return self.base(queue) + "flow:outbox:head"

    def outbox_lease(self, queue: str) -> str:
        return self.base(queue) + "flow:outbox:lease"

    def outbox_wake(self, queue: str) -> str:
        return self.base(queue) + "flow:outbox:wake"

    def poison(self, queue: str) -> str:
        return self.base(queue) + "flow:poison"

    def flows(self, queue: str, state: str) -> str:
        """The index of root flows in ``state``: held | released | closed | failed |
        cancelled | completed."""
        if state not in FLOW_LISTS:
            raise InvalidArgument(f"no flow index {state!r}: one of {', '.join(FLOW_LISTS)}")
        return self.base(queue) + "flows:" + state

    def queue_keys(self, queue: str) -> tuple[str, ...]:
        """The :data:`QUEUE_KEYS` of ``queue``: the first fifteen keys of every script call that
        touches the queue's sets (cached: hot paths build them for every call)."""
        return _queue_keys(self.prefix, queue)

    def config(self, queue: str) -> str:
        return self.base(queue) + "config"

    def sweep_lease(self, queue: str) -> str:
        return self.base(queue) + "sweep:lease"

    def fair(self, queue: str) -> str:
        """The queue's fairness tags: turns between groups (lua/includes/fair.lua)."""
        return self.base(queue) + "fair"

    def rate_tat(self, queue: str) -> str:
        """The queue's rate limit's theoretical arrival time (claim.lua)."""
        return self.base(queue) + "rate:tat"

    def minutes(self, queue: str) -> str:
        """The queue's per-minute tallies of completed and failed attempts (includes/tally.lua)."""
        return self.base(queue) + "minutes"

    def workers(self) -> str:
        """The registry of worker processes: a zset of ids by last beat (ms)."""
        return f"{self.prefix}:workers"

    def worker(self, worker_id: str) -> str:
        """One worker process's entry (hash, expires unless beaten); ids are host-made."""
        return f"{self.prefix}:worker:{worker_id}"

    def claim_keys(self, queue: str) -> tuple[str, ...]:
        """The keys of a claim: :meth:`queue_keys`, ``config`` and ``rate:tat`` (cached)."""
        return _claim_keys(self.prefix, queue)

    # -- per job --------------------------------------------------------------------------
    def job_prefix(self, queue: str) -> str:
        """``<prefix>:{queue}:job:``; with a known-good id appended, a row key (hot paths build
        many row keys of one queue from ids the server itself returned)."""
        return self.base(queue) + "job:"

    def job(self, queue: str, job_id: str) -> str:
        return self.base(queue) + "job:" + check_job_id(job_id)

    def dependencies(self, queue: str, job_id: str) -> str:
        return self.job(queue, job_id) + ":dependencies"

    def processed(self, queue: str, job_id: str) -> str:
        return self.job(queue, job_id) + ":processed"

    def unsuccessful(self, queue: str, job_id: str) -> str:
        return self.job(queue, job_id) + ":unsuccessful"

    def failed(self, queue: str, job_id: str) -> str:
        return self.job(queue, job_id) + ":failed"

    def explicit(self, queue: str, job_id: str) -> str:
        return self.job(queue, job_id) + ":explicit"

    def repair(self, queue: str, job_id: str) -> str:
        return self.job(queue, job_id) + ":repair"

    def settle_log(self, queue: str, job_id: str) -> str:
        return self.job(queue, job_id) + ":log"

    def gate_keys(self, queue: str, parent_queue: str, parent_id: str) -> list[str]:
        """The two keys of the cap gate of ``parent_id``'s children in ``queue`` (on the
        child queue's slot, where claims happen): the waiting zset and the ``:cap`` hash. The
        parent's queue is part of the name (ids and queue names hold no colon), so parents of
        one id in two queues never share a gate."""
        gate = f"{self.base(queue)}gate:{check_queue(parent_queue)}:{check_job_id(parent_id)}"
        return [gate, gate + ":cap"]

    def node_keys(self, queue: str, job_id: str) -> list[str]:
        """Every key of one flow node: the five :meth:`parent_keys`, ``:explicit``,
        ``:repair`` and ``:log`` (the settle log: its owner is the flow's expiry)."""
        row = self.job(queue, job_id)
        return [*self.parent_keys(queue, job_id), row + ":explicit", row + ":repair", row + ":log"]

    def settle_keys(self, queue: str, job_id: str) -> list[str]:
        """The seven keys of a parent every settling script takes (complete, fail, deliver):
        the five :meth:`parent_keys`, ``:explicit`` (which a replaced flow's settle consults)
        and ``:log`` (written only for a flow added with ``stream=True``)."""
        row = self.job(queue, job_id)
        return [*self.parent_keys(queue, job_id), row + ":explicit", row + ":log"]

    def parent_keys(self, queue: str, job_id: str) -> list[str]:
        """The five keys of a parent, in the order every settling script takes them:
        row, dependencies, processed, unsuccessful, failed."""
        row = self.job(queue, job_id)
        return [
            row,
            row + ":dependencies",
            row + ":processed",
            row + ":unsuccessful",
            row + ":failed",
        ]
