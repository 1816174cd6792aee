"""Plain data: what callers hand to EchoMQ and what they get back."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

from .errors import InvalidArgument, InvalidInput, InvalidPayload

#: CPython's C JSON encoder factory (None without the _json accelerator); typeshed leaves it out
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)

FAIL_PARENT = "fp"
IGNORE = "id"

#: The most of a failed attempt's traceback kept on its job row, in bytes (UTF-8): its tail,
#: where the exception line and the innermost frames are. Bounded so a deep or looping stack
#: cannot grow server memory; a job costs at most this much more than its payload and error.
MAX_TRACEBACK = 16 * 1024


#: The words of a row's ``run`` field (lua/includes/run.lua) that a leaf's row keeps nowhere
#: else: max_attempts and the creation time (ms).
RUN_MAX_ATTEMPTS, RUN_CREATED = 0, 4


def fields_dict(
    obj: Any,
    /,
    *,
    rename: Mapping[str, str] | None = None,
    skip: Collection[str] = (),
    **convert: Callable[[Any], Any],
) -> dict[str, Any]:
    """A dataclass as a dict in declaration order (``to_dict``'s JSON): each field not in
    ``skip`` under its ``rename``, through its ``convert`` (nested values not copied)."""
    out = {}
    for f in fields(obj):
        if f.name not in skip:
            value = getattr(obj, f.name)
            key = rename.get(f.name, f.name) if rename else f.name
            out[key] = convert[f.name](value) if f.name in convert else value
    return out


def run_word(run: Any, at: int) -> int | None:
    """Word ``at`` of a row's ``run`` value as an int; None when there is no ``run`` (no row)
    or the word is '-'."""
    if run is None:
        return None
    words = (run.decode() if isinstance(run, bytes) else str(run)).split(" ", at + 1)
    word = words[at] if len(words) > at else "-"
    return None if word in ("-", "") else int(word)


def row_fact(own: Any, run: Any, at: int) -> int | None:
    """A row's max_attempts or created (``at``: :data:`RUN_MAX_ATTEMPTS`, :data:`RUN_CREATED`):
    its own field where the row keeps one (a flow parent's row), else ``run``'s word."""
    if own is not None:
        return int(float(own))
    return run_word(run, at)


def split_done(value: bytes) -> tuple[str, bytes]:
    """A kept row's ``done`` field (lua/complete.lua: '<length of the token>:<token><result>')
    as (lease token, serialised result)."""
    length, _, rest = value.partition(b":")
    n = int(length)
    return rest[:n].decode(), rest[n:]


def cut_traceback(text: str | None) -> str:
    """``text`` as the fail script keeps it: '' for none, else at most :data:`MAX_TRACEBACK`
    bytes - the tail, behind a line that says how much was cut."""
    if not text:
        return ""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= MAX_TRACEBACK:
        return text
    tail = raw[-(MAX_TRACEBACK - 64) :].decode("utf-8", "ignore")
    return f"[... {len(raw) - len(tail.encode())} bytes of the traceback cut ...]\n{tail}"


class Serializer(Protocol):
    """Turns payloads and results into bytes and back. Replaceable per client."""

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class JsonSerializer:
    """The default: compact JSON, UTF-8. Refuses NaN and values JSON cannot carry."""

    # One encoder and decoder for the process: json.dumps() with options builds a new encoder
    # on every call, which costs more than encoding a small payload.
    _encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
    _encode = _encoder.encode
    # The C encoder itself, made once: JSONEncoder.encode() makes one on every call, about half
    # of what a small dict costs (1.06 against 0.44 us; a planned child and a dict result pay
    # it each). Without the markers dict, a value that contains itself is met as the
    # RecursionError of any too-deep value (dumps() names both) instead of "Circular reference
    # detected"; the markers cannot be shared, since an error leaves its entries behind.
    _one_shot = (
        None
        if _c_make_encoder is None
        else _c_make_encoder(
            None,
            _encoder.default,
            json.encoder.encode_basestring_ascii,
            None,
            ":",
            ",",
            False,  # sort_keys
            False,  # skipkeys
            False,  # allow_nan
        )
    )
    _decode = json.JSONDecoder().decode
    # The decoder's scanner, without decode()'s two whitespace regex passes: most payloads
    # and results are small values with no whitespace around them; anything else (leading or
    # trailing whitespace, extra data, an error) goes through decode() as before.
    _scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]

    def dumps(self, value: Any) -> bytes:
        # None, bools and ints (the usual no-op and counting results) without the encoder's
        # per-call set-up; the same bytes json.dumps gives
        kind = type(value)
        try:
            if value is None:
                return b"null"
            if kind is int:
                return int.__repr__(value).encode()
            if kind is bool:
                return b"true" if value else b"false"
            one_shot = JsonSerializer._one_shot
            if one_shot is None:  # a Python without the C accelerator
                return JsonSerializer._encode(value).encode()
            return "".join(one_shot(value, 0)).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidPayload(f"value is not JSON-serialisable: {exc}") from None
        except RecursionError:
            raise InvalidPayload(
                "value is not JSON-serialisable: it contains itself, or nests deeper than "
                "Python's recursion limit"
            ) from None

    def loads(self, data: bytes) -> Any:
        text = data.decode() if isinstance(data, bytes) else data
        try:
            value, end = JsonSerializer._scan(text, 0)
            if end == len(text):
                return value
        except (StopIteration, ValueError):
            pass
        return JsonSerializer._decode(text)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter between attempts of a failing job.

    delay(n) = uniform(0.5, 1.0) * min(cap_ms, base_ms * 2 ** (n - 1)) for the n-th failure:
    jitter spreads retries of a burst of failures so they do not hit the server together.
    """

    base_ms: int = 1000
    cap_ms: int = 300_000

    def __post_init__(self) -> None:
        if not (isinstance(self.base_ms, int) and self.base_ms >= 0):
            raise InvalidArgument(f"backoff base_ms must be an int >= 0, got {self.base_ms!r}")
        if not (isinstance(self.cap_ms, int) and self.cap_ms >= self.base_ms):
            raise InvalidArgument(f"backoff cap_ms must be an int >= base_ms, got {self.cap_ms!r}")

    def delay_ms(self, failures: int) -> int:
        raw = min(self.cap_ms, self.base_ms * 2 ** max(0, min(failures - 1, 40)))
        return int(raw * random.uniform(0.5, 1.0))


@dataclass(frozen=True, slots=True)
class ParentRef:
    """Where a child's parent lives, and the child's failure-policy token toward it.
    ``gated``: the child holds a token of its parent's ``max_running`` cap, which the step that
    settles it returns (the host passes that gate's keys)."""

    queue: str
    id: str
    policy: str = FAIL_PARENT
    gated: bool = False


@dataclass(slots=True)
class Job:
    """A claimed job: the holder of ``token`` may complete, fail or heartbeat it. ``queue`` is
    the queue's name as the caller knows it (a sharded queue's logical name); ``shard`` is the
    physical queue that holds it (``queue`` itself unless sharded), where it is settled."""

    queue: str
    id: str
    token: str
    payload: Any
    attempts: int
    max_attempts: int
    parent: ParentRef | None = None
    stalls: int = 0
    decode_error: str | None = None
    timeout_ms: int | None = None  # the job's own handler time limit, if it was given one
    shard: str = ""
    #: set by the worker that runs the job: what :meth:`spawn` calls (echomq_core.flows.spawning)
    spawner: Any = field(default=None, repr=False, compare=False)
    spawned: int = 0  # siblings spawned by this run of the handler (the next id's index)
    adopted: int = 0  # children of its own spawned by this run (the next id's index)
    #: True when this run is the job's run as a parent: a worker-run flow parent released, or
    #: a job that spawned children of its own, run again once they settled (read at the claim)
    resumed: bool = False

    def __post_init__(self) -> None:
        if not self.shard:
            self.shard = self.queue

    def __repr__(self) -> str:
        return f"Job({self.queue!r}, {self.id!r}, attempts={self.attempts})"

    def spawn(self, children: Iterable[Child], *, own: bool = False) -> Any:
        """Add ``children`` (leaves: a list, a generator, any iterable of :class:`Child`) to
        this job's flow, counted before any of them can run. None (``[]``: a page without
        links, an empty directory) is a no-op that reaches no server and returns ``[]``; with
        ``own=True`` the job then completes as a plain one, with its handler's return value.

        As its siblings (the default): under its parent, ids ``<id>.s<i>``. As its own
        children (``own=True``): this job becomes their parent, ids ``<id>.k<i>``; when the
        handler returns, its return value is not recorded: the job waits for them (held), and
        once they have all settled it is claimed again and its handler runs a second time,
        with :attr:`resumed` True, as a worker-run parent's does - it reads them with
        :meth:`children_values` and returns the job's result. A child that dies under
        fail-parent fails it (with its own policy toward its parent). Ids derive from this
        job's, so a re-run of the handler (lease lost, worker killed) spawns the same children
        once. Returns their ids - in an async handler of an :class:`~echomq_core.AsyncWorker`,
        an awaitable of them. See :mod:`echomq_core.flows.spawning` (errors:
        :class:`InvalidArgument` for a job not in a flow, bad children, a flow past its bound,
        own children asked for by a resumed run; :class:`FlowConflict` for a flow that is no
        longer held; :class:`LeaseLost` for own children of a job whose lease is gone)."""
        if self.spawner is None:
            raise InvalidArgument(
                f"job {self.id}: spawn() works inside a handler run by a Worker or AsyncWorker"
            )
        return self.spawner(self, children, own)

    def children_values(self) -> Any:
        """The values of this job's own completed children (a flow parent's, or own children
        it spawned), by child id: ``EchoMQ.children_values`` of this job, in a handler -
        an awaitable in an async handler of an :class:`~echomq_core.AsyncWorker`."""
        if self.spawner is None:
            raise InvalidArgument(
                f"job {self.id}: children_values() works inside a handler run by a Worker or "
                "AsyncWorker (outside one: EchoMQ.children_values)"
            )
        return self.spawner.values(self)


@dataclass(slots=True)
class Settlement:
    """What a batch of completions or failures did: a status per job, and the flow parents
    (queue, id) the batch released or failed on the way (for lifecycle hooks), and the ids
    of the capped children its gates admitted straight into the caller's lease (``handed``:
    see :class:`~echomq_core.queues.settling.Hand`). Of a batch of completions also: ``waits``, the
    server's answer for each job of the batch whose run spawned children of its own, in batch
    order (see :func:`~echomq_core.flows.spawning.await_children`), and ``voided``, how many
    children that an earlier run of a job counted and never landed it settled as never landed (see
    :func:`~echomq_core.flows.spawning.reconcile`)."""

    statuses: list[int]
    released: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    handed: list[str] = field(default_factory=list)
    waits: list[Any] = field(default_factory=list)
    voided: int = 0

    def absorb(self, queue: str, reply: Any) -> None:
        """Add one script reply ``{statuses, events}`` or ``{statuses, events, handed ids}``."""
        statuses, events, *handed = reply
        if handed:
            self.handed += [h.decode() if isinstance(h, bytes) else str(h) for h in handed[0]]
        self.statuses += [int(x) for x in statuses]
        for i in range(0, len(events), 2):
            kind = events[i].decode() if isinstance(events[i], bytes) else str(events[i])
            pid = events[i + 1].decode() if isinstance(events[i + 1], bytes) else str(events[i + 1])
            (self.released if kind == "r" else self.failed).append((queue, pid))


@dataclass(slots=True)
class JobInfo:
    """An inspection read of one job: where it stands and what it holds."""

    queue: str
    id: str
    state: str  # pending | active | delayed | held | completed | dead | failed
    attempts: int
    max_attempts: int
    payload: Any
    result: Any = None
    error: str | None = None
    parent: ParentRef | None = None
    total: int | None = None
    stalls: int = 0
    finished_ms: int | None = None
    traceback: str | None = None  # the last failed attempt's, at most MAX_TRACEBACK bytes
    group: str | None = None  # its fairness group


@dataclass(frozen=True, slots=True)
class ChildFailure:
    """A flow's child that died: where it lives, its error (one line), its last attempt's
    traceback (None for a stall, an undecodable payload...), ``ignored`` (ignore-on-failure)."""

    queue: str
    job_id: str
    error: str
    traceback: str | None
    ignored: bool


@dataclass(slots=True)
class Child:
    """One node of a flow: a leaf job, or (with ``children``) a parent of its own.

    An explicit ``id`` must be free: an id that names a plain job or another flow's child is
    refused with :class:`~echomq_core.FlowConflict` (ids ``<parent id>.<n>`` are reserved for
    the derived ids of that parent's children).

    ``queue`` defaults to the parent's queue; ``id`` to ``<parent id>.<index>``, so a retried
    add derives the same ids. Failure policy: a child fails its parent when it dies (the
    default) or, with ``ignore_dependency_on_failure=True``, is recorded as an ignored failure
    and counted as settled; asking for both gives ignore - proceeding is the explicit opt-in.
    """

    payload: Any = None
    queue: str | None = None
    id: str | None = None
    ignore_dependency_on_failure: bool = False
    fail_parent_on_failure: bool = True
    max_attempts: int | None = None
    #: The children of a sub-flow: a list, or any iterable of Child (a generator is read once,
    #: when the flow is first planned, and kept here as a list, so a re-plan reads the same).
    children: Iterable[Child] = field(default_factory=list)
    #: The handler's time limit in seconds (None: the worker's queue setting); past it the
    #: worker records a failed attempt (``TimeoutError``) and frees the slot.
    timeout: float | None = None
    #: A leaf's priority, 0..800 (lower runs first, as :class:`JobSpec`'s): a late urgent flow
    #: overtakes a backlog of its queue. Refused on a child with children.
    priority: int = 0
    #: A sub-flow's own cap: at most this many of ITS leaf children are leased at once (as
    #: ``add_flow(max_running=)`` for the root). Refused on a leaf.
    max_running: int | None = None
    #: A sub-flow's success threshold (only with ``children``), as ``add_flow(min_success=)``:
    #: a fraction in (0, 1] or an int count of its children.
    min_success: float | int | None = None
    #: A leaf's fairness group, as :attr:`JobSpec.group` (refused on a child with children).
    group: str | None = None

    @property
    def policy(self) -> str:
        return IGNORE if self.ignore_dependency_on_failure else FAIL_PARENT


@dataclass(frozen=True, slots=True)
class FlowRef:
    """A handle to an added flow: enough to read it from anywhere (it serialises to JSON)."""

    queue: str
    parent_id: str
    children: tuple[tuple[str, str], ...] = ()  # (queue, id) of each direct child

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self, children=lambda children: [list(c) for c in children])

    @staticmethod
    def from_dict(data: dict[str, Any]) -> FlowRef:
        """The inverse of :meth:`to_dict`; :class:`InvalidInput` if ``data`` is not one."""
        try:
            return FlowRef(
                str(data["queue"]),
                str(data["parent_id"]),
                tuple((str(q), str(i)) for q, i in data.get("children", ())),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InvalidInput(
                f"not a flow reference (a mapping with queue and parent_id): {data!r:.200}"
            ) from None


@dataclass(slots=True)
class FlowSnapshot:
    """The counts of one flow at one moment (one consistent server-side read)."""

    queue: str
    parent_id: str
    # held | released | closed (barrier flows) | pending | completed | dead (worker-run
    # parents) | failed | cancelled | None (no such flow: never added, or expired)
    parent_state: str | None
    total: int
    dependencies: int
    processed: int
    ignored: int
    failed: int
    error: str | None = None  # why it failed; a cancelled flow: the reason given
    repairs: int = 0  # how many times retry_flow put it back to work
    #: A success threshold's allowance: how many fail-parent children may die without failing
    #: the flow (N - required); None: no threshold (the first such death fails it). ``failed``
    #: counts the deaths recorded so far (tolerated ones and the one that failed it).
    allowed: int | None = None
    #: The node's ``max_running`` cap (None: none); how much of it is in use: ``flow_cap``.
    cap: int | None = None

    @property
    def settled(self) -> int:
        return self.processed + self.ignored

    @property
    def outcome(self) -> str:
        """What whoever waits on the flow does now - the one place that decides it (waits, the
        Airflow sensor and trigger, the Dagster sensor and IO manager read it):
        ``released`` (read it), ``failed`` (a fail-the-parent child died), ``cancelled``,
        ``waiting`` (children outstanding), ``missing`` (no such flow: a wrong id or prefix,
        never added, or expired)."""
        if self.parent_state is None:
            return "missing"
        if self.parent_state in ("failed", "cancelled"):
            return self.parent_state
        return "released" if self.released else "waiting"

    @property
    def released(self) -> bool:
        """Every child settled and the parent not failed: readable (barrier flows: 'released',
        then 'closed'; worker-run flows: 'pending', then 'completed')."""
        return self.parent_state not in (None, "held", "failed", "cancelled")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # every field, in their order (all plain values)


@dataclass(frozen=True, slots=True)
class FlowCap:
    """A flow node's ``max_running`` cap and its use at one moment, per child queue (each
    queue's share is counted on its own slot: read together, not as one atomic snapshot).
    ``admitted``: children holding a token (pending, leased or waiting for a retry), never
    above the cap; ``waiting``: children not admitted yet."""

    queue: str
    parent_id: str
    cap: int
    admitted: int
    waiting: int
    shares: dict[str, tuple[int, int]]  # child queue -> (admitted, share)

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self, shares=_shares)


def _shares(shares: dict[str, tuple[int, int]]) -> dict[str, dict[str, int]]:
    return {q: {"admitted": a, "share": s} for q, (a, s) in shares.items()}


@dataclass(frozen=True, slots=True)
class FlowSummary:
    """One line of a flow listing (``EchoMQ.list_flows``, ``echomq flow ls``)."""

    queue: str
    parent_id: str
    state: str  # held | released | closed | failed | cancelled | completed
    total: int
    settled: int  # children completed or ignored (N - outstanding)
    age: float | None  # seconds since the flow was added
    since: float  # seconds in its current state (since it was added, released, closed, failed)
    error: str | None = None
    cap: int | None = None  # max_running (None: none)
    allowed: int | None = None  # min_success's allowance of deaths (None: no threshold)
    tolerated: int = 0  # deaths a threshold tolerated so far

    @property
    def controls(self) -> str:
        """The flow controls in a few words (``cap 50, 3 / 2,000 failed``); '' when none."""
        parts = []
        if self.cap is not None:
            parts.append(f"cap {self.cap:,}")
        if self.allowed is not None:
            parts.append(f"{self.tolerated:,} / {self.allowed:,} failed")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(
            self,
            rename={"age": "age_s", "since": "in_state_s"},
            age=lambda age: None if age is None else round(age, 3),
            since=lambda since: round(since, 3),
        )
