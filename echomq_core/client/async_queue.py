"""One queue on the asyncio client: :class:`AsyncQueue`, the async twin of
:class:`~echomq_core.Queue`.

Both are :class:`~echomq_core.client.queue.QueueOps`: the keys, arguments, checks and reply reading
of every call exist once, as operations, and the two classes only choose the driver (the
sync connection's ``perform`` or the asyncio one's ``await perform``). So an add, a claim or
a read costs the same commands from either client, and the asyncio worker drives the same
operations through these queues.
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


class AsyncQueueClient(OpsClient, Protocol):
    """What an :class:`AsyncQueue` needs of its client (:class:`~echomq_core.AsyncEchoMQ`)."""

    async def perform(self, op: Op[T]) -> T: ...


class AsyncQueue(QueueOps):
    """A handle on one queue, on an asyncio client (:meth:`AsyncEchoMQ.queue
    <echomq_core.AsyncEchoMQ.queue>`); each method is its :class:`~echomq_core.Queue`
    namesake, awaited. Options as :class:`~echomq_core.client.queue.QueueOps`."""

    client: AsyncQueueClient

    async def add(
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
        return (await self.add_bulk([spec]))[0]

    async def add_bulk(self, jobs: Iterable[Any]) -> list[str]:
        """Add many jobs in one round trip. Items are payloads or :class:`JobSpec`."""
        with adding.gc_paused(jobs):
            # the building only: a pause across the await would hold for the loop's other tasks
            op = self.add_bulk_op(jobs)
        return await self.client.perform(op)

    async def claim(
        self,
        count: int = 1,
        *,
        lease: float | None = None,
        promote: int = 100,
        ahead: bool = False,
    ) -> Claimed:
        """Lease up to ``count`` jobs within the queue's rate limit; as
        :meth:`Queue.claim <echomq_core.Queue.claim>` (``ahead`` included). Two round trips."""
        return await self.client.perform(
            self.claim_op(count, lease=lease, promote=promote, ahead=ahead)
        )

    async def complete(self, job: Job, result: Any = None) -> None:
        """Complete one job; raises :class:`LeaseLost` if its lease is no longer current."""
        if not (await self.complete_many([(job, result)]))[0]:
            raise LeaseLost(f"job {job.id} in {self.name!r}: the lease is no longer current")

    async def complete_many(self, done: Sequence[tuple[Job, Any]]) -> list[bool]:
        """Complete many jobs in one round trip; False where the lease was lost."""
        settled = await self.settle_completed(self.encode_results(done))
        return [bool(s) for s in settled.statuses]

    async def settle_completed(self, encoded: Sequence[tuple[Job, bytes]]) -> Settlement:
        if not encoded:
            return Settlement([])
        return await self.client.perform(self.settle_completed_op(encoded))

    async def fail(
        self, job: Job, error: str, *, retry: bool = True, traceback: str | None = None
    ) -> bool:
        """Record a failed attempt; True if the job died. :class:`LeaseLost` if the lease is
        no longer current."""
        status = (await self.fail_many([(job, error, retry, traceback)]))[0]
        if status == 0:
            raise LeaseLost(f"job {job.id} in {self.name!r}: the lease is no longer current")
        return status == DEAD

    async def fail_many(self, failed: Sequence[FailedAttempt]) -> list[int]:
        """Per job: 0 lease lost, 1 retry scheduled, 2 dead."""
        return (await self.settle_failed(failed)).statuses

    async def settle_failed(self, failed: Sequence[FailedAttempt]) -> Settlement:
        if not failed:
            return Settlement([])
        return await self.client.perform(self.settle_failed_op(failed))

    async def heartbeat(self, jobs: Sequence[Job], *, lease: float | None = None) -> list[bool]:
        """Extend the leases of ``jobs``; False where a lease was already lost."""
        op = self.heartbeat_op(jobs, lease=lease)  # checks the lease, also when jobs is empty
        if not jobs:
            return []
        return await self.client.perform(op)

    async def release(self, jobs: Sequence[Job]) -> list[bool]:
        if not jobs:
            return []
        return await self.client.perform(self.release_op(jobs))

    async def retry_dead(self, job_ids: Sequence[str]) -> tuple[int, list[str]]:
        return await self.client.perform(self.retry_dead_op(job_ids))

    async def cancel(self, job_ids: Sequence[str], *, reason: str = "") -> tuple[int, list[str]]:
        return await self.client.perform(self.cancel_op(job_ids, reason=reason))

    async def get_job(self, job_id: str) -> JobInfo:
        """Where one job stands and what it holds; :class:`JobNotFound` if there is none."""
        return await self.client.perform(self.get_job_op(job_id))

    async def stats(self) -> dict[str, int]:
        """Counts: pending, active, delayed, dead, completed, outbox, poison."""
        return await self.client.perform(self.stats_op())
