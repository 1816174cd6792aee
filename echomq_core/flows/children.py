"""A flow node's children, a page at a time, in spec order: all of them, or those completed,
failed, ignored or not settled yet; one found by id; the failed ones whose error holds a text.

Every read is bounded by the page (:data:`~echomq_core.queues.rows.PAGE`), never by N:

* ``all``: the page's ids are computed from the node's N and the page's offset (derived ids,
  :func:`~echomq_core.wire.keyspace.child_stem`), then described in one pipeline (below).
* ``failed`` / ``ignored`` with at most :data:`SORT_LIMIT` records: the record's field names
  (HKEYS, no values), sorted by position, paged by offset. Past that, and always for
  ``completed`` / ``pending``: a bounded walk of positions (child_scan.lua: at most
  :data:`~echomq_core.queues.rows.BUDGET` positions per page, three HEXISTS each, no values
  travel) that hands back the position to go on from.
* find by id: a derived id is its position (one page of ``all``); an explicit one is looked
  up in the node's ``:explicit`` record (one HGET).
* describing a page of k ids: three HMGETs of the node's records (values, errors), then per
  child queue three ZMSCOREs (active, pending, delayed) and k HMGETs of rows - one round trip.
* search by error text: HSCAN of the two death records in slices of :data:`SCAN_COUNT`, at most
  :data:`~echomq_core.queues.rows.BUDGET` records per request, with a cursor to go on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..checks import text as _s
from ..errors import InvalidArgument, JobNotFound
from ..models import RUN_MAX_ATTEMPTS, Serializer, fields_dict, row_fact
from ..queues.rows import BUDGET, PAGE, as_int, death_text, jsonable
from ..wire.calls import Call, Op
from ..wire.keyspace import Keyspace, check_job_id, check_queue, child_stem, derived_index

#: Death records up to this size are listed whole-and-sorted (their field names only).
SORT_LIMIT = 10_000
#: How many records one HSCAN of a search reads (a page of matches is cut at a slice's end, so
#: it holds up to ``limit`` + this many rows).
SCAN_COUNT = 1_000
#: Where no position is known: sorted after every derived id.
_LAST = 1 << 62

#: The filters of a flow's children.
SHOWS = ("all", "completed", "failed", "ignored", "pending")


@dataclass(slots=True)
class ChildRow:
    """One child as the page shows it. ``status``: completed | failed | ignored (settled,
    from the node's records) | active | pending | delayed | gated (waiting for a token of the
    flow's cap) | the row's own state (dead or cancelled before its parent heard, a sub-flow's
    held/failed...) | unknown (no row: expired, or never landed)."""

    id: str
    index: int | None
    queue: str | None
    status: str
    attempts: int = 0
    max_attempts: int = 1
    error: str | None = None
    value: Any = None
    flow: bool = False  # it is a parent of its own (a sub-flow)

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(self, value=jsonable)


@dataclass(slots=True)
class ChildPage:
    queue: str
    parent_id: str
    total: int
    show: str
    offset: int
    counts: dict[str, int]  # completed, failed, ignored, explicit: the records' sizes
    rows: list[ChildRow] = field(default_factory=list)
    #: the offset (``all``, a sorted record) or position (a walk) of the next page; None: last
    next: int | None = None
    walked: bool = False  # the page came from a bounded walk (next is a position)
    explicit: list[tuple[str, str]] = field(default_factory=list)  # (id, queue), first page
    find: str | None = None  # the id asked for, when one was
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return fields_dict(
            self,
            rename={"rows": "children"},
            skip=("find",),
            rows=lambda rows: [r.to_dict() for r in rows],
            explicit=lambda explicit: [list(e) for e in explicit],
        )


def _order(parent_id: str, child_id: str) -> tuple[int, str]:
    index = derived_index(parent_id, child_id)
    return (_LAST, child_id) if index is None else (index, "")


def children_page(
    ks: Keyspace,
    queue: str,
    parent_id: str,
    ser: Serializer,
    *,
    show: str = "all",
    offset: int = 0,
    find: str | None = None,
    limit: int = PAGE,
) -> Op[ChildPage | None]:
    """A page of the node's children (see the module's docstring for what each costs); None
    when there is no such node. Cost: two round trips, three with a walk or a sorted record."""
    check_queue(queue)
    check_job_id(parent_id)
    if show not in SHOWS:
        raise InvalidArgument(f"show must be one of {', '.join(SHOWS)}, got {show!r:.40}")
    if find:
        check_job_id(find)
    keys = [ks.processed(queue, parent_id), ks.failed(queue, parent_id)]
    keys.append(ks.unsuccessful(queue, parent_id))
    explicit_key = ks.explicit(queue, parent_id)
    first = [
        Call.cmd("HMGET", ks.job(queue, parent_id), "total", "gen", "cq"),
        *(Call.cmd("HLEN", k) for k in keys),
        Call.cmd("HLEN", explicit_key),
        Call.cmd("HSCAN", explicit_key, 0, "COUNT", limit),
    ]
    if find:
        first.append(Call.cmd("HGET", explicit_key, find))
    replies = yield first
    (total, gen, cq), n_done, n_failed, n_ignored, n_explicit, listed = replies[:6]
    where = replies[6] if find else None
    if total is None:
        return None
    n = int(total)
    stem = child_stem(parent_id, _s(gen) if gen else "")
    queues = _s(cq).split() if cq else [queue]
    counts = {
        "completed": int(n_done),
        "failed": int(n_failed),
        "ignored": int(n_ignored),
        "explicit": int(n_explicit),
    }
    page = ChildPage(queue, parent_id, n, show, offset, counts, find=find or None)
    _, flat = listed
    pairs = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
    page.explicit = sorted((_s(k), _s(v)) for k, v in pairs)[:limit]
    ids: list[str] = []
    if find:
        index = derived_index(parent_id, find) if find.startswith(stem) else None
        if index is not None and index < n:
            page.show, page.offset = "all", index // limit * limit
        elif where:
            ids = [find]
            queues = [_s(where)]
        else:
            page.note = f"{find} is no child of {parent_id}"
            return page
    if page.show == "all" and not ids:
        ids = [f"{stem}{i}" for i in range(page.offset, min(n, page.offset + limit))]
        page.next = page.offset + limit if page.offset + limit < n else None
    elif page.show in ("failed", "ignored") and counts[page.show] <= SORT_LIMIT:
        record = keys[1] if page.show == "failed" else keys[2]
        (names,) = yield [Call.cmd("HKEYS", record)]
        ordered = sorted((_s(k) for k in names), key=lambda c: _order(parent_id, c))
        ids = ordered[offset : offset + limit]
        page.next = offset + limit if offset + limit < len(ordered) else None
    elif not ids:
        args = [stem, offset, n, page.show, limit, BUDGET]
        (reply,) = yield [Call.lua("child_scan", keys, args)]
        nxt, ids = int(reply[0]), [_s(i) for i in reply[1:]]
        page.next, page.walked = (None if nxt < 0 else nxt), True
    page.rows = yield from describe(ks, queue, parent_id, ids, queues, ser)
    return page


def describe(
    ks: Keyspace, queue: str, parent_id: str, ids: list[str], queues: list[str], ser: Serializer
) -> Op[list[ChildRow]]:
    """What each of ``ids`` (children of the node) is now: one round trip of 3 + q * (3 + k)
    commands for k ids and q child queues."""
    if not ids:
        return []
    calls = [
        Call.cmd("HMGET", ks.processed(queue, parent_id), *ids),
        Call.cmd("HMGET", ks.failed(queue, parent_id), *ids),
        Call.cmd("HMGET", ks.unsuccessful(queue, parent_id), *ids),
    ]
    for q in queues:
        calls += [Call.cmd("ZMSCORE", ks.queue_key(q, s), *ids) for s in SETS]
        base = ks.job_prefix(q)
        fields = ("parent", "parent_queue", "attempts", "max_attempts", "error", "state")
        calls += [Call.cmd("HMGET", base + i, *fields, "total", "gate", "run") for i in ids]
    replies = yield calls
    done, failed, ignored = replies[0], replies[1], replies[2]
    per = len(SETS) + len(ids)
    out = []
    for j, child in enumerate(ids):
        row, at, sets = None, None, {}
        for qi, q in enumerate(queues):
            chunk = replies[3 + qi * per : 3 + (qi + 1) * per]
            mine = chunk[len(SETS) + j]
            up_queue = _s(mine[1]) if mine[1] is not None else queue
            if mine[0] is not None and _s(mine[0]) == parent_id and up_queue == queue:
                row, at = mine, q
                sets = {s: chunk[k][j] for k, s in enumerate(SETS)}
                break
        out.append(_child(child, parent_id, at, row, sets, done[j], failed[j], ignored[j], ser))
    return out


#: The sets a child may be in before it settles, in the order :func:`describe` reads them.
SETS = ("active", "pending", "delayed")


def _child(
    child: str,
    parent_id: str,
    queue: str | None,
    row: Any,
    sets: dict[str, Any],
    done: Any,
    failed: Any,
    ignored: Any,
    ser: Serializer,
) -> ChildRow:
    out = ChildRow(child, derived_index(parent_id, child), queue, "unknown")
    if row is not None:
        out.attempts = as_int(row[2]) or 0
        out.max_attempts = row_fact(row[3], row[8], RUN_MAX_ATTEMPTS) or 1
        out.error, out.flow = death_text(row[4]), row[6] is not None
    if done is not None:
        out.status = "completed"
        try:
            out.value = ser.loads(done)
        except Exception:  # shown as it is stored
            out.value = _s(done)
    elif failed is not None or ignored is not None:
        out.status = "failed" if failed is not None else "ignored"
        out.error = out.error or death_text(failed if failed is not None else ignored)
    elif row is not None:
        inset = next((s for s in SETS if sets.get(s) is not None), None)
        if inset is not None:
            out.status = inset
        elif row[5] is not None:
            out.status = _s(row[5])
        elif row[7] is not None:
            out.status = "gated"
    return out


def search_failed(
    ks: Keyspace,
    queue: str,
    parent_id: str,
    text: str,
    ser: Serializer,
    cursor: str = "",
    limit: int = PAGE,
) -> Op[tuple[list[ChildRow], str]]:
    """The node's dead children (failed, then ignored) whose error holds ``text`` (case
    folded) - ``limit`` or more, cut where an HSCAN slice ends - and the cursor to go on from
    (``""``: the records were read to their end). A bounded scan: HSCAN in slices of
    :data:`SCAN_COUNT`, at most :data:`~echomq_core.queues.rows.BUDGET` records per call, then one
    round trip describing the matches. The cursor is ``f:<n>`` / ``i:<n>`` (which record,
    HSCAN's cursor)."""
    check_queue(queue)
    check_job_id(parent_id)
    if not isinstance(text, str) or not 1 <= len(text) <= 200:
        raise InvalidArgument("the text searched for must be 1 to 200 characters")
    kind, _, at = (cursor or "f:0").partition(":")
    if kind not in ("f", "i") or not at.isdigit():
        raise InvalidArgument(f"bad search cursor {cursor!r:.40}")
    want, pos, read, ended = text.casefold(), int(at), 0, False
    found: list[str] = []
    while read < BUDGET and len(found) < limit:
        record = ks.failed(queue, parent_id) if kind == "f" else ks.unsuccessful(queue, parent_id)
        ((nxt, flat),) = yield [Call.cmd("HSCAN", record, pos, "COUNT", SCAN_COUNT)]
        items = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True)
        for child, error in items:
            read += 1
            if want in (death_text(error) or "").casefold():
                found.append(_s(child))
        pos = int(nxt)
        if pos == 0:
            if kind == "i":
                ended = True
                break
            kind = "i"
    more = "" if ended else f"{kind}:{pos}"
    found = sorted(set(found), key=lambda c: _order(parent_id, c))
    (cq,) = yield [Call.cmd("HGET", ks.job(queue, parent_id), "cq")]
    queues = _s(cq).split() if cq else [queue]
    rows = yield from describe(ks, queue, parent_id, found, queues, ser)
    return rows, more


__all__ = ["SORT_LIMIT", "ChildPage", "ChildRow", "children_page", "describe", "search_failed"]


#: The most positions one :func:`values_in_range` reads.
MAX_RANGE = 100_000


def values_in_range(
    ks: Keyspace, queue: str, parent_id: str, ser: Serializer, start: int, stop: int
) -> Op[list[tuple[int, Any]]]:
    """``(position, value)`` of the completed children at positions ``start`` to ``stop - 1``
    of a node, in order (a position not completed - ignored, failed, outstanding - is left
    out): what a slice of a flow's results is, for a reader of one slice among many (an
    Airflow mapped task). Positions are derived ids (:func:`child_stem`), so a node with
    explicit child ids (given by the caller, or keyed) is refused with
    :class:`InvalidArgument`: read it whole. Two round trips."""
    check_queue(queue)
    check_job_id(parent_id)
    if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop):
        raise InvalidArgument(f"a range of positions needs 0 <= start <= stop, got {start}, {stop}")
    if stop - start > MAX_RANGE:
        raise InvalidArgument(f"a range reads at most {MAX_RANGE} positions, got {stop - start}")
    (total, gen), explicit = yield [
        Call.cmd("HMGET", ks.job(queue, parent_id), "total", "gen"),
        Call.cmd("HLEN", ks.explicit(queue, parent_id)),
    ]
    if total is None:
        raise JobNotFound(f"no flow {parent_id} in queue {queue!r}")
    if int(explicit):
        raise InvalidArgument(
            f"flow {parent_id} has {int(explicit)} children with ids of their own (explicit or "
            "keyed): their positions are not their ids; read its values whole"
        )
    stem, stop = child_stem(parent_id, _s(gen) if gen else ""), min(stop, int(total))
    if start >= stop:
        return []
    (raw,) = yield [
        Call.cmd(
            "HMGET", ks.processed(queue, parent_id), *(f"{stem}{i}" for i in range(start, stop))
        )
    ]
    return [
        (i, ser.loads(v)) for i, v in zip(range(start, stop), raw, strict=True) if v is not None
    ]
