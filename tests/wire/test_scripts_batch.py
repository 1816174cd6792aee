"""The batch complete.lua and fail.lua take (lua/includes/batch.lua): a batch of one lease
token whose jobs share their ref sends that ref once and per job only id and values; any
other batch sends each job's token number and ref. Both encodings keep lease safety: a job
whose lease is no longer the one the caller holds is refused and its row left as it was."""

from __future__ import annotations

from echomq_core import Backoff, Child, EchoMQ
from echomq_core.models import Job
from echomq_core.queues import settling


def _claim(mq: EchoMQ, queue: str, n: int) -> list[Job]:
    jobs = list(mq.queue(queue).claim(n))
    assert len(jobs) == n
    return jobs


def test_a_batch_of_one_claim_sends_two_values_per_job(mq: EchoMQ) -> None:
    q = mq.queue("bt-wire")
    q.add_bulk(range(3))
    jobs = _claim(mq, "bt-wire", 3)
    argv, *_ = settling._batch(mq.keys, "bt-wire", [(j, b"r") for j in jobs])
    # n, groups, cross parents, tokens, the shared ref, the token, then id + result per job
    assert argv[:6] == [3, 0, 0, 1, 0, jobs[0].token]
    assert argv[6:] == [v for j in jobs for v in (j.id, b"r")]
    # children of one parent in another queue share ref -1
    ref = mq.add_flow("bt-wire-p", [Child(i, queue="bt-wire-c") for i in range(2)])
    kids = _claim(mq, "bt-wire-c", 2)
    argv, *_ = settling._batch(mq.keys, "bt-wire-c", [(j, b"r") for j in kids])
    assert argv[4] == -1 and argv[5:8] == [ref.parent_id, "bt-wire-p", kids[0].token]
    assert len(argv) == 8 + 2 * 2


def test_a_batch_of_two_claims_or_mixed_refs_sends_each_jobs_token_and_ref(mq: EchoMQ) -> None:
    q = mq.queue("bt-mixed")
    q.add_bulk(range(2))
    a, b = _claim(mq, "bt-mixed", 1) + _claim(mq, "bt-mixed", 1)
    argv, *_ = settling._batch(mq.keys, "bt-mixed", [(a, b"1"), (b, b"2")])
    assert argv[:7] == [2, 0, 0, 2, "", a.token, b.token]
    assert argv[7:] == [a.id, 1, b"1", 0, b.id, 2, b"2", 0]
    mq.add_flow("bt-mixed", [Child(0)])  # its child and a plain job: refs 1 and 0
    q.add(5)
    jobs = _claim(mq, "bt-mixed", 2)
    argv, *_ = settling._batch(mq.keys, "bt-mixed", [(j, b"x") for j in jobs])
    assert argv[3:5] == [1, ""] and len(argv) == 5 + 1 + 1 + 4 * 2  # a group, a token


def test_a_lost_lease_is_refused_in_either_encoding(mq: EchoMQ) -> None:
    q = mq.queue("bt-lost")
    q.add_bulk(range(4))
    a, b = _claim(mq, "bt-lost", 2)  # one claim: the shared encoding
    assert q.release([b]) == [True]  # b's lease is gone: the caller's token is stale
    assert q.complete_many([(a, "a"), (b, "b")]) == [True, False]
    assert mq.get_job("bt-lost", b.id).state == "pending"
    c, d = _claim(mq, "bt-lost", 1) + _claim(mq, "bt-lost", 1)  # two claims: per-job encoding
    assert q.release([d]) == [True]
    (again,) = [j for j in q.claim(10) if j.id == d.id]
    assert q.complete_many([(c, "c"), (d, "d")]) == [True, False]  # d's token is an old one
    assert mq.get_job("bt-lost", d.id).state == "active"
    assert q.complete_many([(again, "d")]) == [True]
    assert mq.get_job("bt-lost", d.id).result == "d"


def test_failures_in_either_encoding_retry_and_refuse_as_before(mq: EchoMQ) -> None:
    q = mq.queue("bt-fail", max_attempts=2, backoff=Backoff(0, 0))
    q.add_bulk(range(3))
    a, b = _claim(mq, "bt-fail", 2)
    assert q.release([b]) == [True]
    assert q.fail_many([(a, "boom", True), (b, "late", True)]) == [1, 0]
    row = mq.get_job("bt-fail", a.id)
    assert row.attempts == 1 and row.error == "boom"
    first, second = _claim(mq, "bt-fail", 1) + _claim(mq, "bt-fail", 1)
    statuses = q.fail_many([(first, "x", True), (second, "y", False)])
    assert statuses == [2 if first.id == a.id else 1, 2]  # a's second attempt is its last
