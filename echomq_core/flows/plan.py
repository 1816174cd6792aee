"""Flows: a parent held until its N children settle, children in any queue, trees to any depth.

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

import difflib
import hashlib
import json
import math
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

from ..checks import MAX_ATTEMPTS, as_bytes, check_int, timeout_ms, unserialisable
from ..checks import text as _s
from ..errors import (
    FlowConflict,
    InvalidArgument,
    InvalidFlow,
    InvalidInput,
    InvalidPayload,
    JobNotFound,
)
from ..models import (
    FAIL_PARENT,
    IGNORE,
    Child,
    FlowCap,
    FlowRef,
    FlowSnapshot,
    FlowSummary,
    Serializer,
)
from ..queues.ops import CHUNK, chunks, register
from ..wire.calls import Call, Lenient, Op, scored
from ..wire.keyspace import MAX_ID_LENGTH, Keyspace, check_job_id, check_queue, child_stem

T = TypeVar("T")

#: The deepest tree an add accepts: each level costs one round trip, and the planner recurses.
MAX_DEPTH = 100
#: The highest (least urgent) priority, as add.lua's: scores stay exact below 2^53.
MAX_PRIORITY = 800


@dataclass(slots=True)
class _Node:
    queue: str
    id: str
    payload: bytes
    max_attempts: int
    parent: _Node | None  # a link up, so the tree is a cycle: unlink() breaks it after an add
    policy: str
    children: Sequence[_Node]  # a leaf's: the one shared empty tuple (no list per leaf)
    derived: bool = False  # the id was derived from the parent's (no explicit id given)
    timeout_ms: int | None = None  # the handler's time limit; None: the queue's
    gen: str = ""  # a root that replaced older flows under its id: their number
    priority: int = 0  # a leaf's: 0..800, lower runs first
    cap: int | None = None  # a parent's max_running over its own leaf children
    shares: dict[str, int] | None = None  # with a cap: each leaf queue's share of it
    allow: int | None = None  # a success threshold: how many fail-parent children may die
    need: str = ""  # the threshold as given: a count "<c>" or an exact fraction "<p>/<q>"
    stream: bool = False  # a root that keeps a settle log (add_flow(stream=True))
    # its children are all leaves with derived ids, of one queue, with the same options: one
    # run of land calls, which add_flow() forms without looking at each child
    uniform: bool = False
    # a uniform node whose children's queue is sharded: its children by shard, each in their
    # order (sharding.place), one run of land calls per shard
    spread: dict[str, list[_Node]] | None = None


def new_parent_id() -> str:
    return "JOB-" + uuid.uuid4().hex


def allowance(where: str, min_success: Any, n: int) -> int | None:
    """How many of a node's ``n`` children may die without failing it, for ``min_success``: a
    fraction in (0, 1] (``ceil(min_success * n)`` must succeed, read as the decimal it is
    written as, so ``0.99`` of 200,000 requires 198,000), or an int count in 1..n; None for
    no threshold. :class:`InvalidArgument` naming the value otherwise (a bool, a string, a
    fraction outside (0, 1], a count above ``n`` or below 1)."""
    if min_success is None:
        return None
    if isinstance(min_success, bool) or not isinstance(min_success, int | float):
        raise InvalidArgument(
            f"{where}: min_success must be a fraction in (0, 1] or an int count of children, "
            f"got {min_success!r:.80}"
        )
    if isinstance(min_success, int):
        if not 1 <= min_success <= n:
            raise InvalidArgument(
                f"{where}: min_success={min_success!r} is a count of children: it must be "
                f"between 1 and the {n} children"
            )
        return n - min_success
    if not 0 < min_success <= 1:  # NaN fails this too
        raise InvalidArgument(
            f"{where}: min_success={min_success!r} is a fraction: it must be in (0, 1] "
            "(an int is a count of children)"
        )
    required = math.ceil(Fraction(str(min_success)) * n)
    return n - max(1, required)


def requirement(min_success: Any) -> str:
    """A valid ``min_success`` (see :func:`allowance`) as the server keeps it, to apply it
    again when the flow grows (spawn.lua): a count ``"<c>"`` or the exact decimal fraction
    ``"<p>/<q>"``."""
    if isinstance(min_success, int):
        return str(min_success)
    exact = Fraction(str(min_success))
    return f"{exact.numerator}/{exact.denominator}"


def child_list(children: Any, where: str) -> list[Child] | tuple[Child, ...]:
    """``children`` as a sequence: a list or tuple as it is (no copy), any other iterable of
    :class:`Child` (a generator) read once into a list. :class:`InvalidFlow` naming ``where``
    for what is not an iterable of children (a single ``Child``, a string, a mapping)."""
    if isinstance(children, list | tuple):
        return children
    if isinstance(children, Child | str | bytes | Mapping) or not isinstance(children, Iterable):
        raise InvalidFlow(
            f"{where}: children must be an iterable of echomq_core.Child (a list, a generator), "
            f"got {type(children).__name__}"
        )
    return list(children)


def plan(
    queue: str,
    parent_id: str,
    payload: bytes,
    children: Iterable[Child],
    *,
    default_attempts: int,
    dumps: Any,
    max_payload: int,
    gen: str = "",
    max_running: int | None = None,
    min_success: Any = None,
) -> _Node:
    """Validate a flow and give every node its queue, id and serialised payload.

    ``children`` and a ``Child``'s ``children``: any iterable of :class:`Child`; each is read
    once (:func:`child_list`: a list is used as it is; a sub-flow's generator is kept on its
    ``Child`` as the list read, for a re-plan).

    Raises :class:`InvalidFlow` (no children, not an iterable of ``Child``, duplicate ids, a
    child with its parent's id, a sub-flow reached twice, a child that neither fails its
    parent nor is ignored, a policy flag that is not a bool, a tree deeper than
    :data:`MAX_DEPTH`), :class:`InvalidArgument` (a bad
    ``min_success``, of the root or of a ``Child``; see :func:`allowance`; a bad
    ``max_running`` or ``priority``), :class:`~echomq_core.errors.InvalidPayload` (a payload
    ``dumps`` raises on, returns neither bytes nor str for, or makes longer than
    ``max_payload``) and the keyspace errors for bad queues and ids - all before anything is
    sent.
    """
    check_queue(queue)
    check_job_id(parent_id)
    root = _Node(queue, parent_id, payload, default_attempts, None, "fp", ())
    root.gen = gen
    root.cap = _cap("max_running", max_running)
    capped = [root] if root.cap is not None else []
    root_stem = child_stem(parent_id, gen)
    seen_ids = {parent_id}
    seen_nodes: set[int] = set()  # the sub-flows met (by object): a leaf may come twice
    good_queues = {queue}

    # The loop below runs once per child of flows of 100,000s: the checks are ordered so that
    # the common child (no id, no queue, default options) costs set lookups, not regexes. A
    # derived id is its (checked) parent's id plus ".<index>": only its length can be wrong.

    def build(parent: _Node, specs: Sequence[Child], path: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise InvalidFlow(f"flow {parent_id!r} is deeper than {MAX_DEPTH} levels")
        if not specs:
            raise InvalidFlow(f"flow node {path} has no children; a flow needs at least one")
        # a replaced flow's generation n derives <root>.g<n>.<i>: never an old child's id
        stem = root_stem if parent is root else child_stem(parent.id)
        kids: list[_Node] = []
        parent.children = kids
        uniform, first = True, None  # see _Node.uniform; first: the first child's options
        for index, spec in enumerate(specs):
            if not isinstance(spec, Child):
                raise InvalidFlow(
                    f"child {index} of {path} is a {type(spec).__name__}, not echomq_core.Child"
                )
            sub: Any = spec.children  # a leaf's is an empty list: one falsy test
            if sub and type(sub) is not list:  # a generator is read once and kept, for re-plans
                sub = spec.children = child_list(sub, f"child {index} of {path}")
            fail_parent, ignore = spec.fail_parent_on_failure, spec.ignore_dependency_on_failure
            if fail_parent is not True or ignore is not False:  # the default: fp, checked
                if type(fail_parent) is not bool or type(ignore) is not bool:
                    raise InvalidFlow(
                        f"child {index} of {path}: fail_parent_on_failure and "
                        "ignore_dependency_on_failure must be True or False, got "
                        f"{(fail_parent, ignore)!r}"
                    )
                if not fail_parent and not ignore:
                    raise InvalidFlow(
                        f"child {index} of {path}: a child must fail its parent or be "
                        "ignored on failure (set ignore_dependency_on_failure=True)"
                    )
            child_queue = parent.queue if spec.queue is None else spec.queue
            if child_queue not in good_queues:
                good_queues.add(check_queue(child_queue))
            if spec.id is None:  # unique among derived ids (a path): see _check_unique()
                child_id = f"{stem}{index}"
                if len(child_id) > MAX_ID_LENGTH:
                    check_job_id(child_id)  # raises InvalidJobId, naming the id
            else:
                child_id = check_job_id(spec.id)
                if child_id == parent.id:
                    raise InvalidFlow(f"child {index} of {path} has its parent's id {child_id!r}")
                if child_id in seen_ids:
                    raise InvalidFlow(f"duplicate job id {child_id!r} in flow {parent_id!r}")
                seen_ids.add(child_id)
            attempts = spec.max_attempts
            if attempts is None:
                attempts = default_attempts
            elif type(attempts) is not int or not 1 <= attempts <= MAX_ATTEMPTS:
                raise InvalidFlow(
                    f"child {child_id}: max_attempts must be an int between 1 and "
                    f"{MAX_ATTEMPTS}, got {attempts!r}"
                )
            limit = (
                None
                if spec.timeout is None
                else timeout_ms(f"child {child_id} timeout", spec.timeout)
            )
            try:
                body = dumps(spec.payload)
            except InvalidPayload:
                raise
            except Exception as exc:
                raise unserialisable(exc) from None
            if type(body) is not bytes:
                body = as_bytes(body)
            if len(body) > max_payload:
                raise InvalidPayload(
                    f"payload of {child_id} is {len(body)} bytes; the limit is {max_payload}"
                )
            policy = IGNORE if ignore else FAIL_PARENT
            node = _Node(
                child_queue, child_id, body, attempts, parent, policy, (), spec.id is None, limit
            )
            if spec.priority != 0 or spec.max_running is not None:
                _options(node, spec, bool(sub))
                if node.cap is not None:
                    capped.append(node)
            kids.append(node)
            if uniform:
                if spec.id is not None or sub:
                    uniform = False
                elif first is None:
                    first = node
                elif (
                    child_queue != first.queue
                    or attempts != first.max_attempts
                    or policy != first.policy
                    or limit != first.timeout_ms
                    or node.priority != first.priority
                ):
                    uniform = False
            if sub:
                # a sub-flow met twice would be planned twice, or for ever (a cycle); a leaf
                # Child met twice is two children with the same payload ([Child(x)] * 3)
                if id(spec) in seen_nodes:
                    raise InvalidFlow(
                        f"child {index} of {path} is a sub-flow that appears twice in the tree "
                        "(a cycle, or one Child with children given twice)"
                    )
                seen_nodes.add(id(spec))
                build(node, sub, child_id, depth + 1)  # noqa: F821 (del: below)
            if spec.min_success is not None:
                if not sub:
                    raise InvalidArgument(
                        f"child {child_id}: min_success={spec.min_success!r} is for a child "
                        "with children (a sub-flow)"
                    )
                node.allow = allowance(f"child {child_id}", spec.min_success, len(node.children))
                node.need = requirement(spec.min_success)
        parent.uniform = uniform

    try:
        build(root, child_list(children, f"flow {parent_id}"), parent_id, 1)
    finally:
        # build() is recursive: its closure holds itself, a cycle that would keep the whole
        # tree (through root, in the same closure) for the cyclic collector; see unlink()
        del build
    if len(seen_ids) > 1:  # ids given: a derived id may be one of them
        _check_unique(root, parent_id)
    for node in capped:
        node.shares = split_cap(node)
    root.allow = allowance(f"flow {parent_id}", min_success, len(root.children))
    if root.allow is not None:
        root.need = requirement(min_success)
    return root


def _check_unique(root: _Node, flow_id: str) -> None:
    """:class:`InvalidFlow` naming the first id (in the order plan() meets them) that a node of
    the tree shares with one before it. Derived ids alone cannot collide (each is a path of
    indexes below the root), so plan() checks them in this walk only when ids were given."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if node.id in seen:
            raise InvalidFlow(f"duplicate job id {node.id!r} in flow {flow_id!r}")
        seen.add(node.id)
        todo.extend(reversed(node.children))


def unlink(roots: Sequence[_Node]) -> None:
    """Drop the planned trees' links up once their add is over, so that reference counting
    frees them. Linked, each tree is a cycle, which only the cyclic collector frees: after an
    add of 1,000,000 children that collection walks 2,000,000 objects (about 1 s on the
    benchmark machine), and it comes in the caller's code, when the collector runs next."""
    todo = list(roots)
    while todo:
        node = todo.pop()
        node.parent = node.spread = None
        if node.children:
            todo.extend(node.children)


def _cap(name: str, value: Any) -> int | None:
    """A ``max_running`` value: None, or an int >= 1 (not a bool)."""
    if value is None:
        return None
    return check_int(name, value, 1)


def _options(node: _Node, spec: Child, inner: bool) -> None:
    """A child's priority (a leaf's) and cap (a sub-flow's), checked."""
    if spec.priority != 0:
        if inner:
            raise InvalidArgument(
                f"child {node.id}: priority applies to a leaf; a sub-flow's parent is released "
                f"to the front of its queue (got priority={spec.priority!r})"
            )
        node.priority = check_int(f"child {node.id} priority", spec.priority, 0, MAX_PRIORITY)
    if spec.max_running is not None:
        if not inner:
            raise InvalidArgument(
                f"child {node.id}: max_running applies to a child with children, "
                f"got max_running={spec.max_running!r} on a leaf"
            )
        node.cap = _cap(f"child {node.id} max_running", spec.max_running)


def split_cap(node: _Node) -> dict[str, int]:
    """Split a node's cap K over the queues of its leaf children, so that each share is
    counted on one queue's slot (the claim's) and the shares sum to exactly K: in proportion
    to each queue's leaf children, largest remainder, at least 1 each. A queue whose children
    all finished idles its share (the cost of staying single-slot: no token crosses slots).
    A queue with fewer children than its share never fills it. Inner nodes (sub-flows) hold
    no token: they run nothing while held, and a released one is not its parent's leaf.

    Raises :class:`InvalidArgument` when K is below the number of leaf queues (a queue's
    share cannot be 0)."""
    assert node.cap is not None
    counts: dict[str, int] = {}
    for child in node.children:
        if not child.children:
            counts[child.queue] = counts.get(child.queue, 0) + 1
    k = node.cap
    if len(counts) > k:
        raise InvalidArgument(
            f"max_running={k} of {node.id} is below the number of queues its children run in "
            f"({len(counts)}: {', '.join(sorted(counts))}); each queue needs a share of at "
            "least 1"
        )
    if not counts:
        return {}
    total = sum(counts.values())
    shares = {q: max(1, k * n // total) for q, n in counts.items()}
    spare = k - sum(shares.values())
    # largest remainder first (ties by queue name, so every add splits the same way)
    order = sorted(counts, key=lambda q: (-((k * counts[q]) % total), q))
    i = 0
    while spare > 0:
        shares[order[i % len(order)]] += 1
        spare -= 1
        i += 1
    while spare < 0:  # the minimum of 1 took more than K gives: take back from the largest
        big = max(shares, key=lambda q: (shares[q], q))
        shares[big] -= 1
        spare += 1
    return shares


def queues_of(root: _Node) -> set[str]:
    """Every queue a planned flow touches."""
    out, todo = set(), [root]
    while todo:
        node = todo.pop()
        out.add(node.queue)
        if node.uniform:  # leaves of one queue (of its shards, when spread)
            out.update(node.spread or (node.children[0].queue,))
        else:
            todo.extend(node.children)
    return out


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


def child_candidates(
    node_id: str, total: int, child_queues: str, explicit: Sequence[Any], gen: str = ""
) -> dict[str, list[str]]:
    """Per child queue, the ids a node's children may have there: every derived id
    (``<id>.<i>``, or ``<id>.g<gen>.<i>`` in a replaced flow's generation) and the explicit ids
    recorded for that queue. Scripts skip a candidate without a row of that parent, so a
    derived id that was given explicitly instead costs one lookup, nothing more."""
    stem = child_stem(node_id, gen)
    derived = [f"{stem}{i}" for i in range(total)]
    given: dict[str, list[str]] = defaultdict(list)
    for i in range(0, len(explicit), 2):
        given[_s(explicit[i + 1])].append(_s(explicit[i]))
    return {queue: derived + given.get(queue, []) for queue in child_queues.split()}


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
        for part in chunks(nodes):
            argv: list[Any] = [check, up.id, up_queue, policy, attempts]
            argv += ["" if limit is None else limit, priority, "" if share is None else share]
            derived = _derived(part)
            if derived is None:
                argv += ("", "")
                for n in part:
                    argv += [n.id, n.payload]
            else:  # the stem and the first index, then the payloads (land.lua)
                argv += derived
                argv += [n.payload for n in part]
            keys = [*fixed, *[rows + n.id for n in part], *gate]
            calls.append(Call.lua("land", keys, argv))
            owners.append(up)
    return calls, owners


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


# -- reads: pure, one read command each ---------------------------------------------------


def pairs(flat: Any) -> dict[str, bytes]:
    """A hash read (a dict, or a flat list from a script) as {field: raw value}."""
    if isinstance(flat, dict):
        return {_s(k): v for k, v in flat.items()}
    return {_s(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


#: How many known queue names a missing flow's error lists.
SHOWN_QUEUES = 20


def missing_flow(prefix: str, queue: str, parent_id: str, names: Sequence[str]) -> JobNotFound:
    """The error of a read of flow ``parent_id`` in ``queue`` that is not there, given the
    keyspace's registered queue names: when ``queue`` is not one of them, the closest ones
    are suggested (as ``echomq queue stats`` does), since a typo'd queue or prefix is the
    likeliest cause; else the id is wrong, the flow was never added, or its retention ended."""
    why = "never added (a wrong id?), or expired with its retention"
    known = sorted(set(names))
    if queue in known:
        return JobNotFound(f"no flow {parent_id!r} in queue {queue!r}: {why}")
    if not known:
        return JobNotFound(
            f"no flow {parent_id!r} in queue {queue!r}: there are no queues under prefix "
            f"{prefix!r} (wrong prefix?)"
        )
    close = difflib.get_close_matches(queue, known, n=3, cutoff=0.6)
    listed = [*close, *(n for n in known if n not in close)][:SHOWN_QUEUES]
    more = f" and {len(known) - len(listed):,} more" if len(known) > len(listed) else ""
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return JobNotFound(
        f"no flow {parent_id!r} in queue {queue!r}: no queue {queue!r} under prefix "
        f"{prefix!r}{hint} (known: {', '.join(listed)}{more})"
    )


def not_found(ks: Keyspace, queue: str, parent_id: str) -> Op[JobNotFound]:
    """:func:`missing_flow` with the registry read (one round trip, on the error path only)."""
    (members,) = yield [Call.cmd("SMEMBERS", ks.queues())]
    return missing_flow(ks.prefix, queue, parent_id, [_s(m) for m in members])


def explained(ks: Keyspace, queue: str, parent_id: str, op: Op[T]) -> Op[T]:
    """``op``, a read of flow ``parent_id`` (of logical queue ``queue``) that raises
    :class:`JobNotFound` when there is no such flow; that error is replaced by
    :func:`not_found`'s, which names the queue and suggests the closest registered ones."""
    try:
        return (yield from op)
    except JobNotFound:
        pass
    raise (yield from not_found(ks, queue, parent_id)) from None


def _absent(queue: str, parent_id: str) -> JobNotFound:
    # the bare error of the reads below; the clients replace it through explained()
    return JobNotFound(f"no flow {parent_id!r} in queue {queue!r}")


def _of_flow(ks: Keyspace, queue: str, parent_id: str, read: Call) -> Op[Any]:
    """The reply of ``read``, a read of flow ``parent_id``'s keys, with the flow's row checked
    in the same round trip (EXISTS beside it, on the same slot): :class:`JobNotFound` when
    there is no such flow, so a typo'd id is not an empty result."""
    reply, exists = yield [read, Call.cmd("EXISTS", ks.job(queue, parent_id))]
    if not exists:
        raise _absent(queue, parent_id)
    return reply


def children_values(
    ks: Keyspace, queue: str, parent_id: str, ser: Serializer
) -> Op[dict[str, Any]]:
    """{child id: result} of every child that completed so far (HGETALL of ``:processed``);
    :class:`JobNotFound` when there is no such flow."""
    flat = yield from _of_flow(
        ks, queue, parent_id, Call.cmd("HGETALL", ks.processed(queue, parent_id))
    )
    return {k: ser.loads(v) for k, v in pairs(flat).items()}


def dependencies(ks: Keyspace, queue: str, parent_id: str) -> Op[int]:
    """Outstanding children (GET of ``:dependencies``); 0 when there is no counter (a plain
    job); :class:`JobNotFound` when there is no such row."""
    value = yield from _of_flow(
        ks, queue, parent_id, Call.cmd("GET", ks.dependencies(queue, parent_id))
    )
    return max(0, int(value)) if value is not None else 0


def ignored_failures(ks: Keyspace, queue: str, parent_id: str) -> Op[dict[str, str]]:
    """{child id: error} of children that died under ignore-dependency (``:unsuccessful``);
    :class:`JobNotFound` when there is no such flow."""
    flat = yield from _of_flow(
        ks, queue, parent_id, Call.cmd("HGETALL", ks.unsuccessful(queue, parent_id))
    )
    return {k: _s(v) for k, v in pairs(flat).items()}


def failed_children(ks: Keyspace, queue: str, parent_id: str) -> Op[dict[str, str]]:
    """{child id: error} of children that died and failed the parent (``:failed``);
    :class:`JobNotFound` when there is no such flow."""
    flat = yield from _of_flow(
        ks, queue, parent_id, Call.cmd("HGETALL", ks.failed(queue, parent_id))
    )
    return {k: _s(v) for k, v in pairs(flat).items()}


def check_exists(ks: Keyspace, queue: str, parent_id: str) -> Op[None]:
    """:class:`JobNotFound` when there is no row ``parent_id`` in ``queue`` (one EXISTS): for
    a read whose own reply cannot tell an empty flow from no flow, asked only when empty."""
    (exists,) = yield [Call.cmd("EXISTS", ks.job(queue, parent_id))]
    if not exists:
        raise _absent(queue, parent_id)


def first_page(
    ks: Keyspace, queue: str, parent_id: str, count: int
) -> Op[tuple[int, dict[str, bytes]]]:
    """The first HSCAN page of ``:processed`` (as :func:`scan_page`): :class:`JobNotFound`
    when there is no such flow."""
    scan = Call.cmd("HSCAN", ks.processed(queue, parent_id), 0, "COUNT", count)
    nxt, flat = yield from _of_flow(ks, queue, parent_id, scan)
    return int(nxt), pairs(flat)


def child_queues(ks: Keyspace, queue: str, parent_id: str) -> Op[list[str]]:
    """The queues of a flow node's direct children, as its hold recorded them (HGET of the
    row's ``cq``); [] when there is no such flow. A Pump serving these queues' outboxes
    delivers the node's cross-queue children."""
    (raw,) = yield [Call.cmd("HGET", ks.job(queue, parent_id), "cq")]
    return _s(raw).split() if raw else []


def scan_page(key: str, cursor: int, count: int) -> Op[tuple[int, dict[str, bytes]]]:
    """One HSCAN page of a result hash: (next cursor, {field: raw value}); cursor 0 ends."""
    ((nxt, flat),) = yield [Call.cmd("HSCAN", key, cursor, "COUNT", count)]
    return int(nxt), pairs(flat)


def ref_body(queue: str, parent_id: str) -> str:
    """What a named reference to a flow holds (compared when the flow expires)."""
    return json.dumps({"queue": queue, "parent_id": parent_id})


def save_ref(ks: Keyspace, name: str, ref: FlowRef) -> Op[None]:
    """Store ``ref`` under ``name`` (overwriting), and note the name on the flow's root, so
    the reference is deleted with the flow when it expires."""
    yield [
        Call.cmd("SET", ks.ref(name), ref_body(ref.queue, ref.parent_id)),
        Call.lua("note_ref", [ks.job(ref.queue, ref.parent_id)], [name]),
    ]


def load_ref(ks: Keyspace, name: str) -> Op[FlowRef | None]:
    """The reference stored under ``name``, or None."""
    (raw,) = yield [Call.cmd("GET", ks.ref(name))]
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:  # written by something else: refused by type, like a bad mapping
        raise InvalidInput(f"reference {name!r} does not hold JSON: {raw[:80]!r}") from None
    return FlowRef.from_dict(data)


def snapshot(ks: Keyspace, queue: str, parent_id: str) -> Op[FlowSnapshot]:
    """Parent state, N, outstanding, the three record counts, a threshold's allowance and a
    cap, read atomically."""
    ((state, total, deps, processed, ignored, failed, error, repairs, *rest),) = yield [
        Call.lua(
            "flow_snapshot",
            [*ks.queue_keys(queue), *ks.parent_keys(queue, parent_id)],
            [parent_id],
        )
    ]
    return FlowSnapshot(
        queue,
        parent_id,
        _s(state) if state else None,
        int(total) if total else 0,
        max(0, int(deps)) if deps else 0,
        int(processed),
        int(ignored),
        int(failed),
        _s(error) if error else None,
        int(repairs),
        int(rest[0]) if rest and rest[0] is not None else None,
        int(rest[1]) if len(rest) > 1 and rest[1] is not None else None,
    )


def flow_cap(ks: Keyspace, queue: str, parent_id: str) -> Op[FlowCap | None]:
    """A node's cap and how much of it is in use (two round trips: the row's cap and child
    queues, then each child queue's gate); None when the node has no cap (or no row)."""
    ((cap, cq),) = yield [Call.cmd("HMGET", ks.job(queue, parent_id), "cap", "cq")]
    if cap is None:
        return None
    queues = _s(cq).split() if cq else []
    calls = []
    for child_queue in queues:
        waiting, counts = ks.gate_keys(child_queue, queue, parent_id)
        calls += [Call.cmd("HMGET", counts, "admitted", "cap"), Call.cmd("ZCARD", waiting)]
    replies = (yield calls) if calls else []
    shares: dict[str, tuple[int, int]] = {}
    waiting_total = 0
    for i, child_queue in enumerate(queues):
        (admitted, share), waiting = replies[2 * i], replies[2 * i + 1]
        if share is not None:
            shares[child_queue] = (int(admitted or 0), int(share))
        waiting_total += int(waiting)
    return FlowCap(
        queue,
        parent_id,
        int(cap),
        sum(a for a, _ in shares.values()),
        waiting_total,
        shares,
    )


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


def list_flows(
    ks: Keyspace, queue: str, states: Sequence[str], *, offset: int, limit: int
) -> Op[list[FlowSummary]]:
    """Root flows of ``queue`` in ``states`` (each state's index, oldest first): a page of
    ``limit`` starting at ``offset`` of each index. Two round trips."""
    ranges = yield [
        Call.cmd("ZRANGE", ks.flows(queue, state), offset, offset + limit - 1, "WITHSCORES")
        for state in states
    ]
    found: list[tuple[str, str, float]] = []
    for state, flat in zip(states, ranges, strict=True):
        for member, score in scored(flat):
            found.append((state, _s(member), float(score)))
    if not found:
        return []
    calls = [Call.cmd("TIME")]
    for _, pid, _ in found:
        calls.append(
            Call.cmd(
                "HMGET",
                ks.job(queue, pid),
                "state",
                "total",
                "created",
                "error",
                "cap",
                "allow",
                "tolerated",
            )
        )
        calls.append(Call.cmd("GET", ks.dependencies(queue, pid)))
    (now_s, now_us), *replies = yield calls
    now_ms = int(now_s) * 1000 + int(now_us) // 1000
    out = []
    for i, (index, pid, since) in enumerate(found):
        (state, total, created, error, cap, allow, tolerated) = replies[2 * i]
        deps = replies[2 * i + 1]
        n = int(total) if total else 0
        out.append(
            FlowSummary(
                queue,
                pid,
                # a completed root's row still says 'pending' (membership of `completed`
                # says it finished, complete.lua): its index says what it is
                _s(state) if state and index != "completed" else index,
                n,
                n - (max(0, int(deps)) if deps is not None else 0),
                (now_ms - int(created)) / 1000 if created else None,
                (now_ms - int(since)) / 1000,
                _s(error) if error else None,
                None if cap is None else int(cap),
                None if allow is None else int(allow),
                int(tolerated or 0),
            )
        )
    return out
