"""Adding a flow: a parent held until its N children settle, children in any queue, trees to
any depth.

Adding is parent-first and fail-closed (DESIGN.md, "Adding a flow"):

1. step 0 holds the root on its slot: row in state ``held``, counter = N;
2. step k lands the nodes of depth k: leaves through ``land`` (row + parent fields + policy
   token + claimable, in one script), inner nodes through ``hold`` (held, with their own
   counter and parent fields), chunked per queue and sent as ONE pipeline per depth.

A node's parent is always held one step before the node lands, so no child can complete
before its counter exists. The first failing call raises; the root stays held. Every step is
idempotent by id (holding an existing parent does not reset it, landing an existing child
does not re-queue it), so the caller's retry of the same add converges to the flow that was
asked for, whatever a failed attempt left behind. An add of N leaves in one level costs two
round trips, whatever N (three when children have explicit ids: see below).

Another flow is never merged into this one:

* a parent records a fingerprint of its children (queues and ids): re-adding its id with other
  children is refused by ``hold`` (:class:`FlowConflict`), and of two different adds racing on
  one id exactly one holds;
* an explicit child id must be free: before anything is written, one read checks that no row
  of those ids belongs to anything else (a plain job, another flow). Two adds that race for
  one explicit id both pass that read; ``land`` refuses the loser's batch, and the loser's
  parent is failed naming the taken id (so no one waits on it for ever) before
  :class:`FlowConflict` is raised.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from ..checks import text as _s
from ..errors import FlowConflict
from ..models import FlowRef
from ..queues.adding import register
from ..wire.calls import CHUNK, Call, Lenient, Op, chunks
from ..wire.keyspace import Keyspace
from .plan import _Node

#: Children per piece of text :func:`fingerprint` hashes.
_FINGERPRINT_PIECE = 4096


def fingerprint(node: _Node) -> str:
    """A digest of a parent's children (queue and id of each, in order): what ``hold`` compares
    so that a re-add of the parent with other children is refused instead of merged.

    The digest of ``"<queue>\t<id>"`` lines joined by newlines, hashed a piece at a time, so
    the text of 1,000,000 children (about 100 MB) is never whole in memory: in a process
    whose fresh pages cost much to fault in (an Airflow task's, measured 1.25 s against
    0.12 s for the whole text in a bare process), the same few pages are reused instead."""
    digest = hashlib.blake2b(digest_size=12)
    children = node.children
    for start in range(0, len(children), _FINGERPRINT_PIECE):
        piece = children[start : start + _FINGERPRINT_PIECE]
        text = "\n".join([f"{c.queue}\t{c.id}" for c in piece])
        digest.update(f"\n{text}".encode() if start else text.encode())
    return digest.hexdigest()


def tree_digest(root: _Node) -> str:
    """A digest of a whole flow as planned - every node's queue, id, options, number of
    children and serialised payload, level by level: what ``add_flow(replace=True)`` keeps on
    the root and compares, so that a re-add of the same flow converges and any change below
    the root (a payload, a policy, a leaf that became a sub-flow) replaces it. Computed only
    for replacing adds (a level of 200,000 leaves is one join, not a call per node)."""
    h = hashlib.blake2b(digest_size=16)
    level = [root]
    while level:
        h.update(
            "\n".join(
                [
                    f"{n.queue}\t{n.id}\t{n.policy}\t{n.max_attempts}\t{n.timeout_ms}\t"
                    f"{n.priority}\t{n.cap}\t{n.allow}\t{len(n.children)}\t{len(n.payload)}"
                    for n in level
                ]
            ).encode()
        )
        h.update(b"".join([n.payload for n in level]))
        level = [c for n in level for c in n.children]
    return h.hexdigest()


def _hold_call(ks: Keyspace, node: _Node, barrier: bool = False, digest: str = "") -> Call:
    parent = node.parent
    up_id = parent.id if parent else ""
    up_queue = parent.queue if parent and parent.queue != node.queue else ""
    explicit: list[str] = []
    for child in () if node.uniform else node.children:  # uniform: derived ids only
        if not child.derived:
            explicit += [child.id, child.queue]
    return Call.lua(
        "hold",
        [
            *ks.queue_keys(node.queue),
            ks.job(node.queue, node.id),
            ks.dependencies(node.queue, node.id),
            ks.explicit(node.queue, node.id),
        ],
        [
            node.id,
            node.payload,
            len(node.children),
            node.max_attempts,
            up_id,
            up_queue,
            node.policy,
            fingerprint(node),
            "" if node.timeout_ms is None else node.timeout_ms,
            "1" if barrier else "",
            " ".join(
                sorted(
                    node.spread or {c.queue for c in node.children[: 1 if node.uniform else None]}
                )
            ),
            node.gen,
            "" if node.allow is None else f"{node.allow} {node.need}",
            "" if node.cap is None else node.cap,
            digest,
            "1" if node.stream else "",
            *explicit,
        ],
    )


def _explicit(root: _Node) -> list[_Node]:
    """The nodes below the root whose ids were given by the caller (not derived)."""
    out, todo = [], [root]
    while todo:
        node = todo.pop()
        if node.uniform:  # derived leaves only
            continue
        for child in node.children:
            if not child.derived:
                out.append(child)
            if child.children:
                todo.append(child)
    return out


def _check_free(ks: Keyspace, nodes: list[_Node]) -> Op[None]:
    """One read: refuse (:class:`FlowConflict`, nothing written) when an explicit child id
    names a row that belongs to anything but the node's own parent."""
    by_queue: dict[str, list[_Node]] = defaultdict(list)
    for node in nodes:
        by_queue[node.queue].append(node)
    calls, order = [], []
    for queue, members in by_queue.items():
        for part in chunks(members):
            calls.append(
                Call.lua(
                    "rows",
                    [ks.job(queue, n.id) for n in part],
                    ["payload", "parent", "total", "parent_queue"],
                )
            )
            order.append(part)
    replies = yield calls
    for part, rows in zip(order, replies, strict=True):
        for node, (payload, parent, total, up_queue) in zip(part, rows, strict=True):
            if not payload and not total:
                continue  # free
            up = node.parent
            assert up is not None
            mine = up.queue if up.queue != node.queue else ""
            if parent and _s(parent) == up.id and (_s(up_queue) if up_queue else "") == mine:
                continue  # this flow's own child: a retry
            owner = (
                f"a child of {_s(parent)}"
                if parent
                else ("a flow parent" if total else "a plain job")
            )
            if parent and _s(parent) == up.id:
                owner += " in another queue"  # a parent of the same id: another flow
            raise FlowConflict(
                f"child id {node.id} in queue {node.queue!r} is taken by {owner}, not free for "
                f"parent {node.parent.id}"
            )


def _fail_call(ks: Keyspace, parent: _Node, child_id: str, why: str) -> Call:
    """Fail ``parent`` naming ``child_id`` (a deliver of one 'f' record on its slot): what an
    add that lost a race for a child id leaves, so no one waits on its parent for ever."""
    return Call.lua(
        "deliver",
        [*ks.queue_keys(parent.queue), *ks.settle_keys(parent.queue, parent.id)],
        [parent.queue, 1, parent.id, 1, "f", child_id, f"not added: {why}"],
    )


def add_flow(
    ks: Keyspace,
    root: _Node,
    new_queues: Sequence[str] = (),
    *,
    barrier: bool = False,
    replan: Callable[[str], _Node] | None = None,
    digest: bool = False,
) -> Op[FlowRef]:
    """Check explicit child ids are free (only if there are any), hold the root, then land
    each depth of the tree in one pipelined step (registering ``new_queues`` in the first).

    A parent this add held *fresh* (its hold answered 1) cannot have children yet, so its
    children with derived ids land without the existence check - one command per child saved
    on the first attempt. Any retry finds the parent existing and checks every child.
    ``digest``: a root held fresh keeps its :func:`tree_digest` (what a replacing add
    compares).
    """
    explicit = _explicit(root)
    if explicit:
        yield from _check_free(ks, explicit)
    tfp = tree_digest(root) if digest else ""
    (held,) = yield Lenient([_hold_call(ks, root, barrier, tfp)])
    gen = _generation(held)
    if gen is not None and replan is not None and gen != root.gen:
        # the id holds a replaced flow of another generation: plan its ids, hold again
        root = replan(gen)
        tfp = tree_digest(root) if digest else ""
        (held,) = yield Lenient([_hold_call(ks, root, barrier, tfp)])
    if isinstance(held, Exception):
        raise held
    fresh = {root.id} if int(held) == 1 else set()
    parents = [root]  # the nodes whose children land in this step (each has at least one)
    registry = register(ks, new_queues)  # after the hold: a refused add registers nothing
    while parents:
        holds = [n for up in parents if not up.uniform for n in up.children if n.children]
        owners: list[_Node] = [n.parent for n in holds]  # type: ignore[misc]
        calls = Lenient([*registry, *(_hold_call(ks, n) for n in holds)])
        runs = _runs(parents, fresh)
        first, rest = _first_landings(runs)
        lands, land_owners = _land_calls(ks, first)
        replies = yield Lenient([*calls, *lands])
        owners += land_owners
        if rest:  # formed while the first land call of each queue is claimable already
            lands, land_owners = _land_calls(ks, rest)
            replies = [*replies, *(yield Lenient(lands))]
            owners += land_owners
        registered, replies = replies[: len(registry)], replies[len(registry) :]
        if not any(isinstance(r, Exception) for r in registered):
            registry = []  # else it rides again with the next step (SADD is idempotent)
        yield from _settle_errors(ks, owners, replies)
        fresh = {n.id for n, r in zip(holds, replies, strict=False) if int(r) == 1}
        parents = holds
    if registry:
        # the registry's write failed with every step (on a Cluster it may live on a node the
        # rest never touched): raise, so the caller's retry, which converges, registers again
        yield registry
    return FlowRef(root.queue, root.id, tuple((c.queue, c.id) for c in root.children))


def _runs(parents: Sequence[_Node], fresh: set[str]) -> list[tuple[_RunKey, list[_Node]]]:
    """The land runs of the leaf children of ``parents`` (``fresh``: the ids of those this add
    held fresh, whose derived children land unchecked)."""
    # consecutive leaves of one queue that share their parent and options share a land
    # call; calls of one queue keep the given order, so children are claimable in the
    # order given whatever their options (a run breaks where the options change)
    runs: list[tuple[_RunKey, list[_Node]]] = []
    last: dict[str, int] = {}  # queue -> its current run
    for top in parents:
        if top.uniform:  # the runs the loop below would form, without a look at each child
            one = top.children[0]
            check = "0" if top.id in fresh else "1"
            for queue, kids in (top.spread or {one.queue: list(top.children)}).items():
                last[queue] = len(runs)
                key = (
                    queue,
                    check,
                    top.id,
                    one.policy,
                    one.max_attempts,
                    one.timeout_ms,
                    one.priority,
                )
                runs.append((key, kids))
            continue
        for node in top.children:
            if node.children:
                continue
            check = "0" if node.derived and top.id in fresh else "1"
            key = (
                node.queue,
                check,
                top.id,
                node.policy,
                node.max_attempts,
                node.timeout_ms,
                node.priority,
            )
            at = last.get(node.queue)
            if at is None or runs[at][0] != key:
                last[node.queue] = at = len(runs)
                runs.append((key, []))
            runs[at][1].append(node)
    return runs


#: What leaves share to share a land call: queue, check, parent id, policy, attempts, time
#: limit, priority.
_RunKey = tuple[str, str, str, str, int, int | None, int]
#: A land run: its key and its leaves, in order.
_Run = tuple[_RunKey, Sequence[_Node]]

#: A depth with more land calls than one per queue plus this many lands in two steps (below).
EARLY_AFTER = 3


def _first_landings(runs: Sequence[_Run]) -> tuple[Sequence[_Run], list[_Run]]:
    """Split one depth's land runs so its first children are claimable before the rest is
    formed and sent: the first land call of each queue (its first :data:`CHUNK` children) goes
    in the step with the holds and the registry; every other call - when there are more than
    :data:`EARLY_AFTER` of them - in a second step, in order (so each queue's calls keep
    theirs), formed only once the first step is on its way. A 1,000,000-child depth is 2,000
    land calls: forming and packing them takes the client about a second, which the workers
    can now spend on the first 500 children of each queue. One round trip more; a small depth
    stays one step. Returns the runs of the first step and those of the second (none)."""
    calls = sum(-(-len(nodes) // CHUNK) for _, nodes in runs)
    if calls - len({key[0] for key, _ in runs}) <= EARLY_AFTER:
        return runs, []
    first: list[_Run] = []
    rest: list[_Run] = []
    seen: set[str] = set()  # the queues with a land call in the first step
    for key, nodes in runs:
        if key[0] in seen:
            rest.append((key, nodes))
            continue
        seen.add(key[0])
        first.append((key, nodes[:CHUNK]))
        if len(nodes) > CHUNK:
            rest.append((key, nodes[CHUNK:]))
    return first, rest


def _land_calls(ks: Keyspace, runs: Sequence[_Run]) -> tuple[list[Call], list[_Node]]:
    """The ``land`` calls of ``runs`` (at most :data:`CHUNK` leaves each) and their parents."""
    calls: list[Call] = []
    owners: list[_Node] = []
    for (queue, check, _, policy, attempts, limit, priority), nodes in runs:
        up = nodes[0].parent
        assert up is not None
        fixed = ks.queue_keys(queue)
        rows = ks.job_prefix(queue)  # ids were checked by plan()
        up_queue = up.queue if up.queue != queue else ""
        share = up.shares.get(queue) if up.shares else None
        gate = [] if share is None else ks.gate_keys(queue, up.queue, up.id)
        fair = ks.fair(queue)
        for part in chunks(nodes):
            argv: list[Any] = [check, up.id, up_queue, policy, attempts]
            argv += ["" if limit is None else limit, priority, "" if share is None else share]
            derived = _derived(part)
            argv += ("", "") if derived is None else derived
            land_records(argv, part, derived is None)
            keys = [*fixed, *[rows + n.id for n in part], fair, *gate]
            calls.append(Call.lua("land", keys, argv))
            owners.append(up)
    return calls, owners


def land_records(argv: list[Any], part: Sequence[Any], ids: bool) -> None:
    """Append the ``grouped`` flag of a land call and its children's records to ``argv``: each
    child's id (when ``ids``: no stem), its payload, and its group when any child of ``part``
    has one (lua/land.lua)."""
    grouped = any(n.group is not None for n in part)
    argv.append("1" if grouped else "")
    if not grouped and not ids:  # the usual derived children: payloads only
        argv += [n.payload for n in part]
        return
    for n in part:
        if ids:
            argv.append(n.id)
        argv.append(n.payload)
        if grouped:
            argv.append(n.group or "")


def _derived(part: Sequence[_Node]) -> tuple[str, int] | None:
    """(stem, first index) when every child of a land call has a derived id (its parent's
    stem and its index) and the indexes run without a gap, else None. Siblings keep their
    order, so with strictly increasing indexes the first and the last id tell."""
    first = part[0].id
    cut = first.rfind(".") + 1
    if cut == 0 or not all(n.derived for n in part):
        return None
    stem, tail = first[:cut], first[cut:]
    if not (tail.isascii() and tail.isdigit()):
        return None
    start = int(tail)
    if first != f"{stem}{start}":  # a leading zero: not an index as plan() writes it
        return None
    return (stem, start) if part[-1].id == f"{stem}{start + len(part) - 1}" else None


def _generation(reply: Any) -> str | None:
    """The generation named by a hold refused for planning another one ('' for 0)."""
    return reply.generation if isinstance(reply, FlowConflict) else None


def _settle_errors(ks: Keyspace, owners: list[_Node], replies: list[Any]) -> Op[None]:
    """Raise the first error of a step; a child id taken by another flow (a lost race) first
    fails the parent that wanted it, naming the id."""
    conflicts: dict[str, tuple[_Node, str]] = {}
    first: Exception | None = None
    for owner, reply in zip(owners, replies, strict=True):
        if isinstance(reply, Exception):
            first = first or reply
            # "<id> is taken by ...": the flow can never complete; any other conflict (a node of
            # this very flow re-added with other children) is a refusal that changes nothing
            taken = reply.taken if isinstance(reply, FlowConflict) else None
            if taken and owner.id not in conflicts:
                conflicts[owner.id] = (owner, taken)
    if conflicts:
        yield [_fail_call(ks, node, taken, "id is taken") for node, taken in conflicts.values()]
    if first is not None:
        raise first
