"""A property-based (hypothesis) stateful test of flows against a simple model.

Random sequences of add (worker-run or barrier flows) / claim / complete / fail (death) /
forged-token completion / Pump crash (deliver, no trim: a redelivery follows) / Pump tick / a
retry of an add / a conflicting add (the parent id with other children, or a child id another
flow owns: refused with FlowConflict and nothing changes) / close / cancel / repair (retry_flow)
/ replace (a changed flow under the same id) / a retention sweep with every age at 0 run
against a real server, and after every step the server's reads must equal what the model says
the fan-in promised:

* ``:processed`` holds exactly the completed children whose settlement reached the parent
  (same-queue at once, cross-queue once a Pump delivered), with their results;
* ``:unsuccessful`` / ``:failed`` likewise for deaths under ``id`` / ``fp``;
* ``|processed| + |unsuccessful| + dependencies == N`` while the parent has not failed,
  and ``:processed`` and ``:unsuccessful`` are disjoint;
* the parent is failed iff an ``fp`` death reached it, released iff everything settled;
* a flow with a success threshold (random ``min_success``) tolerates its first ``allow``
  ``fp`` deaths (recorded in ``:failed``, counted as settled), and the next one fails it (the
  tip); ``|processed| + |unsuccessful| + |failed| + dependencies == N`` while it has not
  failed; after the tip no child of it in the parent's queue is claimable, and once a
  follow-up ran (a Pump tick, a sweep, a repair) none at all, and the children it leased lose
  their leases;
* a cancelled flow is never released or failed (claimed children lose their lease; reports
  already on their way are recorded as usual); a repair puts its dead (or cancelled) children
  back to work, and a death reported before it (redelivered) changes nothing; a replaced
  flow's old children are gone and their reports change nothing;
* a sweep forgets exactly the flows in an end state whose children all settled (a closed or
  unclosed barrier, a worker-run root that ran, a failed flow with nothing still running) -
  every key of theirs - and nothing a live flow needs;
* a flow added with ``max_running`` (its cap split over its child queues): in each child
  queue, the gate's ``admitted`` count equals the flow's children that really hold a token
  (pending, leased or retrying), never above that queue's share, the shares sum to the cap,
  and a child waits in the gate only while the share is full (or the flow is cancelled); a
  re-add with another cap is refused.

The children carry fairness groups (none, or one of two tenants, in turn): groups order the
claims only, so every promise above holds with them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from echomq_core import Child, FlowConflict, Job, JobNotFound, LeaseLost, Pump
from echomq_core.flows.retention import SETTINGS
from echomq_core.wire.calls import Call

from ..conftest import Backend
from ..flowkit import deliver_without_trim

PUMP_ID = "model-pump"


@dataclass
class FlowModel:
    queue: str
    pid: str
    children: dict[str, tuple[str, str]]  # child id -> (queue, policy)
    spec: list[Child] = field(default_factory=list)  # what was added (a retry re-sends it)
    barrier: bool = False
    cancelled: bool = False
    closed: bool = False
    expired: bool = False
    bumped: bool = False  # swept while failed with children running: re-checked a minute on
    recorded: dict[str, tuple[str, Any]] = field(default_factory=dict)  # id -> (kind, value)
    in_flight: dict[str, tuple[str, Any]] = field(default_factory=dict)  # signals not delivered
    parent_ran: bool = False
    cap: int | None = None  # max_running
    allow: int | None = None  # a success threshold: how many fp deaths it tolerates
    tolerated: int = 0  # fp deaths recorded while held and within allow
    tipped: bool = False  # the death beyond allow reached it (and no repair since)
    stopped: bool = False  # tipped, and the follow-up cancelled its unstarted children

    def record(self, child: str, kind: str, value: Any) -> None:
        """A report reaching the parent (set-if-absent, as the server records it)."""
        if child in self.recorded:
            return
        held = not self.cancelled and not self.failed
        self.recorded[child] = (kind, value)
        if kind == "f" and self.allow is not None and held:
            if len(self.of("f")) <= self.allow:
                self.tolerated += 1
            else:
                self.tipped = True

    @property
    def failed(self) -> bool:
        return sum(1 for kind, _ in self.recorded.values() if kind == "f") > self.tolerated

    @property
    def released(self) -> bool:
        settled = sum(1 for kind, _ in self.recorded.values() if kind != "f")
        return not self.failed and settled + self.tolerated == len(self.children)

    def expires(self) -> bool:
        """Would a sweep with every age at 0 forget this flow now?"""
        if self.expired:
            return False
        if self.cancelled:
            return True
        if self.bumped:
            return False
        if self.failed:  # nothing left running (a stopped flow's children were cancelled)
            return self.stopped or len(self.recorded) == len(self.children)
        return self.released and (self.barrier or self.parent_ran)

    def of(self, kind: str) -> dict[str, Any]:
        return {c: v for c, (k, v) in self.recorded.items() if k == kind}


class FlowMachine(RuleBasedStateMachine):
    backend: Backend

    def __init__(self) -> None:
        super().__init__()
        self.mq = self.backend.client("m" + uuid.uuid4().hex[:10])
        self.parents, self.other = self.backend.queues_on_distinct_nodes(2, "mdl")
        self.flows: dict[str, FlowModel] = {}
        self.claimed: dict[str, Job] = {}  # child id -> its job, leased by us
        self.owner: dict[str, str] = {}  # child id -> its flow's parent id
        self.pump = Pump(
            self.mq, [self.parents, self.other], page=10_000, pump_id=PUMP_ID, sweep_every=None
        )
        self.sweeper = Pump(
            self.mq, [self.parents, self.other], pump_id=PUMP_ID, sweep_every=0, maintain_every=0
        )

    def teardown(self) -> None:
        self.mq.close()

    def _owner(self, child_id: str) -> FlowModel:
        return self.flows[self.owner[child_id]]

    def _track(self, flow: FlowModel) -> None:
        self.flows[flow.pid] = flow
        for child in flow.children:
            self.owner[child] = flow.pid

    @initialize()
    def start(self) -> None:
        self.add_flow([("P", "fp")])
        self.add_flow([("P", "fp"), ("O", "fp"), ("P", "fp"), ("O", "id")], allow=1)

    @rule(
        spec=st.lists(
            st.tuples(st.sampled_from(["P", "O"]), st.sampled_from(["fp", "id"])),
            min_size=1,
            max_size=5,
        ),
        barrier=st.booleans(),
        allow=st.sampled_from([None, None, 0, 1, 1, 2]),
        cap=st.one_of(st.none(), st.integers(2, 3)),  # >= 2: at least 1 per child queue
    )
    def add_flow(
        self,
        spec: list[tuple[str, str]],
        barrier: bool = False,
        allow: int | None = None,
        cap: int | None = None,
    ) -> None:
        pid = f"JOB-flow{len(self.flows)}"  # deterministic: hypothesis replays must match
        children = [
            Child(
                i,
                queue=self.parents if q == "P" else self.other,
                max_attempts=1,
                ignore_dependency_on_failure=policy == "id",
                group=(None, "tenant-a", "tenant-b")[(len(self.flows) + i) % 3],
            )
            for i, (q, policy) in enumerate(spec)
        ]
        if allow is not None:
            allow = min(allow, len(children) - 1)  # at least one must succeed
        min_success = None if allow is None else len(children) - allow
        self.mq.add_flow(
            self.parents,
            children,
            parent_id=pid,
            barrier=barrier,
            min_success=min_success,
            max_running=cap,
        )
        self._track(
            FlowModel(
                self.parents,
                pid,
                {f"{pid}.{i}": (c.queue or self.parents, c.policy) for i, c in enumerate(children)},
                children,
                barrier,
                allow=allow,
                cap=cap,
            )
        )

    @rule(data=st.data())
    def retry_add(self, data: st.DataObject) -> None:
        """The same add again (a caller's retry by id): converges, changes nothing."""
        flow = self.flows[data.draw(st.sampled_from(sorted(self.flows)))]
        if flow.expired:  # a retry after expiry adds the flow afresh: not this model's case
            return
        min_success = None if flow.allow is None else len(flow.children) - flow.allow
        self.mq.add_flow(
            flow.queue,
            flow.spec,
            parent_id=flow.pid,
            barrier=flow.barrier,
            min_success=min_success,
            max_running=flow.cap,
        )

    @rule(
        data=st.data(), how=st.sampled_from(["other ids", "one more", "taken child", "other cap"])
    )
    def conflicting_add(self, data: st.DataObject, how: str) -> None:
        """An add that would merge two flows: refused, and nothing changes (the invariant
        check after this step compares every flow with the model)."""
        flow = self.flows[data.draw(st.sampled_from(sorted(self.flows)))]
        if flow.expired:
            return
        n = len(flow.children)
        if how == "other cap":
            other = 5 if flow.cap is None else None
            try:
                allow = None if flow.allow is None else len(flow.children) - flow.allow
                self.mq.add_flow(
                    flow.queue,
                    flow.spec,
                    parent_id=flow.pid,
                    max_running=other,
                    min_success=allow,
                )
            except FlowConflict:
                return
            raise AssertionError("a re-add with another cap was accepted")
        if how == "other ids":  # the same N, other child ids
            children = [Child(i, queue=self.parents, id=f"{flow.pid}-x{i}") for i in range(n)]
            pid = flow.pid
        elif how == "one more":
            children = [Child(i, queue=self.parents) for i in range(n + 1)]
            pid = flow.pid
        else:  # a new flow whose explicit child id is a child of this one
            taken = data.draw(st.sampled_from(sorted(flow.children)))
            queue = flow.children[taken][0]
            children = [Child(0, queue=queue, id=taken)]
            pid = f"JOB-thief{len(self.flows)}"
        try:
            self.mq.add_flow(self.parents, children, parent_id=pid)
        except FlowConflict:
            return
        raise AssertionError(f"{how}: an add that merges two flows was accepted")

    @rule(which=st.sampled_from(["P", "O"]), count=st.integers(1, 4))
    def claim(self, which: str, count: int) -> None:
        queue = self.parents if which == "P" else self.other
        q = self.mq.queue(queue)
        for job in q.claim(count):
            assert not self._owner(job.id).cancelled if job.id in self.owner else True
            if job.id in self.owner:
                owner = self._owner(job.id)
                assert not owner.stopped, f"{job.id}: claimed after its flow's follow-up"
                assert not (owner.tipped and queue == owner.queue), f"{job.id}: not parked"
            if job.id in self.flows:  # a released parent: run it at once
                q.complete(job, "parent ran")
                self.flows[job.id].parent_ran = True
            else:
                self.claimed[job.id] = job

    def _settle(self, job: Job, kind: str, value: Any) -> None:
        flow = self._owner(job.id)
        queue, policy = flow.children[job.id]
        if kind == "dead":
            kind = "i" if policy == "id" else "f"
        if queue == flow.queue:
            flow.record(job.id, kind, value)
        else:
            flow.in_flight[job.id] = (kind, value)

    @precondition(lambda self: self.claimed)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        child_id = data.draw(st.sampled_from(sorted(self.claimed)))
        job = self.claimed.pop(child_id)
        self.mq.queue(job.queue).complete(job, {"r": job.payload})
        self._settle(job, "c", {"r": job.payload})

    @precondition(lambda self: self.claimed)
    @rule(data=st.data())
    def die(self, data: st.DataObject) -> None:
        child_id = data.draw(st.sampled_from(sorted(self.claimed)))
        job = self.claimed.pop(child_id)
        assert self.mq.queue(job.queue).fail(job, f"err {child_id}") is True
        self._settle(job, "dead", f"err {child_id}")

    @rule(which=st.sampled_from(["P", "O"]))
    def death_storm(self, which: str) -> None:
        """Claim what we can in one queue and kill every child we hold there in ONE fail
        batch: several deaths of one parent settle in one script (a threshold tips mid-batch)."""
        self.claim(which, 4)
        queue = self.parents if which == "P" else self.other
        jobs = [j for j in self.claimed.values() if j.queue == queue]
        if not jobs:
            return
        statuses = self.mq.queue(queue).fail_many([(j, f"err {j.id}", False) for j in jobs])
        assert statuses == [2] * len(jobs)
        for job in jobs:
            del self.claimed[job.id]
            self._settle(job, "dead", f"err {job.id}")

    @precondition(lambda self: self.claimed)
    @rule(data=st.data())
    def forged_completion(self, data: st.DataObject) -> None:
        child_id = data.draw(st.sampled_from(sorted(self.claimed)))
        job = self.claimed[child_id]
        forged = Job(job.queue, job.id, "forged", job.payload, 0, 1, job.parent)
        try:
            self.mq.queue(job.queue).complete(forged, "nope")
        except LeaseLost:
            return
        raise AssertionError("a forged token completed a job")

    def _delivered(self) -> None:
        for flow in self.flows.values():
            for child, (kind, value) in flow.in_flight.items():
                flow.record(child, kind, value)
            flow.in_flight.clear()

    def _stops(self, only: FlowModel | None = None) -> None:
        """A drain ran the follow-ups of the tipped flows (a repair runs its flow's own): their
        unstarted children are cancelled, the children we hold lose their leases."""
        for flow in self.flows.values() if only is None else [only]:
            if flow.tipped and not flow.stopped and not flow.cancelled and not flow.expired:
                flow.stopped = True
                self._drop_claims(flow)

    @rule()
    def pump_crash(self) -> None:
        """Deliver, then die before trimming: the signals stay and will be redelivered."""
        deliver_without_trim(self.mq, [self.parents, self.other], PUMP_ID)
        self._delivered()

    @rule()
    def pump_tick(self) -> None:
        self.pump.tick()
        self._delivered()
        self._stops()
        for queue in (self.parents, self.other):
            # left: only the 'x' signal of a tip this very tick delivered (its follow-up ran
            # at once; the next drain finds it done)
            (left,) = self.mq.connection.execute(
                [Call.cmd("LRANGE", self.mq.keys.outbox(queue), 0, -1)]
            )
            assert all(bytes(e).startswith(b"x\n") for e in left), left

    def _live(self, data: st.DataObject) -> FlowModel | None:
        live = sorted(p for p, f in self.flows.items() if not f.expired)
        return self.flows[data.draw(st.sampled_from(live))] if live else None

    def _drop_claims(self, flow: FlowModel) -> None:
        """Claimed children of a cancelled or replaced flow lose their lease."""
        for child in list(self.claimed):
            if child in flow.children:
                job = self.claimed.pop(child)
                try:
                    self.mq.queue(job.queue).complete(job, "late")
                except LeaseLost:
                    continue
                raise AssertionError(f"{child}: a report after the cancel was accepted")

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        flow = self._live(data)
        if flow is None:
            return
        if flow.closed:  # refused: a closed flow has nothing left to stop
            with pytest.raises(FlowConflict):
                self.mq.cancel_flow(flow.queue, flow.pid, reason="model")
            return
        result = self.mq.cancel_flow(flow.queue, flow.pid, reason="model")
        if flow.parent_ran:
            assert result.state == "completed"
            return
        assert result.state == "cancelled"
        flow.cancelled = True  # reports on their way are still recorded when delivered
        self._drop_claims(flow)

    @rule(data=st.data())
    def repair(self, data: st.DataObject) -> None:
        flow = self._live(data)
        if flow is None:
            return
        if not (flow.failed or flow.cancelled):
            try:
                result = self.mq.retry_flow(flow.queue, flow.pid)
            except FlowConflict:  # released, closed, run by a worker: nothing to repair
                assert flow.released or flow.parent_ran
                return
            assert result.requeued == 0  # a held flow: nothing to re-run
            return
        # retry_flow finishes a pending follow-up first; only then have the children we hold
        # in other queues lost their leases (until a drain or the repair runs it, a tip's
        # follow-up in another slot has not happened yet, and their reports still count)
        result = self.mq.retry_flow(flow.queue, flow.pid)
        self._stops(flow)
        flow.recorded = {c: r for c, r in flow.recorded.items() if r[0] != "f"}
        flow.tolerated, flow.tipped, flow.stopped = 0, False, False
        flow.cancelled = False
        flow.bumped = False
        assert result.state in ("held", "released", "pending"), result

    @rule(data=st.data())
    def replace(self, data: st.DataObject) -> None:
        flow = self._live(data)
        if flow is None:
            return
        n = len(flow.children) + 1
        children = [Child(i, queue=self.other, max_attempts=1) for i in range(n)]
        ref = self.mq.add_flow(
            flow.queue, children, parent_id=flow.pid, barrier=flow.barrier, replace=True
        )
        self._drop_claims(flow)
        for child in flow.children:
            self.owner.pop(child, None)
        new = FlowModel(
            flow.queue,
            flow.pid,
            {cid: (q, "fp") for q, cid in ref.children},
            children,
            flow.barrier,
        )
        assert all(".g" in cid for cid in new.children), new.children
        self._track(new)

    @precondition(lambda self: any(f.barrier and not f.expired for f in self.flows.values()))
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        live = sorted(p for p, f in self.flows.items() if f.barrier and not f.expired)
        flow = self.flows[data.draw(st.sampled_from(live))]
        if flow.cancelled:
            assert self.mq.close_flow(flow.queue, flow.pid) == "cancelled"
        elif flow.released:
            assert self.mq.close_flow(flow.queue, flow.pid) == "closed"
            flow.closed = True
        elif flow.failed:
            assert self.mq.close_flow(flow.queue, flow.pid) == "failed"
        else:
            try:
                self.mq.close_flow(flow.queue, flow.pid)
            except FlowConflict:
                return
            raise AssertionError("a held flow was closed")

    @rule()
    def sweep(self) -> None:
        """Every age at 0: what may expire, does, as a unit; nothing else is touched."""
        for queue in (self.parents, self.other):
            self.mq.set_retention(queue, **{n: 0 for n in SETTINGS if n.endswith("_age")})
        stats = self.sweeper.tick()  # delivers first (and runs follow-ups), then sweeps
        self._delivered()
        self._stops()
        expiring = [f for f in self.flows.values() if f.expires()]
        for flow in self.flows.values():
            if (
                flow.failed
                and not flow.expired
                and not flow.stopped
                and len(flow.recorded) < len(flow.children)
            ):
                flow.bumped = True  # the sweep looked and found children still running
        expired = {pid for _, pid in stats.expired}
        for _ in range(10):  # bounded: every due flow goes in the first tick or soon after
            for flow in expiring:
                if flow.pid in expired:
                    flow.expired = True
            more = self.sweeper.tick().expired
            if not more:
                break
            expired = {pid for _, pid in more}
        for flow in self.flows.values():
            assert flow.expired or not flow.expires(), f"{flow.pid} should have expired"

    @invariant()
    def the_cap_counts_what_holds_a_token(self) -> None:
        r = self.mq.connection.client
        ks = self.mq.keys
        for flow in self.flows.values():
            if flow.cap is None or flow.expired:
                continue
            shares = 0
            for queue in sorted({q for q, _ in flow.children.values()}):
                kids = [c for c, (q, _) in flow.children.items() if q == queue]
                waiting, counts = ks.gate_keys(queue, flow.queue, flow.pid)
                share, admitted, off = r.hmget(counts, "cap", "admitted", "off")
                shares += int(share)
                holding = sum(
                    1
                    for c in kids
                    for key in (ks.pending(queue), ks.active(queue), ks.delayed(queue))
                    if r.zscore(key, c) is not None
                )
                assert int(admitted or 0) == holding, (flow.pid, queue, admitted, holding)
                assert holding <= int(share)
                if holding < int(share) and off is None:
                    assert r.zcard(waiting) == 0, (flow.pid, queue)
            assert shares == flow.cap

    @invariant()
    def reads_match_the_model(self) -> None:
        for flow in self.flows.values():
            if flow.expired:
                snap = self.mq.snapshot(flow.queue, flow.pid)
                assert snap.parent_state is None and snap.total == 0
                with pytest.raises(JobNotFound, match="expired with its retention"):
                    self.mq.children_values(flow.queue, flow.pid)  # not {}: issue 48
                for child, (queue, _) in flow.children.items():
                    with pytest.raises(JobNotFound):
                        self.mq.queue(queue).get_job(child)
                continue
            snap = self.mq.snapshot(flow.queue, flow.pid)
            processed = self.mq.children_values(flow.queue, flow.pid)
            ignored = self.mq.ignored_failures(flow.queue, flow.pid)
            failed = self.mq.failed_children(flow.queue, flow.pid)
            assert processed == flow.of("c")
            assert ignored == flow.of("i")
            assert failed == flow.of("f")
            assert not set(processed) & set(ignored)
            n = len(flow.children)
            assert snap.total == n
            settled = len(flow.of("c")) + len(flow.of("i")) + flow.tolerated
            assert snap.dependencies == n - settled
            assert snap.allowed == flow.allow
            whole = snap.processed + snap.ignored + snap.failed + snap.dependencies
            if flow.cancelled:
                assert snap.parent_state == "cancelled"
                if not flow.failed:
                    assert whole == n
            elif flow.failed:
                assert snap.parent_state == "failed"
            else:
                assert whole == n
                if settled == n and flow.barrier:
                    assert snap.parent_state == ("closed" if flow.closed else "released")
                elif settled == n:
                    assert snap.parent_state == ("completed" if flow.parent_ran else "pending")
                else:
                    assert snap.parent_state == "held" and not flow.parent_ran


def test_flows_against_the_model(backend: Backend) -> None:
    FlowMachine.backend = backend
    run_state_machine_as_test(
        FlowMachine,
        settings=settings(
            max_examples=25 if backend.cluster else 40,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
