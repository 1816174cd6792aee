"""The settle's bulk record of completions (lua/includes/settle_current.lua): one HMGET and one
HSET of the parent's :processed per settle instead of an HSETNX per child, the hash made a
hashtable first for a bulk of more than 32. Only a first record counts, also when one call
carries the same child twice, and the '~roomy' field never outlives the step."""

from __future__ import annotations

from typing import Any

from echomq_core import Child, EchoMQ
from echomq_core.calls import Call


def _deliver(mq: EchoMQ, queue: str, parent: str, signals: list[tuple[str, str, bytes]]) -> Any:
    """deliver.lua of one parent's signals (kind, child id, value), as the Pump sends them."""
    keys = [*mq.keys.queue_keys(queue), *mq.keys.settle_keys(queue, parent)]
    kinds = "".join(kind for kind, _, _ in signals)
    argv: list[Any] = [queue, 1, parent, len(signals), kinds]
    for _, child, value in signals:
        argv += [child, value]
    return mq.connection.execute([Call.lua("deliver", keys, argv)])[0]


def _fields(mq: EchoMQ, key: str) -> dict[bytes, bytes]:
    (raw,) = mq.connection.execute([Call.cmd("HGETALL", key)])
    if isinstance(raw, dict):
        return {bytes(k): bytes(v) for k, v in raw.items()}
    return {bytes(raw[i]): bytes(raw[i + 1]) for i in range(0, len(raw), 2)}


def test_a_bulk_of_completions_records_each_child_once(mq: EchoMQ) -> None:
    ref = mq.add_flow("st-p", [Child(i, queue="st-c") for i in range(40)])
    kids = [j.id for j in mq.queue("st-c").claim(40)]
    assert len(kids) == 40
    pid = ref.parent_id
    # one child recorded before the bulk: its first record stays
    (st, _) = _deliver(mq, "st-p", pid, [("c", kids[0], b"first")])
    assert st == [1]
    # 39 new ones, the early one again, and one child twice in the same call
    signals = [("c", kids[0], b"again")] + [("c", k, k.encode()) for k in kids[1:]]
    signals.append(("c", kids[5], b"twice"))
    (st, events) = _deliver(mq, "st-p", pid, signals)
    assert st == [0] + [1] * 39 + [0]
    assert events[0] in (b"r", "r")
    assert mq.dependencies("st-p", pid) == 0
    stored = _fields(mq, mq.keys.processed("st-p", pid))
    assert b"~roomy" not in stored and len(stored) == 40
    assert stored[kids[0].encode()] == b"first" and stored[kids[5].encode()] == kids[5].encode()
    # a redelivery of the whole bulk changes nothing
    (st, events) = _deliver(mq, "st-p", pid, signals)
    assert st == [0] * 41 and events == []
    assert _fields(mq, mq.keys.processed("st-p", pid)) == stored


def test_a_small_settle_and_a_mixed_one_keep_their_order_and_counts(mq: EchoMQ) -> None:
    ref = mq.add_flow(
        "sm-p", [Child(i, queue="sm-c", ignore_dependency_on_failure=True) for i in range(4)]
    )
    kids = [j.id for j in mq.queue("sm-c").claim(4)]
    pid = ref.parent_id
    signals = [("c", kids[0], b"a"), ("i", kids[1], b"boom"), ("c", kids[0], b"b")]
    (st, events) = _deliver(mq, "sm-p", pid, signals)
    assert st == [1, 1, 0] and events == []
    assert mq.dependencies("sm-p", pid) == 2
    assert _fields(mq, mq.keys.processed("sm-p", pid)) == {kids[0].encode(): b"a"}
    assert _fields(mq, mq.keys.unsuccessful("sm-p", pid)) == {kids[1].encode(): b"boom"}
    (st, events) = _deliver(mq, "sm-p", pid, [("c", kids[2], b"c"), ("c", kids[3], b"d")])
    assert st == [1, 1] and mq.dependencies("sm-p", pid) == 0
    assert b"~roomy" not in _fields(mq, mq.keys.processed("sm-p", pid))


def test_a_same_queue_batch_over_the_bound_settles_every_child(mq: EchoMQ) -> None:
    ref = mq.add_flow("sq", [Child(i) for i in range(120)])
    q = mq.queue("sq")
    jobs = list(q.claim(120))
    assert len(jobs) == 120
    assert q.complete_many([(j, j.payload * 2) for j in jobs]) == [True] * 120
    assert mq.dependencies("sq", ref.parent_id) == 0
    values = mq.children_values("sq", ref.parent_id)
    assert sorted(values.values()) == sorted(2 * i for i in range(120))
    assert b"~roomy" not in _fields(mq, mq.keys.processed("sq", ref.parent_id))
