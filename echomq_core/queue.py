"""One queue's lifecycle: add, claim, complete, fail, heartbeat, inspect.

``pending -> active (leased, with a token) -> completed | retry (delayed) | dead``. Only the
holder of a job's current lease token may complete, fail or extend it; an expired lease
returns the job to pending (at-least-once execution), and a stale completion is refused and
changes nothing. Every call takes batches: a batch costs one round trip, not one per job.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from . import ops
from .calls import Op
from .checks import (
    MAX_ATTEMPTS,
    MAX_DELAY,
    MAX_LEASE,
    check_int,
    check_seconds,
    timeout_ms,
)
from .errors import InvalidArgument, JobNotFound, LeaseLost
from .keyspace import Keyspace, check_job_id, check_queue
from .models import Backoff, Job, JobInfo, Serializer, Settlement, cut_traceback

T = TypeVar("T")


class QueueClient(Protocol):
    """What a :class:`Queue` needs of its client (:class:`~echomq_core.EchoMQ` is one): the
    queue module depends on this, not on the client module, so the two never import each
    other."""

    keys: Keyspace
    serializer: Serializer

    def encode(self, value: Any) -> bytes: ...

    def perform(self, op: Op[T]) -> T: ...

    def unregistered(self, names: Iterable[str]) -> list[str]: ...

    def mark_registered(self, names: Iterable[str]) -> None: ...


DEAD, RETRY = 2, 1
#: A failed attempt as :meth:`Queue.fail_many` takes it: (job, error, retry?) or with the
#: attempt's traceback as a fourth item.
FailedAttempt = tuple[Job, str, bool] | tuple[Job, str, bool, str | None]


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job for :meth:`Queue.add_bulk` when per-job options are needed."""

    payload: Any = None
    id: str | None = None
    delay: float = 0.0
    priority: int = 0
    max_attempts: int | None = None
    timeout: float | None = None  # the handler's time limit (s); None: the queue's


class Queue:
    """A handle on one queue. Cheap to make; holds options, not connections.

    Options (each refused by name when out of range):

    * ``max_attempts`` (3): attempts before a failing job dies; a child's death then settles
      its parent by the child's policy.
    * ``backoff`` (:class:`Backoff` 1 s doubling, capped at 300 s, jittered): delay between
      attempts.
    * ``lease`` (30 s): how long a claim holds a job before it may be recovered; workers
      heartbeat long jobs.
    * ``keep_completed`` (True): a finished plain job keeps its row with its result until
      deleted; False deletes it on completion (flow children never copy their result into
      their row: it lives in the parent's ``:processed``; a flow parent's row always stays
      until its flow is swept, so its reads and a retry by id of the finished flow still find
      it).
    * ``timeout`` (None): the longest a handler may run a job of this queue, in seconds; a job's
      own ``timeout`` (``JobSpec``, ``Child``) wins. Past it the worker stops extending the
      lease, records a failed attempt (``TimeoutError``) and frees the slot.
    """

    def __init__(
        self,
        client: QueueClient,
        name: str,
        *,
        max_attempts: int = 3,
        backoff: Backoff | None = None,
        lease: float = 30.0,
        keep_completed: bool = True,
        timeout: float | None = None,
    ) -> None:
        self.client = client
        self.name = check_queue(name)
        self.max_attempts = check_int("max_attempts", max_attempts, 1, MAX_ATTEMPTS)
        self.backoff = backoff if backoff is not None else Backoff()
        if not isinstance(self.backoff, Backoff):
            raise InvalidArgument("backoff must be an echomq_core.Backoff")
        self.lease_ms = int(check_seconds("lease", lease, 0.01, MAX_LEASE) * 1000)
        self.keep_completed = bool(keep_completed)
        self.timeout_ms = timeout_ms("timeout", timeout)

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    # -- add ------------------------------------------------------------------------------
    def add(
        self,
        payload: Any = None,
        *,
        job_id: str | None = None,
        delay: float = 0.0,
        priority: int = 0,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> str:
        """Add one job; returns its id. Re-adding an existing id changes nothing."""
        spec = JobSpec(payload, job_id, delay, priority, max_attempts, timeout)
        return self.add_bulk([spec])[0]

    def add_bulk(self, jobs: Iterable[Any]) -> list[str]:
        """Add many jobs in one round trip. Items are payloads or :class:`JobSpec`."""
        if isinstance(jobs, str | bytes) or not isinstance(jobs, Iterable):
            raise InvalidArgument(f"add_bulk takes an iterable of jobs, got {type(jobs).__name__}")
        with ops.gc_paused(jobs):
            return self._add_bulk(jobs)

    def _add_bulk(self, jobs: Iterable[Any]) -> list[str]:
        rows: list[tuple[str, bytes, int, int, int, int | None]] = []
        check = False
        encode, attempts_default = self.client.encode, self.max_attempts
        # generated ids: one random 96-bit stem per call and the item's index - unique like
        # an uuid4 per job, at a fraction of the cost of a bulk add, and shorter
        stem = f"JOB-{secrets.token_hex(12)}-"
        for index, item in enumerate(jobs):
            if not isinstance(item, JobSpec):  # a bare payload: every option is the default
                rows.append((f"{stem}{index:x}", encode(item), attempts_default, 0, 0, None))
                continue
            spec = item
            if spec.id is None:
                job_id = f"{stem}{index:x}"
            else:
                job_id, check = check_job_id(spec.id), True
            delay_ms = int(check_seconds("delay", spec.delay, 0.0, MAX_DELAY) * 1000)
            priority = check_int("priority", spec.priority, 0, 800)
            attempts = check_int(
                "max_attempts",
                self.max_attempts if spec.max_attempts is None else spec.max_attempts,
                1,
                MAX_ATTEMPTS,
            )
            limit = timeout_ms("timeout", spec.timeout)
            rows.append((job_id, encode(spec.payload), attempts, delay_ms, priority, limit))
        if check and len({r[0] for r in rows}) != len(rows):  # generated ids never collide
            raise InvalidArgument("duplicate job ids in one add_bulk call")
        if rows:
            new = self.client.unregistered([self.name])
            add = ops.add(self.client.keys, self.name, rows, check=check, new_queues=new)
            self.client.perform(add)
            self.client.mark_registered(new)
        return [r[0] for r in rows]

    # -- claim ----------------------------------------------------------------------------
    def claim(self, count: int = 1, *, lease: float | None = None, promote: int = 100) -> list[Job]:
        """Lease up to ``count`` jobs (lowest priority score first). Two round trips."""
        return self.client.perform(self.claim_op(count, lease=lease, promote=promote))

    def claim_op(
        self, count: int = 1, *, lease: float | None = None, promote: int = 100
    ) -> Op[list[Job]]:
        """The operation :meth:`claim` runs (the asyncio worker drives the same one)."""
        check_int("count", count, 1, 10_000)
        lease_ms = (
            self.lease_ms
            if lease is None
            else int(check_seconds("lease", lease, 0.01, MAX_LEASE) * 1000)
        )
        return ops.claim(
            self.client.keys,
            self.name,
            count,
            lease_ms,
            uuid.uuid4().hex,
            check_int("promote", promote, 0, 1000),
            self.client.serializer,
        )

    # -- settle ---------------------------------------------------------------------------
    def complete(self, job: Job, result: Any = None) -> None:
        """Complete one job; raises :class:`LeaseLost` if its lease is no longer current."""
        if not self.complete_many([(job, result)])[0]:
            raise LeaseLost(f"job {job.id} in {self.name!r}: the lease is no longer current")

    def complete_many(self, done: Sequence[tuple[Job, Any]]) -> list[bool]:
        """Complete many jobs in one round trip; False where the lease was lost. A result that
        cannot be serialised raises :class:`InvalidPayload` before anything is sent."""
        encoded = [(self._own(job), self.client.encode(result)) for job, result in done]
        return [bool(s) for s in self.settle_completed(encoded).statuses]

    def settle_completed(self, encoded: Sequence[tuple[Job, bytes]]) -> Settlement:
        """Complete jobs whose results are already serialised; the statuses, and the parents
        the batch released or failed (the worker fires its hooks from them)."""
        if not encoded:
            return Settlement([])
        return self.client.perform(self.settle_completed_op(encoded))

    def settle_completed_op(self, encoded: Sequence[tuple[Job, bytes]]) -> Op[Settlement]:
        """The operation :meth:`settle_completed` runs (``encoded`` not empty)."""
        return ops.complete(self.client.keys, self.name, encoded, keep=self.keep_completed)

    def fail(
        self, job: Job, error: str, *, retry: bool = True, traceback: str | None = None
    ) -> bool:
        """Record a failed attempt; returns True if the job died. ``retry=False`` buries it
        now; ``traceback`` is kept on the row (the last attempt's, cut to its last
        :data:`MAX_TRACEBACK` bytes). Raises :class:`LeaseLost` if the lease is no longer
        current."""
        status = self.fail_many([(job, error, retry, traceback)])[0]
        if status == 0:
            raise LeaseLost(f"job {job.id} in {self.name!r}: the lease is no longer current")
        return status == DEAD

    def fail_many(self, failed: Sequence[FailedAttempt]) -> list[int]:
        """Fail many jobs in one round trip: ``(job, error, retry?)`` or ``(job, error, retry?,
        traceback)``. Per job: 0 lease lost, 1 retry scheduled, 2 dead."""
        return self.settle_failed(failed).statuses

    def settle_failed(self, failed: Sequence[FailedAttempt]) -> Settlement:
        """Fail jobs as :meth:`fail_many` takes them, the backoff chosen here; as
        :meth:`settle_completed`, the statuses and the parents released or failed."""
        if not failed:
            return Settlement([])
        return self.client.perform(self.settle_failed_op(failed))

    def settle_failed_op(self, failed: Sequence[FailedAttempt]) -> Op[Settlement]:
        """The operation :meth:`settle_failed` runs (``failed`` not empty): the backoff of
        each retried job is chosen here."""
        rows = []
        for job, error, retry, *trace in failed:
            self._own(job)
            delay = self.backoff.delay_ms(job.attempts + 1) if retry else -1
            tb = cut_traceback(trace[0] if trace else None)
            rows.append((job, str(error)[:10_000], tb, delay))
        return ops.fail(self.client.keys, self.name, rows)

    def heartbeat(self, jobs: Sequence[Job], *, lease: float | None = None) -> list[bool]:
        """Extend the leases of ``jobs``; False where a lease was already lost."""
        op = self.heartbeat_op(jobs, lease=lease)  # checks the lease, also when jobs is empty
        if not jobs:
            return []
        return self.client.perform(op)

    def heartbeat_op(self, jobs: Sequence[Job], *, lease: float | None = None) -> Op[list[bool]]:
        """The operation :meth:`heartbeat` runs (``jobs`` not empty)."""
        lease_ms = (
            self.lease_ms
            if lease is None
            else int(check_seconds("lease", lease, 0.01, MAX_LEASE) * 1000)
        )
        for job in jobs:
            self._own(job)
        return ops.heartbeat(self.client.keys, self.name, jobs, lease_ms)

    def release(self, jobs: Sequence[Job]) -> list[bool]:
        """Give leased ``jobs`` back untouched: to the front of pending, no attempt counted,
        idle workers woken (what a worker does with jobs it will not run when it stops).
        False where the lease was already lost."""
        if not jobs:
            return []
        return self.client.perform(self.release_op(jobs))

    def release_op(self, jobs: Sequence[Job]) -> Op[list[bool]]:
        """The operation :meth:`release` runs (``jobs`` not empty)."""
        for job in jobs:
            self._own(job)
        return ops.release(self.client.keys, self.name, jobs)

    def retry_dead(self, job_ids: Sequence[str]) -> tuple[int, list[str]]:
        """Give dead plain jobs fresh attempts and queue them again (behind what is pending);
        their payloads and settings stay. Returns how many were revived and the ids left as
        they were: not dead, or a flow's (repair the flow instead: ``EchoMQ.retry_flow``)."""
        if isinstance(job_ids, str | bytes):
            raise InvalidArgument("job_ids must be a list of job ids, not a string")
        ids = [check_job_id(i) for i in job_ids]
        if not ids:
            return 0, []
        return self.client.perform(ops.revive(self.client.keys, self.name, ids))

    # -- reads ----------------------------------------------------------------------------
    def get_job(self, job_id: str) -> JobInfo:
        """Where one job stands and what it holds; :class:`JobNotFound` if there is none."""
        info = self.client.perform(
            ops.inspect(self.client.keys, self.name, check_job_id(job_id), self.client.serializer)
        )
        if info is None:
            raise JobNotFound(f"no job {job_id!r} in queue {self.name!r}")
        return info

    def stats(self) -> dict[str, int]:
        """Counts: pending, active, delayed, dead, completed, outbox, poison."""
        return self.client.perform(ops.stats(self.client.keys, self.name))

    def _own(self, job: Job) -> Job:
        if not isinstance(job, Job):
            raise InvalidArgument(f"expected a claimed echomq_core.Job, got {type(job).__name__}")
        if job.queue != self.name:
            raise InvalidArgument(f"job {job.id} belongs to queue {job.queue!r}, not {self.name!r}")
        return job
