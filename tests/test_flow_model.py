"""A property-based (hypothesis) stateful test of flows against a simple model.

Random sequences of add / claim / complete / fail (death) / forged-token completion /
Pump crash (deliver, no trim: a redelivery follows) / Pump tick / a retry of an add / a
conflicting add (the parent id with other children, or a child id another flow owns: refused
with FlowConflict and nothing changes) run against a real server, and after every step the
server's reads must equal what the model says the fan-in promised:

* ``:processed`` holds exactly the completed children whose settlement reached the parent
  (same-queue at once, cross-queue once a Pump delivered), with their results;
* ``:unsuccessful`` / ``:failed`` likewise for deaths under ``id`` / ``fp``;
* ``|processed| + |unsuccessful| + dependencies == N`` while the parent has not failed,
  and ``:processed`` and ``:unsuccessful`` are disjoint;
* the parent is failed iff an ``fp`` death reached it, released iff everything settled.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

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

from echomq_core import Child, FlowConflict, Job, LeaseLost, Pump

from .conftest import Backend
from .flowkit import deliver_without_trim

PUMP_ID = "model-pump"


@dataclass
class FlowModel:
    queue: str
    pid: str
    children: dict[str, tuple[str, str]]  # child id -> (queue, policy)
    spec: list[Child] = field(default_factory=list)  # what was added (a retry re-sends it)
    recorded: dict[str, tuple[str, Any]] = field(default_factory=dict)  # id -> (kind, value)
    in_flight: dict[str, tuple[str, Any]] = field(default_factory=dict)  # signals not delivered
    parent_ran: bool = False

    @property
    def failed(self) -> bool:
        return any(kind == "f" for kind, _ in self.recorded.values())

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
        self.pump = Pump(self.mq, [self.parents, self.other], page=10_000, pump_id=PUMP_ID)

    def teardown(self) -> None:
        self.mq.close()

    def _owner(self, child_id: str) -> FlowModel:
        return self.flows[child_id.rsplit(".", 1)[0]]

    @initialize()
    def start(self) -> None:
        self.add_flow([("P", "fp")])

    @rule(
        spec=st.lists(
            st.tuples(st.sampled_from(["P", "O"]), st.sampled_from(["fp", "id"])),
            min_size=1,
            max_size=5,
        )
    )
    def add_flow(self, spec: list[tuple[str, str]]) -> None:
        pid = f"JOB-flow{len(self.flows)}"  # deterministic: hypothesis replays must match
        children = [
            Child(
                i,
                queue=self.parents if q == "P" else self.other,
                max_attempts=1,
                ignore_dependency_on_failure=policy == "id",
            )
            for i, (q, policy) in enumerate(spec)
        ]
        self.mq.add_flow(self.parents, children, parent_id=pid)
        self.flows[pid] = FlowModel(
            self.parents,
            pid,
            {f"{pid}.{i}": (c.queue or self.parents, c.policy) for i, c in enumerate(children)},
            children,
        )

    @rule(data=st.data())
    def retry_add(self, data: st.DataObject) -> None:
        """The same add again (a caller's retry by id): converges, changes nothing."""
        flow = self.flows[data.draw(st.sampled_from(sorted(self.flows)))]
        self.mq.add_flow(flow.queue, flow.spec, parent_id=flow.pid)

    @rule(data=st.data(), how=st.sampled_from(["other ids", "one more", "taken child"]))
    def conflicting_add(self, data: st.DataObject, how: str) -> None:
        """An add that would merge two flows: refused, and nothing changes (the invariant
        check after this step compares every flow with the model)."""
        flow = self.flows[data.draw(st.sampled_from(sorted(self.flows)))]
        n = len(flow.children)
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
            flow.recorded[job.id] = (kind, value)
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
            flow.recorded.update(flow.in_flight)
            flow.in_flight.clear()

    @rule()
    def pump_crash(self) -> None:
        """Deliver, then die before trimming: the signals stay and will be redelivered."""
        deliver_without_trim(self.mq, [self.parents, self.other], PUMP_ID)
        self._delivered()

    @rule()
    def pump_tick(self) -> None:
        self.pump.tick()
        self._delivered()
        for queue in (self.parents, self.other):
            assert self.mq.queue(queue).stats()["outbox"] == 0

    @invariant()
    def reads_match_the_model(self) -> None:
        for flow in self.flows.values():
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
            settled = len(flow.of("c")) + len(flow.of("i"))
            assert snap.dependencies == n - settled
            if flow.failed:
                assert snap.parent_state == "failed"
            else:
                assert snap.processed + snap.ignored + snap.dependencies == n
                if settled == n:
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
