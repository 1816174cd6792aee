"""A handle on one queue on the synchronous client: :class:`Queue`.

Each method drives its :class:`~echomq_core.client.queue.QueueOps` operation (the keys,
arguments, checks and reply reading of every call, written once) on the client's connection;
:class:`~echomq_core.AsyncQueue` (:mod:`echomq_core.client.async_queue`) awaits the same ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar

from ..control.rates import Claimed
from ..errors import LeaseLost
from ..models import Job, JobInfo, Settlement
from ..queues import adding
from ..wire.calls import Op
from .queue import DEAD, FailedAttempt, OpsClient, QueueOps
from .specs import JobSpec

T = TypeVar("T")


class QueueClient(OpsClient, Protocol):
    """What a :class:`Queue` needs of its client (:class:`~echomq_core.EchoMQ` is one): the
    operations' needs and a synchronous driver."""

    def perform(self, op: Op[T]) -> T: ...


class Queue(QueueOps):
    """A handle on one queue, on a synchronous client (:meth:`EchoMQ.queue
    <echomq_core.EchoMQ.queue>`): each method drives its :class:`QueueOps` operation on the
    client's connection. Options as :class:`QueueOps`."""

    client: QueueClient

    def add(
        self,
        payload: Any = None,
        *,
        job_id: str | None = None,
        delay: float = 0.0,
        priority: int = 0,
        max_attempts: int | None = None,
        timeout: float | None = None,
        group: str | None = None,
    ) -> str:
        """Add one job; returns its id. Re-adding an existing id changes nothing. ``group``:
        its fairness group (:attr:`JobSpec.group`)."""
        spec = JobSpec(payload, job_id, delay, priority, max_attempts, timeout, group)
        return self.add_bulk([spec])[0]

    def add_bulk(self, jobs: Iterable[Any]) -> list[str]:
        """Add many jobs in one round trip. Items are payloads or :class:`JobSpec`."""
        with adding.gc_paused(jobs):
            return self.client.perform(self.add_bulk_op(jobs))

    def claim(
        self,
        count: int = 1,
        *,
        lease: float | None = None,
        promote: int = 100,
        ahead: bool = False,
    ) -> Claimed:
        """Lease up to ``count`` jobs (lowest priority score first), within the queue's rate
        limit (:meth:`EchoMQ.set_rate_limit <echomq_core.EchoMQ.set_rate_limit>`): a list of
        jobs whose ``opens_in`` is the seconds until the limit lets the next start through when
        none more may start now, else 0.0. Two round trips; ``ahead``: see :meth:`claim_op`."""
        return self.client.perform(self.claim_op(count, lease=lease, promote=promote, ahead=ahead))

    def complete(self, job: Job, result: Any = None) -> None:
        """Complete one job; raises :class:`LeaseLost` if its lease is no longer current."""
        if not self.complete_many([(job, result)])[0]:
            raise LeaseLost(f"job {job.id} in {self.name!r}: the lease is no longer current")

    def complete_many(self, done: Sequence[tuple[Job, Any]]) -> list[bool]:
        """Complete many jobs in one round trip; False where the lease was lost. A result that
        cannot be serialised raises :class:`InvalidPayload` before anything is sent."""
        return [bool(s) for s in self.settle_completed(self.encode_results(done)).statuses]

    def settle_completed(self, encoded: Sequence[tuple[Job, bytes]]) -> Settlement:
        """:meth:`QueueOps.settle_completed_op`, run (nothing to complete sends nothing)."""
        if not encoded:
            return Settlement([])
        return self.client.perform(self.settle_completed_op(encoded))

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
        """:meth:`QueueOps.settle_failed_op`, run: the statuses and the parents released or
        failed (nothing to fail sends nothing)."""
        if not failed:
            return Settlement([])
        return self.client.perform(self.settle_failed_op(failed))

    def heartbeat(self, jobs: Sequence[Job], *, lease: float | None = None) -> list[bool]:
        """Extend the leases of ``jobs``; False where a lease was already lost."""
        op = self.heartbeat_op(jobs, lease=lease)  # checks the lease, also when jobs is empty
        if not jobs:
            return []
        return self.client.perform(op)

    def release(self, jobs: Sequence[Job]) -> list[bool]:
        """:meth:`QueueOps.release_op`, run (nothing to give back sends nothing)."""
        if not jobs:
            return []
        return self.client.perform(self.release_op(jobs))

    def retry_dead(self, job_ids: Sequence[str]) -> tuple[int, list[str]]:
        """:meth:`QueueOps.retry_dead_op`, run."""
        return self.client.perform(self.retry_dead_op(job_ids))

    def cancel(self, job_ids: Sequence[str], *, reason: str = "") -> tuple[int, list[str]]:
        """:meth:`QueueOps.cancel_op`, run."""
        return self.client.perform(self.cancel_op(job_ids, reason=reason))

    # -- reads ----------------------------------------------------------------------------
    def get_job(self, job_id: str) -> JobInfo:
        """Where one job stands and what it holds; :class:`JobNotFound` if there is none."""
        return self.client.perform(self.get_job_op(job_id))

    def stats(self) -> dict[str, int]:
        """Counts: pending, active, delayed, dead, completed, outbox, poison."""
        return self.client.perform(self.stats_op())
