"""Flow lifecycle II: cancel a flow, repair a failed (or cancelled) one, close a released barrier
flow.

Both walk the flow's tree the way its expiry does (:mod:`echomq_core.flows.retention`): a node's
script runs on its own slot and answers with its children's queues and explicit ids; the host
then visits each child queue on its slot with the candidate ids (the derived ``<id>.<i>`` and
the explicit ones), and the children that are sub-flows are visited in turn. Every step is
idempotent, so a cancel or repair cut short by a crash or a lost connection is completed by
calling it again.

* **Cancel** (``cancel.lua`` per node, ``cancel_children.lua`` per child queue): the node is
  ``cancelled`` with its reason; pending and retrying children leave their sets; leased ones
  lose their lease (their worker drops them before they start, and a running handler's report
  is refused by its token). Completed children keep their values, and reports that were on
  their way (children that finished before the cancel) are recorded as usual; a cancelled
  parent is never released or failed.
* **Replace** (``add_flow(..., replace=True)``): when the parent id holds another flow, the
  old one is cancelled, its children's rows deleted in every queue, its root
  reset to a tombstone that names the next generation (``reset.lua``), and the new flow is
  added as generation n: its derived child ids are ``<id>.g<n>.<i>``, so they never collide
  with the old ones, and a late report of an old child changes nothing. "Another flow": a
  replacing add keeps a digest of the whole tree on the root (:func:`~echomq_core.flows.add.
  tree_digest`: every node's queue, id, options and payload), so any change below the root is
  one, and the same flow again converges; a flow added without ``replace`` has no digest and
  is compared by its children's ids and queues and its settings, and replaced too when a node
  below the root is refused as another flow's.
* **Repair** (``repair.lua`` per node, ``requeue.lua`` per child queue, ``repair_done.lua``
  last): a failed node's dead children (``:failed``; with ``ignored`` its ``:unsuccessful``
  too) are recorded in ``:repair`` and the node is held again - all in one script - then those
  children get fresh attempts and go back to pending; a cancelled node re-runs its cancelled
  children. Completed children never run again. Sub-flows are repaired bottom-up: a failed
  sub-flow in the list is repaired (its own dead children re-run) and held again.
* **Repair on re-add** (:func:`repair_on_readd`): what an orchestrator's retried or cleared
  adding step does once its add converged - a flow found failed or cancelled is repaired - one
  rule for the Airflow operator and the Dagster resource and IO manager.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..checks import text as _s
from ..errors import FlowConflict
from ..models import FlowRef, FlowSnapshot
from ..wire.calls import Call, Op, chunks
from ..wire.keyspace import Keyspace, child_stem
from .add import add_flow, fingerprint, tree_digest
from .plan import _Node, child_candidates
from .reads import snapshot
from .retention import SweepStats, Visit, forget_tree, walk_tree


@dataclass(slots=True)
class CancelResult:
    """What a cancel did: the root's state after it, and the children it stopped."""

    state: str
    children: int = 0
    nodes: int = 1


@dataclass(slots=True)
class RepairResult:
    """What a repair did: the root's state after it, the children put back to work, the
    sub-flows repaired, and how many repairs the root has had."""

    state: str
    requeued: int = 0
    nodes: int = 1
    repairs: int = 0


def _cancel_call(ks: Keyspace, queue: str, node_id: str, reason: str, parent: str) -> Call:
    return Call.lua(
        "cancel",
        [*ks.queue_keys(queue), ks.job(queue, node_id), ks.explicit(queue, node_id)],
        [node_id, reason, parent],
    )


def cancel_flow(ks: Keyspace, queue: str, parent_id: str, reason: str) -> Op[CancelResult]:
    """Cancel the flow rooted at ``parent_id`` in ``queue`` and every child below it.

    A closed flow is refused with :class:`~echomq_core.FlowConflict`: its reader has read it
    and its ``closed`` retention runs, so there is nothing left to stop, and a cancel that
    returned quietly would let the caller believe the flow's work was stopped. Nothing is
    written (``cancel.lua`` leaves an ended flow as it is)."""
    result = yield from _cancel_tree(ks, queue, parent_id, reason)
    if result.state == "closed":
        raise FlowConflict(
            f"flow {parent_id} in queue {queue!r} is closed (read by its reader; its closed "
            "retention runs): a closed flow cannot be cancelled, nothing of it is left to stop"
        )
    return result


def _cancel_tree(ks: Keyspace, queue: str, parent_id: str, reason: str) -> Op[CancelResult]:
    """:func:`cancel_flow` without its refusal of a closed flow: a replace (:func:`add_or_replace`)
    cancels whatever the id holds, a closed flow included, before it resets the root."""
    (info,) = yield [_cancel_call(ks, queue, parent_id, reason, "")]
    result = CancelResult(_s(info[0]))
    if result.state != "cancelled":  # it ended otherwise before: nothing below to stop
        return result

    def children_of(node_queue: str, node_id: str, info: Sequence[Any]) -> list[Visit]:
        _, total, cq, explicit, _before, gen = info
        kids = child_candidates(node_id, int(total), _s(cq), explicit, _s(gen))
        return [
            (
                q,
                "cancel_children",
                [*ks.queue_keys(q), *ks.gate_keys(q, node_queue, node_id)],
                [],
                ids,
            )
            for q, ids in kids.items()
        ]

    result.children, visited = yield from walk_tree(
        ks,
        [(queue, parent_id, info)],
        children_of,
        lambda q, inner_id, up: _cancel_call(ks, q, inner_id, reason, up),
        _below,
    )
    result.nodes += visited
    return result


def _below(info: Sequence[Any]) -> bool:
    """Whether a cancel's walk goes below an inner node, from its ``cancel.lua`` reply: one it
    cancelled, and one that died (a job whose run spawned children of its own and then failed
    for good: its death stays recorded, and its children, which run on without it, are
    cancelled). A node that completed or was closed has nothing unsettled below it."""
    return _s(info[0]) in ("cancelled", "dead")


#: The reason a threshold flow's unstarted children are cancelled with (their sub-flows' rows).
STOP_REASON = "its parent failed: min_success can no longer be met"


def stop_unstarted(ks: Keyspace, queue: str, node_id: str, mark: str | None = None) -> Op[int]:
    """The follow-up of a threshold flow that failed (settle_current.lua marked its row
    ``tipped``): cancel its children that have not started, in every child queue and below,
    as :func:`cancel_flow` does, while the node itself stays ``failed``. Then ``stopped.lua``
    records it, so it runs once: a node that is not failed, not tipped (a repair dropped the
    mark), tipped at another time than ``mark`` (a late ``'x'`` signal) or already stopped is
    left as it is, at the cost of one read. Idempotent, so whoever finds it not done does it:
    the Pump that delivered the tipping death at once, and a drainer of the node queue's
    outbox when it reaches the ``'x'`` signal the tip pushed (what makes it durable: the
    signal is trimmed only after this returned). Returns the children cancelled.

    Its first round trip parks the node's pending and retrying children in every child queue
    (``park.lua``, all queues and chunks in one pipeline, no row read): from then on no claim
    reaches them, however long the walk that marks them ``cancelled`` takes. The tipping step
    itself parked those in the node's own queue (settle_current.lua); parking again is
    harmless (a parked child is left as it is)."""
    row = ks.job(queue, node_id)
    ((state, tipped, stopped, total, cq, gen), explicit) = yield [
        Call.cmd("HMGET", row, "state", "tipped", "stopped", "total", "cq", "gen"),
        Call.cmd("HGETALL", ks.explicit(queue, node_id)),
    ]
    if (
        state is None
        or _s(state) != "failed"
        or tipped is None
        or (mark is not None and _s(tipped) != mark)
        or (stopped is not None and _s(stopped) == _s(tipped))
    ):
        return 0
    flat: list[Any] = []
    if isinstance(explicit, dict):
        for k, v in explicit.items():
            flat += [k, v]
    else:
        flat = list(explicit)
    info = ["failed", total, cq or b"", flat, "failed", gen or b""]
    parks = _park_calls(ks, queue, node_id, int(total), _s(cq or b""), flat, _s(gen or b""))
    if parks:
        yield parks

    def children_of(node_queue: str, node: str, node_info: Sequence[Any]) -> list[Visit]:
        _, n, queues, ids, _before, generation = node_info
        kids = child_candidates(node, int(n), _s(queues), ids, _s(generation))
        fixed = {q: [*ks.queue_keys(q), *ks.gate_keys(q, node_queue, node)] for q in kids}
        return [(q, "cancel_children", fixed[q], [], part) for q, part in kids.items()]

    cancelled, _ = yield from walk_tree(
        ks,
        [(queue, node_id, info)],
        children_of,
        lambda q, inner_id, up: _cancel_call(ks, q, inner_id, STOP_REASON, up),
        _below,
    )
    yield [Call.lua("stopped", [row], [_s(tipped)])]
    return cancelled


#: The most child ids one ``park.lua`` call takes (two ZMSCOREs and a ZREM / ZADD per 1,000 of
#: them, a few ms of server time for 5,000): a follow-up of a bigger flow sends several.
PARK_CHUNK = 5000


def _park_calls(
    ks: Keyspace,
    node_queue: str,
    node_id: str,
    total: int,
    child_queues: str,
    explicit: Sequence[Any],
    gen: str,
) -> list[Call]:
    """The ``park.lua`` calls of a tipped node: per child queue, its derived ids by index
    range when the node has no explicit ids (with explicit ids a derived id may be another
    job's, so only the recorded explicit ids are parked; the walk cancels the rest), and the
    explicit ids recorded for that queue; at most :data:`PARK_CHUNK` ids per call. Each call
    also marks the node's cap gate in that queue off (a capped flow admits no more)."""
    stem = child_stem(node_id, gen)
    given: dict[str, list[str]] = {}
    for i in range(0, len(explicit), 2):
        given.setdefault(_s(explicit[i + 1]), []).append(_s(explicit[i]))
    calls = []
    for queue in child_queues.split():
        keys = [*ks.queue_keys(queue), *ks.gate_keys(queue, node_queue, node_id)]
        if not explicit:
            for start in range(0, total, PARK_CHUNK):
                end = min(total, start + PARK_CHUNK)
                calls.append(Call.lua("park", keys, [stem, start, end]))
        for part in chunks(given.get(queue, []), PARK_CHUNK):
            calls.append(Call.lua("park", keys, [stem, 0, 0, *part]))
    return calls


def _repair_call(ks: Keyspace, queue: str, node_id: str, ignored: bool, parent: str) -> Call:
    return Call.lua(
        "repair",
        [
            *ks.queue_keys(queue),
            *ks.parent_keys(queue, node_id),
            ks.repair(queue, node_id),
            ks.explicit(queue, node_id),
        ],
        [node_id, "1" if ignored else "", parent],
    )


def retry_flow(ks: Keyspace, queue: str, parent_id: str, *, ignored: bool) -> Op[RepairResult]:
    """Repair the flow rooted at ``parent_id`` (see the module doc). A tipped threshold root
    whose follow-up has not finished gets it first (:func:`stop_unstarted`; one read when
    there is none to do): its parked children become ``cancelled``, which the repair re-runs -
    a repair that dropped the ``tipped`` mark first would leave them parked for ever."""
    yield from stop_unstarted(ks, queue, parent_id)
    (info,) = yield [_repair_call(ks, queue, parent_id, ignored, "")]
    result = RepairResult(_s(info[0]), repairs=int(info[6]))
    done: list[Call] = []

    def record_done(node_queue: str, node_id: str, _info: Sequence[Any]) -> None:
        keys = [
            *ks.queue_keys(node_queue),
            ks.job(node_queue, node_id),
            ks.repair(node_queue, node_id),
            ks.dependencies(node_queue, node_id),
        ]
        done.append(Call.lua("repair_done", keys, [node_id]))

    def children_of(node_queue: str, node_id: str, info: Sequence[Any]) -> list[Visit]:
        _, total, cq, explicit, listed, rerun, _n, gen = info
        listed_ids = {_s(i) for i in listed}
        everything = child_candidates(node_id, int(total), _s(cq), explicit, _s(gen))
        visits: list[Visit] = []
        for q, candidates in everything.items():
            fixed = [*ks.queue_keys(q), *ks.gate_keys(q, node_queue, node_id)]
            # the deaths the parent recorded (moved to :repair, their epochs raised) run again;
            # with a rerun (a cancelled or tipped node) so do the cancelled children - but not
            # a child that died without its death recorded yet: its report is on its way and
            # is counted when it arrives, as for any child that ended before the repair (run
            # again, it would be counted twice)
            if listed_ids:
                visits.append((q, "requeue", fixed, ["1"], sorted(listed_ids)))
            if _s(rerun):
                cancelled = [i for i in candidates if i not in listed_ids]
                if cancelled:
                    visits.append((q, "requeue", fixed, ["c"], cancelled))
        return visits

    result.requeued, visited = yield from walk_tree(
        ks,
        [(queue, parent_id, info)],
        children_of,
        lambda q, inner_id, up: _repair_call(ks, q, inner_id, ignored, up),
        lambda inner_info: True,
        record_done,
    )
    result.nodes += visited
    if done:
        states = yield done[::-1]  # deepest first: a node's record goes after its children's
        result.state = _s(states[-1])
    return result


def close_flow(ks: Keyspace, queue: str, parent_id: str) -> Op[str]:
    """Close a released barrier flow (its retention starts); the state after the call."""
    (state,) = yield [
        Call.lua(
            "close",
            [*ks.queue_keys(queue), ks.job(queue, parent_id)],
            [parent_id],
        )
    ]
    return _s(state)


@dataclass(frozen=True, slots=True)
class ReAdd:
    """What a re-add under a stable parent id found once the add converged (``snap``, before
    any repair) and the repair it did (None: nothing to repair, or ``repair`` was off)."""

    snap: FlowSnapshot
    repaired: RepairResult | None = None

    @property
    def broken(self) -> bool:
        """The flow had failed or been cancelled: an earlier try gave up on it."""
        return self.snap.outcome in ("failed", "cancelled")


def note_epoch(ks: Keyspace, queue: str, parent_id: str, epoch: int) -> Op[int | None]:
    """Record ``epoch`` on the flow's root row if it is above the one there (``epoch.lua``);
    the row's epoch after the call, None when there is no such flow. ``0`` only reads it."""
    (found,) = yield [Call.lua("epoch", [ks.job(queue, parent_id)], [str(epoch)])]
    return None if found is None else int(found)


def repair_on_readd(
    ks: Keyspace, queue: str, parent_id: str, *, repair: bool, epoch: int | None = None
) -> Op[ReAdd]:
    """The rule after an add by a stable id (an Airflow retry or clear of the adding task, a
    Dagster step retry or re-execution), once the add converged to the flow already there:
    a flow found failed or cancelled - the earlier try's wait gave up on it - is repaired when
    ``repair`` (:func:`retry_flow`: dead and cancelled children run again, completed ones keep
    their values), so the new try's wait reads it to the end; a released or closed one is left
    as it is (its results are read again); a held one is the earlier try's, still running.
    ``epoch`` (the orchestrator's attempt, :func:`note_epoch`) is recorded first, so a late
    failure callback of an older attempt leaves the flow this one takes up. One round trip
    more than the add (two with an epoch), plus the repair's when there is one."""
    if epoch is not None:
        yield from note_epoch(ks, queue, parent_id, epoch)
    snap = yield from snapshot(ks, queue, parent_id)
    if repair and snap.outcome in ("failed", "cancelled"):
        return ReAdd(snap, (yield from retry_flow(ks, queue, parent_id, ignored=False)))
    return ReAdd(snap)


def add_or_replace(
    ks: Keyspace,
    plan: Callable[[str], _Node],
    new_queues: Sequence[str],
    *,
    barrier: bool,
) -> Op[FlowRef]:
    """``add_flow(replace=True)``: add the planned flow; if its parent id holds another flow,
    take that one away first (see the module doc). ``plan(gen)`` plans the flow for a
    generation. One round trip more than a plain add; a cut replace is completed by a retry."""
    root = plan("")
    queue, parent_id = root.queue, root.id
    ((state, total, fp, gen, allow, cap, tfp),) = yield [
        Call.cmd(
            "HMGET",
            ks.job(queue, parent_id),
            "state",
            "total",
            "fp",
            "gen",
            "allow",
            "cap",
            "tfp",
        )
    ]
    gen_s = _s(gen) if gen else ""
    if gen_s:
        root = plan(gen_s)
    if tfp is not None:  # added by a replacing add: the whole tree is compared
        same = _s(tfp) == tree_digest(root)
    else:  # added without one: its children's ids and queues and its settings
        same = (
            total is not None
            and int(total) == len(root.children)
            and (fp is None or _s(fp) == fingerprint(root))
            and (None if allow is None else int(allow)) == root.allow
            and (_s(cap) if cap is not None else "") == ("" if root.cap is None else str(root.cap))
        )
    if state is None or _s(state) == "replaced" or same:
        try:
            return (
                yield from add_flow(ks, root, new_queues, barrier=barrier, replan=plan, digest=True)
            )
        except FlowConflict as exc:
            # a flow compared without a digest may differ below its root (a leaf that became
            # a sub-flow, a sub-flow of other children): that is another flow - replace it
            if state is None or tfp is not None or exc.generation is not None:
                raise
    # another flow under this id: cancel it, delete its tree, reset the root, add gen n + 1
    yield from _cancel_tree(ks, queue, parent_id, "replaced by a new flow under the same id")
    (info,) = yield [_cancel_call(ks, queue, parent_id, "", "")]
    node = [parent_id, info[1], info[2], info[3], "", gen_s]
    yield from forget_tree(ks, [(queue, node)], SweepStats())
    keys = [*ks.queue_keys(queue), *ks.node_keys(queue, parent_id), ks.flows(queue, "completed")]
    (next_gen,) = yield [Call.lua("reset", keys, [parent_id])]
    return (
        yield from add_flow(
            ks, plan(_s(next_gen)), new_queues, barrier=barrier, replan=plan, digest=True
        )
    )
