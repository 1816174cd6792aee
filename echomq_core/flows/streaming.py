"""Results as they settle: follow a flow's settle log from a cursor.

A root added with ``add_flow(..., stream=True)`` keeps a settle log (``job:<id>:log``, a stream
on the parent's slot): the step that records a child - the same-queue completion or failure,
or the Pump's delivery of a cross-queue signal - appends one entry (kind, child id) in that same
script call (lua/includes/settle_current.lua), so the log holds exactly the children the
counter has counted, in the order they were counted. Flows added without it write nothing.

A follower (:class:`Follow`, driven by :meth:`EchoMQ.iter_results
<echomq_core.EchoMQ.iter_results>` and its asyncio twin) alternates two calls:

* ``log_read`` (lua/log_read.lua): the entries after the cursor, the completed children's
  values and the parent's state, in one atomic read. A released parent with no entry after the
  cursor has nothing more to give: the step that released it logged the child that did;
* while the parent is held and the log has nothing new: one ``XREAD BLOCK`` on the log for at
  most ``block`` seconds (bounded, so a follower whose client closes, or whose flow is
  cancelled - a cancel logs nothing - returns within that bound). It wakes on the next entry.
  A follow with a ``timeout`` raises :class:`FlowTimeout` when it would wait past it (the
  results before are all handed out; the cursor resumes after them).

Only completed children are yielded (``(child id, value)``, as the Airflow hook's
``iter_results``); a child that died under ignore-dependency, or within a success threshold,
advances the cursor without a value. A failed parent raises :class:`ParentFailed`, a cancelled
one :class:`FlowCancelled`, at the first read that sees it.

The cursor is ``<tag>:<entry id>``: the tag is a digest of the flow's queue and id, so a cursor
of another flow is refused (:class:`InvalidArgument`) instead of skipping or repeating. After
each yielded item the follower's ``cursor`` names that item: a caller that stores it once the
item is handled and passes it back after a crash resumes with the next item, nothing skipped
or repeated (entry ids are the stream's: strictly increasing, kept with the stream).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..checks import check_int, check_seconds
from ..checks import text as _s
from ..errors import FlowTimeout, InvalidArgument, flow_error
from ..models import Serializer
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace, check_job_id, check_queue
from .reads import not_found, pairs

#: Entries one ``log_read`` returns at most (the script's HMGET unpacks that many ids).
MAX_PAGE = 1000
_START = "0-0"
_CURSOR = re.compile(r"^([0-9a-f]{8}):(\d{1,20}-\d{1,20})$")


def tag(queue: str, parent_id: str) -> str:
    """The flow's mark in its cursors."""
    return hashlib.blake2b(f"{queue}\n{parent_id}".encode(), digest_size=4).hexdigest()


def parse_cursor(queue: str, parent_id: str, cursor: str | None) -> str:
    """The log entry id a cursor names ('0-0' for None: from the start). InvalidArgument for a
    malformed cursor or one of another flow."""
    if cursor is None:
        return _START
    found = _CURSOR.match(cursor) if isinstance(cursor, str) else None
    if found is None:
        raise InvalidArgument(
            f"cursor must be a string as iter_results gives it ('<tag>:<ms>-<seq>'), "
            f"got {cursor!r:.80}"
        )
    if found.group(1) != tag(queue, parent_id):
        raise InvalidArgument(
            f"cursor {cursor!r} belongs to another flow, not {parent_id!r} in queue {queue!r}"
        )
    return found.group(2)


@dataclass(slots=True)
class Follow:
    """The state of one follower: where it is in the log, what it has read but not handed out.
    Its two operations are driven by the sync and the asyncio loop alike (see the module doc).
    """

    ks: Keyspace
    queue: str
    parent_id: str
    serializer: Serializer
    follow: bool = True
    block: float = 1.0
    page: int = 500
    at: str = _START  # the last entry consumed (the cursor's entry id)
    buffer: deque[tuple[str, str, bytes]] = field(default_factory=deque)
    last: str = _START  # the last entry of the pages read so far
    next: str = "more"  # what the loop does once the buffer is empty: more | wait | end
    timeout: float | None = None  # seconds the follow may wait for the release, in all
    deadline: float | None = None  # time.monotonic() when that runs out
    name: str = ""  # the queue as the caller named it (logical, when sharded): for errors

    @classmethod
    def start(
        cls,
        ks: Keyspace,
        queue: str,
        parent_id: str,
        serializer: Serializer,
        *,
        follow: Any,
        cursor: str | None,
        block: Any,
        page: Any,
        timeout: Any = None,
        name: str | None = None,
    ) -> Follow:
        check_queue(queue)
        check_job_id(parent_id)
        if not isinstance(follow, bool):
            raise InvalidArgument(f"follow must be True or False, got {follow!r}")
        if isinstance(block, bool) or not isinstance(block, int | float) or not 0.01 <= block <= 60:
            raise InvalidArgument(f"block must be a number of seconds in [0.01, 60], got {block!r}")
        bound = None if timeout is None else check_seconds("timeout", timeout, 0.0, 366 * 86400)
        at = parse_cursor(queue, parent_id, cursor)
        return cls(
            ks,
            queue,
            parent_id,
            serializer,
            follow,
            float(block),
            check_int("page", page, 1, MAX_PAGE),
            at,
            last=at,
            timeout=bound,
            deadline=None if bound is None else time.monotonic() + bound,
            name=queue if name is None else name,
        )

    @property
    def cursor(self) -> str:
        """Where a resumed follower starts: just after the last item handed out."""
        return f"{tag(self.queue, self.parent_id)}:{self.at}"

    def take(self) -> tuple[str, Any] | None:
        """The next buffered item (its entry becomes the cursor), or None when the buffer is
        empty (the cursor then moves past the entries that carried no value)."""
        if not self.buffer:
            self.at = self.last
            return None
        entry, child, raw = self.buffer.popleft()
        self.at = entry
        return child, self.serializer.loads(raw)

    def read(self) -> Op[str]:
        """One ``log_read`` after the last entry read: fills the buffer. Returns what to do next:
        'more' (entries were read), 'wait' (held, nothing new: block), 'end'. Raises for a
        failed or cancelled flow, a flow that is gone, a flow without a settle log."""
        row = self.ks.job(self.queue, self.parent_id)
        keys = [row, self.ks.settle_log(self.queue, self.parent_id)]
        keys.append(self.ks.processed(self.queue, self.parent_id))
        ((state, error, logged, flat),) = yield [
            Call.lua("log_read", keys, [self.last, self.page, self.parent_id])
        ]
        state = _s(state) if state else None
        if state is None:  # named as the caller named it, with the closest queues
            raise (yield from not_found(self.ks, self.name or self.queue, self.parent_id))
        if not logged:
            raise InvalidArgument(
                f"flow {self.parent_id} in queue {self.queue!r} keeps no settle log: add it with "
                "stream=True to follow it (children_values reads any flow once released)"
            )
        if state in ("failed", "cancelled"):
            (failed,) = yield [Call.cmd("HGETALL", self.ks.failed(self.queue, self.parent_id))]
            errors = {k: _s(v) for k, v in pairs(failed).items()}
            raise flow_error(
                self.queue, self.parent_id, state, errors, _s(error) if error else None
            )
        for i in range(0, len(flat), 4):
            entry, kind, child, value = flat[i : i + 4]
            self.last = _s(entry)
            if _s(kind) == "c" and value is not None:
                self.buffer.append((self.last, _s(child), value))
        if len(flat) == 4 * self.page:
            return "more"  # a full page: more may follow at once
        if state == "held" and self.follow:
            return "wait"  # (an XREAD returns at once if an entry came since this read)
        return "end"  # every entry up to the release was in this atomic read

    def next_item(self) -> Op[tuple[str, Any] | None]:
        """The next ``(child id, value)``, reading (and blocking, when following) until there is
        one; None at the end: what both iterators hand out."""
        while True:
            item = self.take()
            if item is not None:
                return item
            if self.next == "end":
                return None
            if self.next == "wait":
                yield from self.wait()
            self.next = yield from self.read()

    def wait(self) -> Op[None]:
        """Block until the log has an entry after the last one read, or ``block`` passes (one
        XREAD: a wake-up only, the entries are read by :meth:`read`); no longer than the
        follow's timeout leaves, and :class:`FlowTimeout` once it has run out (the cursor
        still names the last item handed out: a new follow resumes there)."""
        seconds = self.block
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise FlowTimeout(
                    f"flow {self.parent_id} in queue {self.queue!r} not released within "
                    f"timeout={self.timeout:g}s of following its results (resume from the "
                    "iterator's cursor)"
                )
            seconds = min(seconds, left)
        log = self.ks.settle_log(self.queue, self.parent_id)
        ms = max(1, round(seconds * 1000))
        yield [Call.cmd("XREAD", "COUNT", 1, "BLOCK", ms, "STREAMS", log, self.last)]


class Results:
    """The iterator :meth:`EchoMQ.iter_results <echomq_core.EchoMQ.iter_results>` returns:
    ``(child id, value)`` in settle order; :attr:`cursor` names the last item handed out."""

    def __init__(self, perform: Callable[[Op[Any]], Any], follow: Follow) -> None:
        self._perform = perform
        self._follow = follow

    @property
    def cursor(self) -> str:
        return self._follow.cursor

    def check(self) -> Results:
        """Make the first read now instead of at the first ``next()``, so a flow that is gone,
        keeps no settle log, failed or was cancelled raises here: what an adapter wants before
        it hands the iterator to user code. Nothing is consumed; returns the iterator."""
        f = self._follow
        if f.next == "more" and not f.buffer:
            f.next = self._perform(f.read())
        return self

    def __iter__(self) -> Results:
        return self

    def __next__(self) -> tuple[str, Any]:
        item = self._perform(self._follow.next_item())
        if item is None:
            raise StopIteration
        return item  # type: ignore[no-any-return]


class AsyncResults:
    """The async iterator of :meth:`AsyncEchoMQ.iter_results
    <echomq_core.AsyncEchoMQ.iter_results>`: as :class:`Results`."""

    def __init__(self, perform: Callable[[Op[Any]], Awaitable[Any]], follow: Follow) -> None:
        self._perform = perform
        self._follow = follow

    @property
    def cursor(self) -> str:
        return self._follow.cursor

    async def check(self) -> AsyncResults:
        """As :meth:`Results.check`."""
        f = self._follow
        if f.next == "more" and not f.buffer:
            f.next = await self._perform(f.read())
        return self

    def __aiter__(self) -> AsyncResults:
        return self

    async def __anext__(self) -> tuple[str, Any]:
        item = await self._perform(self._follow.next_item())
        if item is None:
            raise StopAsyncIteration
        return item  # type: ignore[no-any-return]
