"""The plan of a flow: the tree a caller gives (:class:`~echomq_core.Child` specs) checked and
turned into nodes - each with its queue, id, serialised payload and options - before anything
is sent (:func:`plan`); :mod:`echomq_core.flows.add` then adds the planned tree.

A child without an id of its own gets one derived from its parent's (``<parent>.<index>``, or
``<root>.g<gen>.<index>`` in a replaced flow's generation): what :func:`child_candidates` lists
again when a flow's tree is walked (cancel, repair, expiry).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ..checks import MAX_ATTEMPTS, as_bytes, check_int, timeout_ms, unserialisable
from ..checks import text as _s
from ..control.groups import group_of
from ..errors import InvalidArgument, InvalidFlow, InvalidPayload
from ..models import FAIL_PARENT, IGNORE, Child
from ..wire.keyspace import MAX_ID_LENGTH, check_group, check_job_id, check_queue, child_stem
from .thresholds import allowance, requirement

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
    group: str | None = None  # a leaf's fairness group (lua/includes/fair.lua)
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
    planner = _Planner(root, default_attempts, dumps, max_payload)
    planner.build(root, child_list(children, f"flow {parent_id}"), parent_id, 1)
    if len(planner.seen_ids) > 1:  # ids given: a derived id may be one of them
        _check_unique(root, parent_id)
    for node in planner.capped:
        node.shares = split_cap(node)
    root.allow = allowance(f"flow {parent_id}", min_success, len(root.children))
    if root.allow is not None:
        root.need = requirement(min_success)
    return root


def apply_rules(
    node: _Node, specs: Sequence[Child], rules: Mapping[str, str], good: set[str] | None = None
) -> None:
    """Give each leaf below ``node`` (planned from ``specs``) that has no group of its own the
    group its queue's rule takes from its payload (:mod:`echomq_core.control.groups`; ``rules``:
    logical queue -> payload key). Before :func:`~echomq_core.flows.sharding.place`: the
    queues are still the logical ones. :class:`InvalidArgument` naming the key for a value
    that is not a valid group."""
    good = set() if good is None else good  # each group checked once
    for spec, kid in zip(specs, node.children, strict=True):
        if kid.children:
            apply_rules(kid, cast(Sequence[Child], spec.children), rules, good)
        elif kid.group is None and (rule := rules.get(kid.queue)) is not None:
            kid.group = group_of(spec.payload, rule, good)


class _Planner:
    """One :func:`plan`'s walk down the tree, and what it met on the way.

    :meth:`build`'s loop runs once per child of flows of 100,000s: the checks are ordered so
    that the common child (no id, no queue, default options) costs set lookups, not regexes;
    what only some children need (an explicit id, a policy, a sub-flow, a threshold) is a step
    of its own. A derived id is its (checked) parent's id plus ".<index>": only its length can
    be wrong."""

    __slots__ = (
        "capped",
        "default_attempts",
        "dumps",
        "good_groups",
        "good_queues",
        "max_payload",
        "root",
        "root_stem",
        "seen_ids",
        "seen_nodes",
    )

    def __init__(self, root: _Node, default_attempts: int, dumps: Any, max_payload: int) -> None:
        self.root = root
        # a replaced flow's generation n derives <root>.g<n>.<i>: never an old child's id
        self.root_stem = child_stem(root.id, root.gen)
        self.default_attempts = default_attempts
        self.dumps = dumps
        self.max_payload = max_payload
        self.capped = [root] if root.cap is not None else []  # the nodes with a cap
        self.seen_ids = {root.id}  # the root's and the explicit ids
        self.seen_nodes: set[int] = set()  # the sub-flows met (by object): a leaf may come twice
        self.good_queues = {root.queue}
        self.good_groups: set[str] = set()

    def build(self, parent: _Node, specs: Sequence[Child], path: str, depth: int) -> None:
        """Plan ``parent``'s children ``specs`` (``path``: how errors name the parent), and
        below them, depth first."""
        if depth > MAX_DEPTH:
            raise InvalidFlow(f"flow {self.root.id!r} is deeper than {MAX_DEPTH} levels")
        if not specs:
            raise InvalidFlow(f"flow node {path} has no children; a flow needs at least one")
        stem = self.root_stem if parent is self.root else child_stem(parent.id)
        good_queues, dumps, max_payload = self.good_queues, self.dumps, self.max_payload
        default_attempts = self.default_attempts
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
                _check_policy(fail_parent, ignore, f"child {index} of {path}")
            child_queue = parent.queue if spec.queue is None else spec.queue
            if child_queue not in good_queues:
                good_queues.add(check_queue(child_queue))
            if spec.id is None:  # unique among derived ids (a path): see _check_unique()
                child_id = f"{stem}{index}"
                if len(child_id) > MAX_ID_LENGTH:
                    check_job_id(child_id)  # raises InvalidJobId, naming the id
            else:
                child_id = self.given_id(spec.id, parent, f"child {index} of {path}")
            attempts = spec.max_attempts
            if attempts is None:
                attempts = default_attempts
            elif type(attempts) is not int or not 1 <= attempts <= MAX_ATTEMPTS:
                raise _bad_attempts(child_id, attempts)
            limit = spec.timeout
            if limit is not None:
                limit = timeout_ms(f"child {child_id} timeout", limit)
            try:
                body = dumps(spec.payload)
            except InvalidPayload:
                raise
            except Exception as exc:
                raise unserialisable(exc) from None
            if type(body) is not bytes:
                body = as_bytes(body)
            if len(body) > max_payload:
                raise _too_big(child_id, len(body), max_payload)
            policy = IGNORE if ignore else FAIL_PARENT
            node = _Node(
                child_queue, child_id, body, attempts, parent, policy, (), spec.id is None, limit
            )
            if spec.group is not None:
                node.group = self.group(spec.group, node, bool(sub))
            if spec.priority != 0 or spec.max_running is not None:
                _options(node, spec, bool(sub))
                if node.cap is not None:
                    self.capped.append(node)
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
                self.sub_flow(node, spec, sub, f"child {index} of {path}", depth)
            if spec.min_success is not None:
                _threshold(node, spec, bool(sub))
        parent.uniform = uniform

    def group(self, group: Any, node: _Node, inner: bool) -> str:
        """A leaf's fairness group, checked (each group once per plan: a flow of 100,000s
        names a few thousand)."""
        if inner:
            raise InvalidArgument(
                f"child {node.id}: group applies to a leaf, got group={group!r} on a child "
                "with children"
            )
        if type(group) is not str or group not in self.good_groups:
            self.good_groups.add(check_group(group, f"child {node.id} group"))
        return cast(str, group)

    def given_id(self, given: str, parent: _Node, where: str) -> str:
        """A child's explicit id, checked: not its parent's, not one met before in the flow."""
        child_id = check_job_id(given)
        if child_id == parent.id:
            raise InvalidFlow(f"{where} has its parent's id {child_id!r}")
        if child_id in self.seen_ids:
            raise InvalidFlow(f"duplicate job id {child_id!r} in flow {self.root.id!r}")
        self.seen_ids.add(child_id)
        return child_id

    def sub_flow(
        self, node: _Node, spec: Child, sub: Sequence[Child], where: str, depth: int
    ) -> None:
        """Plan a sub-flow's children below its ``node``."""
        # a sub-flow met twice would be planned twice, or for ever (a cycle); a leaf
        # Child met twice is two children with the same payload ([Child(x)] * 3)
        if id(spec) in self.seen_nodes:
            raise InvalidFlow(
                f"{where} is a sub-flow that appears twice in the tree "
                "(a cycle, or one Child with children given twice)"
            )
        self.seen_nodes.add(id(spec))
        self.build(node, sub, node.id, depth + 1)


def _bad_attempts(child_id: str, attempts: Any) -> InvalidFlow:
    return InvalidFlow(
        f"child {child_id}: max_attempts must be an int between 1 and {MAX_ATTEMPTS}, "
        f"got {attempts!r}"
    )


def _too_big(child_id: str, size: int, max_payload: int) -> InvalidPayload:
    return InvalidPayload(f"payload of {child_id} is {size} bytes; the limit is {max_payload}")


def _check_policy(fail_parent: Any, ignore: Any, where: str) -> None:
    """:class:`InvalidFlow` for a child's failure policy that is not two bools, or fails
    nothing and ignores nothing (the default, fail the parent, is not checked)."""
    if type(fail_parent) is not bool or type(ignore) is not bool:
        raise InvalidFlow(
            f"{where}: fail_parent_on_failure and "
            "ignore_dependency_on_failure must be True or False, got "
            f"{(fail_parent, ignore)!r}"
        )
    if not fail_parent and not ignore:
        raise InvalidFlow(
            f"{where}: a child must fail its parent or be "
            "ignored on failure (set ignore_dependency_on_failure=True)"
        )


def _threshold(node: _Node, spec: Child, inner: bool) -> None:
    """A sub-flow's success threshold (``Child(min_success=)``), checked and kept on its node."""
    if not inner:
        raise InvalidArgument(
            f"child {node.id}: min_success={spec.min_success!r} is for a child "
            "with children (a sub-flow)"
        )
    node.allow = allowance(f"child {node.id}", spec.min_success, len(node.children))
    node.need = requirement(spec.min_success)


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
