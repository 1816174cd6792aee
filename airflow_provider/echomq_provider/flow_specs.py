"""How values written in a DAG become EchoMQ flow arguments.

Three translations, each a pure function so the operator, the sensor and tests share them:

* :func:`parent_id_for` - the flow's parent id, derived from the task instance.
* :func:`to_children` - a list from the DAG (literal or pulled from XCom) -> ``Child`` list.
* :func:`flow_target` - what a sensor was given -> ``(queue, parent_id)``.

Why the parent id is derived and try-independent: Airflow retries a task by running it
again. If the first try added the flow and then died (a lost worker, a timeout after the
write), the retry must re-add *the same* flow - EchoMQ converges a re-add with the same ids
- rather than add a second one whose children run the work twice. So the id is a function of
(dag id, run id, task id, map index) and nothing else; the try number is left out on purpose.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from echomq_core import Child, FlowRef, InvalidArgument, InvalidInput
from echomq_core.integration import check_group, check_job_id, check_queue, derived_index, id_part

#: Keys a child spec may hold; anything else is refused by name (a dict payload goes under
#: ``payload``, so a payload can never be mistaken for a spec or the reverse).
CHILD_KEYS = ("payload", "key", "queue", "ignore_failure", "max_attempts", "timeout", "group")
CHILD_KEY_SET = frozenset(CHILD_KEYS)
#: Payload types taken as they are (a bare payload with the defaults), checked first.
_BARE = frozenset({int, float, str, bool, type(None), list})
#: Characters a key keeps as they are in its child's id; any other byte becomes ``~xx``.
_KEY_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/@+=#")
#: The longest key once encoded (the child id holds ``JOB-af/k/<32 hex>/`` before it).
MAX_KEY_CHARS = 158


def parent_id_for(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """``JOB-af/<dag>/<task>/<digest>``: readable for a person scanning keys, unique by digest.

    The digest (128 bits of SHA-256 over all four values) carries uniqueness: run ids hold
    characters a job id may not (``manual__2026-01-01T00:00:00+00:00``), and dag / task ids may
    be long, so the readable part is sanitised and cut to keep the id well under the 200-char
    limit with room for child suffixes (``.<index>``).
    """
    digest = hashlib.sha256(
        json.dumps([dag_id, run_id, task_id, int(map_index)]).encode()
    ).hexdigest()[:32]
    dag, task = (id_part(p, 60, word=True, mark=False) for p in (dag_id, task_id))
    readable = f"{dag}/{task}"
    return check_job_id(f"JOB-af/{readable}/{digest}")


def keyed_child_id(parent_id: str, key: str) -> str:
    """The id of the child a spec gave ``key``: ``JOB-af/k/<digest of the parent id>/<key>``.

    Not ``<parent id>.<key>``: a derived parent id may take 161 characters, which would leave
    a key 35. The digest ties the child to its parent (a re-add derives the same ids); the key
    is kept readable, each byte outside the id alphabet written ``~xx`` (``~`` itself too), so
    :func:`child_label` gives the key back exactly.
    """
    if not isinstance(key, str) or not key:
        raise InvalidInput(f"a child key must be a non-empty string, got {key!r:.80}")
    encoded = "".join(
        ch if ch in _KEY_SAFE else "".join(f"~{b:02x}" for b in ch.encode()) for ch in key
    )
    if len(encoded) > MAX_KEY_CHARS:
        raise InvalidInput(
            f"child key {key[:40]!r}... is too long: {len(encoded)} characters once encoded "
            f"(bytes outside A-Z a-z 0-9 . _ - / @ + = # count 3), at most {MAX_KEY_CHARS}"
        )
    return check_job_id(f"{_keyed_stem(parent_id)}{encoded}")


@functools.lru_cache(maxsize=64)  # child_label runs once per result of flows of 100,000s
def _keyed_stem(parent_id: str) -> str:
    return f"JOB-af/k/{hashlib.sha256(parent_id.encode()).hexdigest()[:32]}/"


def labeller(parent_id: str) -> Callable[[str], int | str]:
    """:func:`child_label` for the children of one flow, made once for a read of many: a
    plain derived id (``<parent>.<i>``, what ``children`` without keys gives) costs a prefix
    test and an ``int``; anything else goes through :func:`child_label`."""
    plain, stem = f"{parent_id}.", _keyed_stem(parent_id)
    start = len(plain)

    def label(child_id: str) -> int | str:
        if child_id.startswith(plain) and not child_id.startswith(stem):
            rest = child_id[start:]
            if rest.isdigit() and rest.isascii():
                return int(rest)
        return child_label(parent_id, child_id)

    return label


def child_label(parent_id: str, child_id: str) -> int | str:
    """What a child's result is matched to its input by: the index of its spec in the
    operator's ``children`` (derived ids ``<parent>.<i>``, or ``<parent>.g<n>.<i>`` after a
    replace: read by the core's :func:`~echomq_core.derived_index`), or the ``key``
    its spec gave. An id of neither form (a flow added outside the operator with explicit ids)
    is returned as it is."""
    stem = _keyed_stem(parent_id)
    if child_id.startswith(stem):
        raw = child_id[len(stem) :].encode()
        return re.sub(rb"~([0-9a-f]{2})", lambda m: bytes([int(m[1], 16)]), raw).decode()
    index = derived_index(parent_id, child_id)
    return child_id if index is None else index


def to_children(
    items: Any,
    *,
    default_queue: str | None = None,
    default_max_attempts: int | None = None,
    default_timeout: float | None = None,
    parent_id: str | None = None,
) -> list[Child]:
    """Turn the operator's ``children`` into :class:`~echomq_core.Child` objects.

    Each item is one of:

    * a mapping with ``payload`` and optionally ``queue``, ``ignore_failure`` (the child's
      death is recorded as an ignored failure instead of failing the parent), ``max_attempts``,
      ``timeout`` (the handler's time limit in seconds) and ``group`` (its fairness group: a
      tenant, a vendor account; the queue serves the groups in turn,
      :attr:`echomq_core.Child.group`) - the JSON shape an upstream task returns through XCom;
    * a :class:`~echomq_core.Child` (for DAGs that build specs in Python);
    * any other value (number, string, list): a payload with the defaults.

    A mapping may give a ``key`` (a string): its result is then read back under that key
    instead of its index (:func:`child_label`). Either every spec gives one or none does; keys
    are unique. Keyed children need ``parent_id`` (their ids derive from it).

    ``items``: a list, or any iterable of them (a generator is read once).

    Raises :class:`~echomq_core.InvalidInput` naming the item at fault.
    """
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise InvalidInput(
            f"children must be a list (or another iterable of specs), got "
            f"{type(items).__name__}; to pull it from an upstream task pass that task's output"
        )
    if not isinstance(items, Sequence):  # a generator (a @task.echo_flow may yield its plan)
        items = list(items)  # read once: the keys below index it
    # Runs once per child of flows of 100,000s: a bare payload of a JSON type costs a type
    # lookup and a Child, not the ABC checks (isinstance against Mapping) the other forms need.
    children = []
    keyed: list[int] = []
    checked_queues: set[str] = set()
    leaf: list[Child] = []  # shared by the bare payloads' children: a leaf's, only ever read
    for index, item in enumerate(items):
        if type(item) in _BARE:
            child = Child(
                item, default_queue, None, False, True, default_max_attempts, leaf, default_timeout
            )
        elif isinstance(item, Child):
            child = item
            if child.queue is None and default_queue is not None:
                child = dataclasses.replace(child, queue=default_queue)
            if child.timeout is None and default_timeout is not None:
                child = dataclasses.replace(child, timeout=default_timeout)
        elif isinstance(item, Mapping):
            child = _child_from_mapping(
                index, item, default_queue, default_max_attempts, default_timeout, checked_queues
            )
            if "key" in item:
                keyed.append(index)
        else:
            child = Child(
                item,
                queue=default_queue,
                max_attempts=default_max_attempts,
                timeout=default_timeout,
            )
        children.append(child)
    if keyed:
        _apply_keys(items, keyed, children, parent_id)
    return children


def _apply_keys(
    items: Sequence[Any], keyed: list[int], children: list[Child], parent_id: str | None
) -> None:
    if len(keyed) != len(items):
        missing = next(i for i in range(len(items)) if i not in set(keyed))
        raise InvalidInput(
            f"child {missing} has no 'key' while child {keyed[0]} has one: give every child "
            "a key, or none (results are then matched by index)"
        )
    if parent_id is None:
        raise InvalidInput("keyed children need the flow's parent_id")
    seen: dict[str, int] = {}
    for index, (item, child) in enumerate(zip(items, children, strict=True)):
        key = item["key"]
        if not isinstance(key, str) or not key:
            raise InvalidInput(f"child {index}: key must be a non-empty string, got {key!r:.80}")
        if key in seen:
            raise InvalidInput(f"child {index}: key {key!r:.80} is also child {seen[key]}'s")
        seen[key] = index
        child.id = keyed_child_id(parent_id, key)


def _child_from_mapping(
    index: int,
    spec: Mapping[str, Any],
    default_queue: str | None,
    default_max_attempts: int | None,
    default_timeout: float | None,
    checked_queues: set[str],
) -> Child:
    if "payload" not in spec or not CHILD_KEY_SET.issuperset(spec):
        unknown = sorted(str(k) for k in spec if k not in CHILD_KEYS)
        problem = (
            f"unknown key(s) {', '.join(map(repr, unknown))}" if unknown else "no 'payload' key"
        )
        raise InvalidInput(
            f"child {index}: {problem}; a child spec holds {', '.join(CHILD_KEYS)} "
            "(put a dict payload under 'payload')"
        )
    queue = spec.get("queue", default_queue)
    if queue is not None and queue not in checked_queues:
        checked_queues.add(check_queue(queue))
    ignore = spec.get("ignore_failure", False)
    if not isinstance(ignore, bool):
        raise InvalidInput(f"child {index}: ignore_failure must be true or false, got {ignore!r}")
    attempts = spec.get("max_attempts", default_max_attempts)
    if attempts is not None and (
        not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1
    ):
        raise InvalidInput(f"child {index}: max_attempts must be an int >= 1, got {attempts!r}")
    timeout = spec.get("timeout", default_timeout)
    if timeout is not None and (
        not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0
    ):
        raise InvalidInput(f"child {index}: timeout must be seconds > 0, got {timeout!r}")
    group = spec.get("group")
    if group is not None:
        try:
            check_group(group)
        except InvalidArgument as exc:
            raise InvalidInput(f"child {index}: {exc}") from None
    return Child(
        spec["payload"],
        queue=queue,
        ignore_dependency_on_failure=ignore,
        max_attempts=attempts,
        timeout=timeout,
        group=group,
    )


def flow_span(flow: Any) -> tuple[int, int] | None:
    """``(start, stop)`` when ``flow`` is one slice of
    :meth:`~echomq_provider.hooks.echomq.EchoMQHook.slices`, else None (the whole flow).
    Raises :class:`~echomq_core.InvalidInput` for a malformed slice."""
    if not isinstance(flow, Mapping) or "start" not in flow:
        return None
    start, stop = flow.get("start"), flow.get("stop")
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop):
        raise InvalidInput(f"a slice of a flow needs 0 <= start <= stop, got {flow!r:.200}")
    return start, stop


def flow_target(
    flow: Any = None, queue: str | None = None, parent_id: str | None = None
) -> tuple[str, str]:
    """The ``(queue, parent_id)`` a sensor waits on.

    ``flow`` is what :class:`~echomq_provider.operators.echo_flow.EchoFlowOperator` returns
    (a mapping with ``queue`` and ``parent_id``, usually passed as ``operator.output``) or a
    :class:`~echomq_core.FlowRef`; otherwise ``queue`` and ``parent_id`` name it directly.
    Raises :class:`~echomq_core.InvalidInput`.
    """
    if flow is not None:
        if queue is not None or parent_id is not None:
            raise InvalidInput("give either flow or parent_queue and parent_id, not both")
        if isinstance(flow, FlowRef):
            queue, parent_id = flow.queue, flow.parent_id
        elif isinstance(flow, Mapping) and "queue" in flow and "parent_id" in flow:
            queue, parent_id = str(flow["queue"]), str(flow["parent_id"])
        else:
            raise InvalidInput(
                f"flow must be a mapping with 'queue' and 'parent_id' (an "
                f"EchoFlowOperator's output) or a FlowRef, got {flow!r:.200}"
            )
    if queue is None or parent_id is None:
        raise InvalidInput("a flow sensor needs flow, or both parent_queue and parent_id")
    return check_queue(queue), check_job_id(parent_id)
