"""The settle's bulk record of completions (lua/includes/settle_current.lua): one HMGET and one
HSET of the parent's :processed per settle instead of an HSETNX per child, the hash made a
hashtable first for a bulk of more than 32 in a flow of more than 128 children (a smaller flow
keeps its listpack). Only a first record counts, also when one call carries the same child
twice, and the '~roomy' field never outlives the step."""

from __future__ import annotations

from typing import Any

from echomq_core import Child, EchoMQ
from echomq_core.wire.calls import Call

from ..conftest import Backend


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


def _encoding(mq: EchoMQ, backend: Backend, key: str, expected: str) -> bool:
    """Whether ``key`` has the ``expected`` encoding (not asked on a Cluster, whose router does
    not route OBJECT by its key)."""
    if backend.cluster:
        return True
    (raw,) = mq.connection.execute([Call.cmd("OBJECT", "ENCODING", key)])
    return (raw.decode() if isinstance(raw, bytes) else str(raw)) == expected


def test_a_bulk_of_completions_records_each_child_once(mq: EchoMQ, backend: Backend) -> None:
    ref = mq.add_flow("st-p", [Child(i, queue="st-c") for i in range(140)])
    kids = [j.id for j in mq.queue("st-c").claim(140)]
    assert len(kids) == 140
    pid = ref.parent_id
    # one child recorded before the bulk: its first record stays
    (st, _) = _deliver(mq, "st-p", pid, [("c", kids[0], b"first")])
    assert st == [1]
    # 139 new ones, the early one again, and one child twice in the same call
    signals = [("c", kids[0], b"again")] + [("c", k, k.encode()) for k in kids[1:]]
    signals.append(("c", kids[5], b"twice"))
    (st, events) = _deliver(mq, "st-p", pid, signals)
    assert st == [0] + [1] * 139 + [0]
    assert events[0] in (b"r", "r")
    assert mq.dependencies("st-p", pid) == 0
    stored = _fields(mq, mq.keys.processed("st-p", pid))
    assert b"~roomy" not in stored and len(stored) == 140
    assert _encoding(mq, backend, mq.keys.processed("st-p", pid), "hashtable")
    assert stored[kids[0].encode()] == b"first" and stored[kids[5].encode()] == kids[5].encode()
    # a redelivery of the whole bulk changes nothing
    (st, events) = _deliver(mq, "st-p", pid, signals)
    assert st == [0] * 141 and events == []
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


def test_same_queue_batches_settle_every_child_small_flows_keep_their_listpack(
    mq: EchoMQ, backend: Backend
) -> None:
    for n, encoding in ((100, "listpack"), (200, "hashtable")):
        queue = f"sq{n}"
        ref = mq.add_flow(queue, [Child(i) for i in range(n)])
        q = mq.queue(queue)
        jobs = list(q.claim(n))
        assert len(jobs) == n
        assert q.complete_many([(j, j.payload * 2) for j in jobs]) == [True] * n
        assert mq.dependencies(queue, ref.parent_id) == 0
        values = mq.children_values(queue, ref.parent_id)
        assert sorted(values.values()) == sorted(2 * i for i in range(n))
        processed = mq.keys.processed(queue, ref.parent_id)
        assert b"~roomy" not in _fields(mq, processed)
        assert _encoding(mq, backend, processed, encoding)
