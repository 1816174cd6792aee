"""Waiting on a flow: what one read of it means, and when to read it again.

Every wait on a flow is the same loop - read the flow's snapshot (one atomic read,
:func:`echomq_core.flows.reads.snapshot`), decide, pause, read again - and six callers run it:
``EchoMQ.wait`` and ``AsyncEchoMQ.wait``, ``echomq flow show --watch``, the Airflow sensor and
waiting operator (``echomq_provider.waiting``), the Airflow trigger, and the Dagster IO manager
(``dagster_echomq.reading``). :class:`FlowWait` is the decision, written once and free of I/O;
each caller keeps only its I/O (a sync client, an asyncio one, Airflow's pokes) and how it
reports a verdict (its exception types, a ``TriggerEvent``, a Dagster ``Failure``).

Using::

    wait = FlowWait(queue, parent_id, poll=0.25, timeout=60)
    while not (verdict := mq.perform(wait.read(mq.keys))).done:
        time.sleep(verdict.pause)

or, with a snapshot read elsewhere, ``wait.judge(snap)``.

A :class:`Verdict`'s ``kind``:

=============  ===================================================================================
``released``   every child settled: the results are readable (a barrier flow not closed yet, or a
               worker-run parent: pending, running or completed)
``closed``     a released barrier flow that its reader closed: readable until its retention ends
``failed``     a fail-the-parent child died: the parent will never be released
``cancelled``  the flow was cancelled (``snap.error`` holds the reason): never released
``missing``    no such flow: a wrong id or prefix, not added yet, or expired. With ``missing_ok``
               (the default) the wait goes on - a flow may be added by another system after the
               wait starts; without it, the wait ends here
``waiting``    children outstanding: read again after ``pause`` seconds
``timed_out``  ``timeout`` seconds passed before the flow was released
``stalled``    for ``stall_timeout`` seconds no child settled and no job of the children's
               queues ran - usually no worker serves them; children that run long are not a stall
=============  ===================================================================================

The pause: the first is ``first`` (:data:`FIRST_POLL`, 5 ms), each next one half as long again
(:data:`GROWTH`), up to ``poll``: a flow that settles in milliseconds is seen in milliseconds,
one that takes hours costs one read per ``poll``. While children settle, a pause is also cut to
the time the rest should take at the rate seen since the previous read (never under
:data:`FAST_POLL`), so a release is read about when it happens; and the time left before the
timeout or the stall limit caps it, so those verdicts come on time.

Why a wait that may end for time reads more than the snapshot: a timed-out or stalled verdict
carries the stall hint (:func:`echomq_core.flows.failures.stall_reading`: an outbox nothing drains,
jobs pending that nothing claims), so the error can say what holds the flow up; and a stall
is called only when no child is running. :meth:`FlowWait.read` reads it (two round trips) only
on the read that would end the wait that way, never on the reads before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..checks import check_seconds
from ..errors import FlowTimeout
from ..models import FlowSnapshot
from ..wire.calls import Op
from ..wire.keyspace import Keyspace, check_job_id, check_queue
from .failures import Stall, stall_reading
from .reads import snapshot

WAITING = "waiting"
RELEASED = "released"
CLOSED = "closed"
FAILED = "failed"
CANCELLED = "cancelled"
MISSING = "missing"
TIMED_OUT = "timed_out"
STALLED = "stalled"

#: The first pause of a wait: a flow whose children settle in milliseconds is read again then.
FIRST_POLL = 0.005
#: Each pause is this much longer than the one before, up to the wait's ``poll``.
GROWTH = 1.5
#: The shortest pause the settle-rate estimate gives (a flow about to be released).
FAST_POLL = 0.05


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one read of a flow means to the wait: ``kind`` (see the module doc), the snapshot
    it judged, the seconds to pause before the next read (0 once ``done``), the seconds since
    the wait started, and for ``timed_out`` / ``stalled`` what holds the flow up ('' when
    nothing stands out)."""

    kind: str
    snap: FlowSnapshot
    pause: float = 0.0
    done: bool = False
    waited: float = 0.0
    hint: str = ""

    @property
    def ready(self) -> bool:
        """The results are readable: released, or released and closed."""
        return self.kind in (RELEASED, CLOSED)

    @property
    def never_released(self) -> bool:
        """The flow failed or was cancelled: waiting longer cannot help."""
        return self.kind in (FAILED, CANCELLED)

    @property
    def gave_up(self) -> bool:
        """The wait itself ended: timed out or stalled."""
        return self.kind in (TIMED_OUT, STALLED)

    def timeout_error(self, timeout: float) -> FlowTimeout:
        """The error of a wait that gave up after ``timeout`` seconds, naming what holds the
        flow up where the stall reading showed it (``hint``). One text for every caller that
        reports a timeout as an exception (``EchoMQ.wait``, ``echomq flow show --watch``), so
        they say the same."""
        snap, why = self.snap, f": {self.hint}" if self.hint else ""
        return FlowTimeout(
            f"flow {snap.parent_id} in {snap.queue!r} not released after {timeout}s "
            f"({snap.dependencies} outstanding){why}"
        )


def kind_of(snap: FlowSnapshot) -> str:
    """The flow's own state as a verdict kind (what no wait's clock changes)."""
    outcome = snap.outcome
    if outcome == RELEASED and snap.parent_state == CLOSED:
        return CLOSED
    return outcome


class FlowWait:
    """One wait on the flow ``parent_id`` in ``queue``: hand it each snapshot in turn
    (:meth:`judge`, or :meth:`read` to have it read them); it returns the :class:`Verdict`.

    :param poll: the longest pause between two reads, seconds.
    :param timeout: seconds after which the wait ends ``timed_out`` (None: never).
    :param stall_timeout: seconds without a child settling (and none running) after which the
        wait ends ``stalled`` (None: no stall limit).
    :param first: the first pause (:data:`FIRST_POLL`; at most ``poll``). A caller whose first
        read comes late anyway (a trigger, after the task's own read and a deferral) passes
        ``poll``.
    :param missing_ok: a missing flow is waited for (True, the default) or ends the wait.

    Raises :class:`~echomq_core.InvalidQueueName` / :class:`~echomq_core.InvalidJobId` and
    :class:`~echomq_core.InvalidArgument` (naming the option) before anything is read. The clock
    starts when it is made. Not thread-safe: one wait, one caller.
    """

    def __init__(
        self,
        queue: str,
        parent_id: str,
        *,
        poll: float,
        timeout: float | None = None,
        stall_timeout: float | None = None,
        first: float = FIRST_POLL,
        missing_ok: bool = True,
    ) -> None:
        self.queue = check_queue(queue)
        self.parent_id = check_job_id(parent_id)
        self.poll = check_seconds("poll", poll, 0.001)
        self.timeout = None if timeout is None else check_seconds("timeout", timeout)
        self.stall_timeout = (
            None if stall_timeout is None else check_seconds("stall_timeout", stall_timeout)
        )
        self.missing_ok = bool(missing_ok)
        self.started = time.monotonic()
        self._step = min(check_seconds("first", first), self.poll)
        self._moves = -1  # settled + failed children at the last read that saw them change
        self._moved = self.started  # when that was
        self._last: tuple[float, int] | None = None  # (time, settled) of the last read

    def left(self) -> float | None:
        """Seconds before the wait times out (None: no timeout), at least 0."""
        if self.timeout is None:
            return None
        return max(0.0, self.started + self.timeout - time.monotonic())

    def read(self, ks: Keyspace) -> Op[Verdict]:
        """Read the snapshot and judge it - plus the stall reading, on the read that would
        end the wait for time - as one operation for either driver (``client.perform``,
        ``await async_client.perform``)."""
        snap = yield from snapshot(ks, self.queue, self.parent_id)
        now = time.monotonic()
        stall = None
        if self.ends_for_time(snap, now):
            stall = yield from stall_reading(ks, self.queue, self.parent_id)
        return self.judge(snap, stall, now=now)

    def ends_for_time(self, snap: FlowSnapshot, now: float | None = None) -> bool:
        """Whether judging ``snap`` now would end the wait timed out or stalled: then
        :meth:`judge` wants the stall reading (whether children run, and the hint)."""
        if not self._goes_on(snap):
            return False
        now = time.monotonic() if now is None else now
        if self.timeout is not None and now - self.started >= self.timeout:
            return True
        return self._stall_due(snap, now)

    def judge(
        self, snap: FlowSnapshot, stall: Stall | None = None, *, now: float | None = None
    ) -> Verdict:
        """The verdict on ``snap``, the flow read now. ``stall``: the flow's
        :func:`~echomq_core.flows.failures.stall_reading`, when :meth:`ends_for_time` asked for it;
        without it a stall is called as if nothing ran, and the hint is ''."""
        now = time.monotonic() if now is None else now
        waited = now - self.started
        kind = kind_of(snap)
        if not self._goes_on(snap):
            return Verdict(kind, snap, 0.0, True, waited)
        hint = stall.hint if stall is not None else ""
        if self._stall_due(snap, now):
            if stall is not None and stall.busy:
                self._moved = now  # children are running (long ones): not a stall
            else:
                return Verdict(STALLED, snap, 0.0, True, waited, hint)
        moves = snap.settled + snap.failed
        if moves != self._moves:
            self._moves, self._moved = moves, now
        if self.timeout is not None and waited >= self.timeout:
            return Verdict(TIMED_OUT, snap, 0.0, True, waited, hint)
        return Verdict(kind, snap, self._pause(snap, now), False, waited)

    def _goes_on(self, snap: FlowSnapshot) -> bool:
        kind = kind_of(snap)
        return kind == WAITING or (kind == MISSING and self.missing_ok)

    def _stall_due(self, snap: FlowSnapshot, now: float) -> bool:
        if self.stall_timeout is None or snap.settled + snap.failed != self._moves:
            return False  # no limit, or a child settled since the last read: progress
        return now - self._moved >= self.stall_timeout

    def _pause(self, snap: FlowSnapshot, now: float) -> float:
        pause = self._step
        self._step = min(self._step * GROWTH, self.poll)
        settled = snap.total - snap.dependencies  # every settled child, tolerated deaths too
        if self._last is not None:
            then, before = self._last
            if settled > before and now > then:
                rate = (settled - before) / (now - then)
                pause = min(pause, max(FAST_POLL, snap.dependencies / rate))
        self._last = (now, settled)
        if self.timeout is not None:
            pause = min(pause, self.started + self.timeout - now)
        if self.stall_timeout is not None:
            pause = min(pause, self._moved + self.stall_timeout - now)
        return max(0.0, pause)
