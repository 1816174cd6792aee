"""One queue's lifecycle, as operations: add, claim, complete, fail, heartbeat, inspect.

``pending -> active (leased, with a token) -> completed | retry (delayed) | dead``. Only the
holder of a job's current lease token may complete, fail or extend it; an expired lease
returns the job to pending (at-least-once execution), and a stale completion is refused and
changes nothing. Every call takes batches: a batch costs one round trip, not one per job.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ..checks import (
    MAX_ATTEMPTS,
    MAX_LEASE,
    check_int,
    check_seconds,
    timeout_ms,
)
from ..control.groups import Rules, group_of
from ..control.rates import Claimed
from ..errors import InvalidArgument, JobNotFound
from ..flows import sharding, spawning
from ..models import Backoff, Job, JobInfo, Serializer, Settlement, cut_traceback
from ..queues import adding, claiming, maintenance, reads, settling
from ..queues.registry import lease_token
from ..wire.calls import Op
from ..wire.keyspace import Keyspace, check_job_id, check_queue
from .specs import GIVEN, rows_of


class OpsClient(Protocol):
    """What building a queue's operations needs of a client, sync or asyncio: the queue module
    depends on this, not on the client module, so the two never import each other."""

    keys: Keyspace
    serializer: Serializer
    shard_cache: dict[str, sharding.Shards]
    group_rules: Rules

    def encode(self, value: Any) -> bytes: ...

    def unregistered(self, names: Iterable[str]) -> list[str]: ...

    def mark_registered(self, names: Iterable[str]) -> None: ...


DEAD, RETRY = 2, 1
#: A failed attempt as :meth:`Queue.fail_many` takes it: (job, error, retry?) or with the
#: attempt's traceback as a fourth item.
FailedAttempt = tuple[Job, str, bool] | tuple[Job, str, bool, str | None]


class QueueOps:
    """One queue's options and the operations of its calls, built once for either client:
    :class:`Queue` drives them on the sync connection, :class:`~echomq_core.AsyncQueue` on the
    asyncio one, and both workers drive them on their own. Every argument is checked when an
    operation is built, before anything is sent. Cheap to make; holds options, not
    connections.

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
        client: OpsClient,
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
        #: the registry id of the worker that claims through this handle ('' for none): its
        #: lease tokens name it (:func:`~echomq_core.queues.registry.lease_token`)
        self.holder = ""
        self._turn = -1  # the shard a sharded queue's last claim tried first
        #: True for a worker's handle on one physical queue (shard 0 of a sharded queue has
        #: the logical name): it claims from that shard alone, the worker rotates the shards
        self.physical = False
        #: the logical queue a physical handle's jobs are shown under (``job.queue``)
        self.logical = self.name
        #: the ids (and their lease token) that a claim with ``ahead`` leased for the next
        #: one, their rows not read yet (:meth:`claim_op`)
        self.ahead: tuple[list[str], str] | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # -- the operations -------------------------------------------------------------------
    def add_bulk_op(self, jobs: Iterable[Any]) -> Op[list[str]]:
        """The operation of an add of ``jobs`` (payloads or :class:`JobSpec`), in one round
        trip; returns their ids. The rows are checked and serialised here, before anything
        is sent (the caller pauses the collector around it,
        :func:`~echomq_core.queues.adding.gc_paused`); the queue rides along into the registry with
        the first add that lands."""
        if isinstance(jobs, str | bytes) or not isinstance(jobs, Iterable):
            raise InvalidArgument(f"add_bulk takes an iterable of jobs, got {type(jobs).__name__}")
        # generated ids: one random 96-bit stem per call and the item's index - unique like
        # an uuid4 per job, at a fraction of the cost of a bulk add, and shorter
        stem = f"JOB-{secrets.token_hex(12)}-"
        rows, loose, check = rows_of(jobs, self.client.encode, self.max_attempts, stem)
        if check and len({r[0] for r in rows}) != len(rows):  # generated ids never collide
            raise InvalidArgument("duplicate job ids in one add_bulk call")
        # every id generated (none given): the add sends the stem, not an id per job (adding.add)
        return self._add(rows, check, None if check else stem, loose)

    def _add(
        self,
        rows: list[adding.Row],
        check: bool,
        stem: str | None = None,
        loose: Sequence[Any] = (),
    ) -> Op[list[str]]:
        if not rows:  # nothing to add sends nothing
            return []
        c = self.client
        places, rules = yield from sharding.resolve_for_add(
            c.keys, c.shard_cache, c.group_rules, [self.name]
        )
        shards, rule = places[self.name], rules.get(self.name)
        if rule is not None:  # the queue names groups from payloads (control.groups)
            good: set[str] = set()
            for i, payload in enumerate(loose):
                if payload is not GIVEN and (group := group_of(payload, rule, good)) is not None:
                    rows[i] = (*rows[i][:6], group)
        parts: dict[str, list[adding.Row]] = {}
        if len(shards) == 1:
            parts[self.name] = rows
        else:  # each shard's part in one call, all of them in one step
            for row in rows:
                parts.setdefault(sharding.shard_of(shards, row[0]), []).append(row)
        new = self.client.unregistered(parts)
        adds = [
            adding.add(
                self.client.keys, q, part, check=check, new_queues=new if i == 0 else (), stem=stem
            )
            for i, (q, part) in enumerate(parts.items())
        ]
        # a rule read long ago is read again in the same step (control.groups.Rules)
        yield from sharding.together([*adds, c.group_rules.refresh(c.keys, [self.name])])
        self.client.mark_registered(new)
        return [r[0] for r in rows]

    def _shards(self) -> Op[sharding.Shards]:
        """This queue's shards: from the client's cache, else one read (once per process)."""
        c = self.client
        if self.name in c.shard_cache:
            return c.shard_cache[self.name]
        # the group rule rides along (see EchoMQ's shards read)
        op = sharding.resolve_for_add(c.keys, c.shard_cache, c.group_rules, [self.name])
        return (yield from op)[0][self.name]

    def claim_op(
        self,
        count: int = 1,
        *,
        lease: float | None = None,
        promote: int = 100,
        ahead: bool = False,
    ) -> Op[Claimed]:
        """Lease up to ``count`` jobs (lowest priority score first), within the queue's rate
        limit: fewer, or none, when fewer may start now (then the reply's ``opens_in`` says
        when to ask again). Two round trips.

        ``ahead`` (a worker's fetcher, while its handlers are fast): a full claim also leases
        the next ``count`` jobs, in the round trip that reads this one's rows, and holds their
        ids in :attr:`ahead` unread; the next call returns them (as many as were leased then),
        with ``ahead`` leasing the next batch in the same round trip again - one round trip
        per batch instead of two. No claim is made ahead of a short one (the backlog ran dry)
        or of one the rate limit cut short, nor on a sharded queue's logical handle. Held leases are
        not extended: the caller calls again at once, with ``ahead=False`` before it waits or
        stops or while the limit holds starts back (that call returns the held jobs and claims
        nothing more). A call that fails drops what it held: those leases expire."""
        check_int("count", count, 1, 10_000)
        lease_ms = (
            self.lease_ms
            if lease is None
            else int(check_seconds("lease", lease, 0.01, MAX_LEASE) * 1000)
        )
        return self._claim(count, lease_ms, check_int("promote", promote, 0, 1000), ahead)

    def _claim(self, count: int, lease_ms: int, promote: int, ahead: bool) -> Op[Claimed]:
        held, self.ahead = self.ahead, None
        if held is not None:
            more = count if ahead else 0
            claimed = yield from self._claim_on(self.name, held, more, lease_ms, promote)
            self.label(claimed)
            return claimed
        shards = (self.name,) if self.physical else (yield from self._shards())
        ks, token, claimed = self.client.keys, lease_token(self.holder), Claimed()
        # a sharded queue: shards in turn, the first tried rotating, so none starves
        self._turn = turn = (self._turn + 1) % len(shards)
        for step in range(len(shards)):
            shard = shards[(turn + step) % len(shards)]
            (reply,) = yield [claiming.claim_call(ks, shard, count, lease_ms, token, promote)]
            opens_in, ids = claiming.claimed_ids(reply)
            if not ids:
                claimed = Claimed([], opens_in)
                continue
            # a full claim of a queue of one slot claims ahead (not a sharded logical handle)
            full = len(ids) == count and not opens_in and len(shards) == 1
            more = count if ahead and full else 0
            claimed = yield from self._claim_on(shard, (ids, token), more, lease_ms, promote)
            claimed.opens_in = max(claimed.opens_in, opens_in)
            break
        self.label(claimed)
        return claimed

    def _claim_on(
        self, shard: str, held: tuple[list[str], str], count: int, lease_ms: int, promote: int
    ) -> Op[Claimed]:
        """The jobs of ``held`` (ids leased in ``shard``, their rows unread) and, when
        ``count``, the next claim of ``count`` in the same round trip
        (:func:`~echomq_core.queues.claiming.claim_ahead`), held in :attr:`ahead` (the window it
        found spent is in the reply's ``opens_in``)."""
        ks, ser = self.client.keys, self.client.serializer
        ids, token = held
        if not count:
            return Claimed((yield from claiming.leased(ks, shard, ids, token, ser)))
        after = lease_token(self.holder)
        jobs, opens_in, nxt = yield from claiming.claim_ahead(
            ks, shard, ids, token, count, lease_ms, after, promote, ser
        )
        if nxt:
            self.ahead = (nxt, after)
        return Claimed(jobs, opens_in)

    def label(self, jobs: Iterable[Job]) -> None:
        """Show ``jobs`` (leased from one of this queue's shards) under the logical name:
        ``job.queue`` is what handlers and hooks see, ``job.shard`` where they are settled."""
        for job in jobs:
            job.queue = self.logical

    def encode_results(self, done: Sequence[tuple[Job, Any]]) -> list[tuple[Job, bytes]]:
        """``(job, result)`` pairs with their results serialised: :class:`InvalidPayload`
        for one that cannot be, before anything is sent."""
        return [(self._own(job), self.client.encode(result)) for job, result in done]

    def settle_completed_op(
        self, encoded: Sequence[tuple[Job, bytes]], hand: settling.Hand | None = None
    ) -> Op[Settlement]:
        """Complete jobs whose results are already serialised (``encoded`` not empty); the
        statuses, and the parents the batch released or failed (the workers fire their hooks
        from them). ``hand``: a worker's hand-off (:class:`~echomq_core.queues.settling.Hand`). A
        job whose run spawned children of its own is not completed: its run ends waiting for them
        (:func:`~echomq_core.flows.spawning.await_children`; status 0 when its lease was gone, the
        server's answers in ``waits``). A job recorded now that ran before (a failed attempt,
        a lost lease) has what an earlier run of it counted and never landed settled as never
        landed, in one more round trip for them all (:func:`~echomq_core.flows.spawning.reconcile`;
        how many in ``voided``): a Worker's batch and :meth:`Queue.complete_many` alike."""
        if any(job.adopted for job, _ in encoded):
            settled = yield from self._settle_waiting(encoded, hand)
        else:
            settled = yield from self._complete(encoded, hand)
        again = [
            job
            for (job, _), status in zip(encoded, settled.statuses, strict=True)
            if status and (job.attempts or job.stalls)
        ]
        if again:
            settled.voided, events = yield from spawning.reconcile(self.client.keys, again)
            for event, node_queue, node_id in events:  # for the hooks, as the batch's own
                (settled.released if event == "r" else settled.failed).append((node_queue, node_id))
        return settled

    def _complete(
        self, encoded: Sequence[tuple[Job, bytes]], hand: settling.Hand | None
    ) -> Op[Settlement]:
        home = self._home([job for job, _ in encoded])
        return settling.complete(
            self.client.keys, home, encoded, keep=self.keep_completed, hand=hand
        )

    def _settle_waiting(
        self, encoded: Sequence[tuple[Job, bytes]], hand: settling.Hand | None
    ) -> Op[Settlement]:
        """:meth:`settle_completed_op` of a batch holding jobs that wait for their own
        children: those in one call, the rest completed as usual, statuses in batch order."""
        waiting = [job for job, _ in encoded if job.adopted]
        rest = [(job, raw) for job, raw in encoded if not job.adopted]
        replies = yield from spawning.await_children(self.client.keys, waiting)
        settled = Settlement([])
        if rest:
            settled = yield from self._complete(rest, hand)
        ended = iter([1 if reply else 0 for reply in replies])
        done = iter(settled.statuses)
        settled.statuses = [next(ended) if job.adopted else next(done) for job, _ in encoded]
        settled.waits = list(replies)
        return settled

    def settle_failed_op(
        self, failed: Sequence[FailedAttempt], hand: settling.Hand | None = None
    ) -> Op[Settlement]:
        """Fail jobs as :meth:`Queue.fail_many` takes them (``failed`` not empty): the backoff
        of each retried job is chosen here. ``hand`` as :meth:`settle_completed_op`."""
        rows = []
        home = self._home([item[0] for item in failed])
        for job, error, retry, *trace in failed:
            delay = self.backoff.delay_ms(job.attempts + 1) if retry else -1
            tb = cut_traceback(trace[0] if trace else None)
            rows.append((job, str(error)[:10_000], tb, delay))
        return settling.fail(self.client.keys, home, rows, hand=hand)

    def heartbeat_op(self, jobs: Sequence[Job], *, lease: float | None = None) -> Op[list[bool]]:
        """Extend the leases of ``jobs`` (not empty); False where a lease was already lost."""
        lease_ms = (
            self.lease_ms
            if lease is None
            else int(check_seconds("lease", lease, 0.01, MAX_LEASE) * 1000)
        )
        return settling.heartbeat(self.client.keys, self._home(jobs), jobs, lease_ms)

    def release_op(self, jobs: Sequence[Job]) -> Op[list[bool]]:
        """Give leased ``jobs`` (not empty) back untouched: to the front of pending, no
        attempt counted, idle workers woken (what a worker does with jobs it will not run when
        it stops). False where the lease was already lost."""
        return settling.release(self.client.keys, self._home(jobs), jobs)

    def retry_dead_op(self, job_ids: Sequence[str]) -> Op[tuple[int, list[str]]]:
        """Give dead plain jobs fresh attempts and queue them again (behind what is pending);
        their payloads and settings stay. Returns how many were revived and the ids left as
        they were: not dead, or a flow's (repair the flow instead: ``EchoMQ.retry_flow``)."""
        if isinstance(job_ids, str | bytes):
            raise InvalidArgument("job_ids must be a list of job ids, not a string")
        ids = [check_job_id(i) for i in job_ids]
        return self._revive(ids)

    def _revive(self, ids: list[str]) -> Op[tuple[int, list[str]]]:
        if not ids:  # nothing to revive sends nothing
            return 0, []
        parts = sharding.by_shard((yield from self._shards()), ids)
        done = yield from sharding.together(
            [maintenance.revive(self.client.keys, q, part) for q, part in parts.items()]
        )
        return _merged(done)

    def cancel_op(self, job_ids: Sequence[str], *, reason: str = "") -> Op[tuple[int, list[str]]]:
        """Cancel plain jobs that have not started (pending or delayed): each goes to the
        morgue with the error ``cancelled: <reason>``, where :meth:`retry_dead_op` can take it
        back. Returns how many were cancelled and the ids left as they were: leased, finished,
        dead, or a flow's (cancel the flow instead: ``EchoMQ.cancel_flow``)."""
        if isinstance(job_ids, str | bytes):
            raise InvalidArgument("job_ids must be a list of job ids, not a string")
        ids = [check_job_id(i) for i in job_ids]
        if not isinstance(reason, str) or len(reason) > 1000:
            raise InvalidArgument(
                f"reason must be a string of at most 1000 characters, got {reason!r:.80}"
            )
        return self._cancel(ids, reason)

    def _cancel(self, ids: list[str], reason: str) -> Op[tuple[int, list[str]]]:
        if not ids:
            return 0, []
        parts = sharding.by_shard((yield from self._shards()), ids)
        done = yield from sharding.together(
            [
                maintenance.cancel_jobs(self.client.keys, q, part, reason)
                for q, part in parts.items()
            ]
        )
        return _merged(done)

    def get_job_op(self, job_id: str) -> Op[JobInfo]:
        """Where one job stands and what it holds; :class:`JobNotFound` if there is none."""
        job_id = check_job_id(job_id)
        return self._get_job(job_id)

    def _get_job(self, job_id: str) -> Op[JobInfo]:
        shard = sharding.shard_of((yield from self._shards()), job_id)
        info = yield from reads.inspect(self.client.keys, shard, job_id, self.client.serializer)
        if info is None:
            raise JobNotFound(f"no job {job_id!r} in queue {self.name!r}")
        return info

    def stats_op(self) -> Op[dict[str, int]]:
        """Counts: pending, active, delayed, dead, completed, outbox, poison (summed over the
        shards of a sharded queue, read in one step)."""
        return self._stats()

    def _stats(self) -> Op[dict[str, int]]:
        shards = yield from self._shards()
        if len(shards) == 1:
            return (yield from reads.stats(self.client.keys, self.name))
        parts = yield from sharding.together([reads.stats(self.client.keys, q) for q in shards])
        total: dict[str, int] = {}
        for part in parts:
            for name, value in part.items():
                total[name] = total.get(name, 0) + value
        return total

    def _own(self, job: Job) -> Job:
        if not isinstance(job, Job):
            raise InvalidArgument(f"expected a claimed echomq_core.Job, got {type(job).__name__}")
        if job.shard != self.name and job.shard not in self.client.shard_cache.get(self.name, ()):
            raise InvalidArgument(f"job {job.id} belongs to queue {job.shard!r}, not {self.name!r}")
        return job

    def _home(self, jobs: Sequence[Job]) -> str:
        """The physical queue of a batch of this queue's jobs: one shard (what one claim
        leases); a batch from several shards is refused by name, before anything is sent."""
        homes = {self._own(job).shard for job in jobs}
        if len(homes) > 1:
            raise InvalidArgument(
                f"jobs of {len(homes)} shards of queue {self.name!r} in one batch "
                f"({', '.join(sorted(homes))}): settle each shard's jobs in a batch of its own"
            )
        return homes.pop() if homes else self.name


def _merged(parts: list[tuple[int, list[str]]]) -> tuple[int, list[str]]:
    """The shards' ``(how many, ids left as they were)`` as one answer."""
    return sum(n for n, _ in parts), [i for _, left in parts for i in left]
