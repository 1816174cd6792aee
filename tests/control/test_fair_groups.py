"""Fair shares inside a queue (issue 50, items 1-2): a job or a flow child carries a fairness
group, and a claim serves the groups with waiting work in turn (lua/includes/fair.lua), so one
group's backlog does not starve the groups added after it. Standalone and Cluster.

The order is read from what claims return, one job at a time: the claim itself is unchanged
(lowest score first), the turns live in the scores the add gives."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echomq_core import Child, EchoMQ, GroupLoad, InvalidArgument, InvalidJobId, JobSpec
from echomq_core.wire.calls import Call

from ..conftest import Backend


def groups_of(mq: EchoMQ, queue: str, n: int) -> list[str]:
    """The groups of the next ``n`` jobs claims take, in claim order (payloads name them)."""
    q = mq.queue(queue)
    out = []
    for _ in range(n):
        (job,) = q.claim(1)
        out.append(job.payload["g"])
    return out


def test_a_backlog_does_not_starve_the_groups_added_after_it(mq: EchoMQ) -> None:
    q = mq.queue("fg-turns")
    q.add_bulk([JobSpec({"g": "heavy"}, group="heavy") for _ in range(1_000)])
    for name in ("acme", "globex", "initech"):
        q.add_bulk([JobSpec({"g": name}, group=name) for _ in range(5)])
    first = groups_of(mq, "fg-turns", 20)
    # one job of each group per turn: the light groups are done within 20 claims
    assert Counter(first) == {"heavy": 5, "acme": 5, "globex": 5, "initech": 5}
    assert all(len(set(first[i : i + 4])) == 4 for i in range(0, 20, 4)), first
    assert q.stats()["pending"] == 995


def test_without_groups_the_queue_stays_first_in_first_out(mq: EchoMQ) -> None:
    """The reference the groups are measured against: one backlog ahead of everything."""
    q = mq.queue("fg-fifo")
    q.add_bulk([{"g": "heavy"} for _ in range(100)])
    q.add_bulk([{"g": "light"} for _ in range(5)])
    assert set(groups_of(mq, "fg-fifo", 100)) == {"heavy"}
    assert mq.connection.execute([Call.cmd("EXISTS", mq.keys.fair("fg-fifo"))]) == [0]


def test_a_group_that_arrives_late_takes_turns_from_where_the_claims_are(mq: EchoMQ) -> None:
    q = mq.queue("fg-late")
    q.add_bulk([JobSpec({"g": "heavy"}, group="heavy") for _ in range(500)])
    assert set(groups_of(mq, "fg-late", 300)) == {"heavy"}
    q.add_bulk([JobSpec({"g": "late"}, group="late") for _ in range(10)])
    # not behind the 200 heavy jobs left, not all ahead of them either: in turn
    assert Counter(groups_of(mq, "fg-late", 20)) == {"heavy": 10, "late": 10}
    # a group whose work all ran and comes back later starts from the claims, not its old tags
    q.add_bulk([JobSpec({"g": "late"}, group="late") for _ in range(3)])
    assert Counter(groups_of(mq, "fg-late", 6)) == {"heavy": 3, "late": 3}


def test_jobs_without_a_group_take_their_turns_as_one_group(mq: EchoMQ) -> None:
    q = mq.queue("fg-mixed")
    q.add_bulk([JobSpec({"g": "heavy"}, group="heavy") for _ in range(100)])
    q.add_bulk([{"g": "none"} for _ in range(4)])  # once a queue has groups, by turns too
    solo = q.add(payload={"g": "solo"}, group="solo")
    assert mq.get_job("fg-mixed", solo).group == "solo"  # type: ignore[union-attr]
    assert Counter(groups_of(mq, "fg-mixed", 9)) == {"heavy": 4, "none": 4, "solo": 1}


def test_priorities_still_come_first_and_order_work_within_a_group(mq: EchoMQ) -> None:
    q = mq.queue("fg-prio")
    q.add_bulk([JobSpec({"g": "a", "n": i}, group="a", priority=5) for i in range(3)])
    q.add_bulk([JobSpec({"g": "b", "n": i}, group="b", priority=5) for i in range(3)])
    q.add(payload={"g": "b", "n": "urgent"}, group="b", priority=0)
    jobs = [q.claim(1)[0].payload for _ in range(7)]
    assert jobs[0] == {"g": "b", "n": "urgent"}
    assert [j["n"] for j in jobs[1:] if j["g"] == "a"] == [0, 1, 2]  # arrival order within
    # one of each group per turn (within a turn, the order of the ids)
    assert all({jobs[i]["g"], jobs[i + 1]["g"]} == {"a", "b"} for i in (1, 3, 5)), jobs


def test_a_flows_children_take_turns_by_their_group(mq: EchoMQ) -> None:
    heavy = [Child({"g": "heavy"}, queue="fg-kids", group="heavy") for _ in range(300)]
    mq.add_flow("fg-parents", heavy)
    light = [Child({"g": g}, queue="fg-kids", group=g) for g in ("x", "y") for _ in range(3)]
    ref = mq.add_flow("fg-parents", light)
    assert Counter(groups_of(mq, "fg-kids", 9)) == {"heavy": 3, "x": 3, "y": 3}
    # the row names its group
    row = mq.keys.job("fg-kids", f"{ref.parent_id}.0")
    assert mq.connection.execute([Call.cmd("HGET", row, "group")]) in ([b"x"], ["x"])


@pytest.mark.parametrize(
    ("group", "what"),
    [
        ("", "group '': 1-204 bytes"),
        ("a" * 205, "205 bytes"),
        ("é" * 103, "206 bytes"),
        ("tab\there", "printable"),
        (7, "must be a str, got int"),
    ],
)
def test_a_bad_group_is_refused_before_anything_is_written(
    mq: EchoMQ, group: object, what: str
) -> None:
    q = mq.queue("fg-bad")
    with pytest.raises(InvalidArgument, match=what):
        q.add_bulk([JobSpec(1, group="fine"), JobSpec(2, group=group)])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=what):
        mq.add_flow("fg-bad", [Child(1), Child(2, group=group)])  # type: ignore[arg-type]
    assert q.stats()["pending"] == 0
    assert mq.connection.execute([Call.cmd("EXISTS", mq.keys.fair("fg-bad"))]) == [0]


def test_a_group_on_a_sub_flow_is_refused_naming_the_child(mq: EchoMQ) -> None:
    with pytest.raises(InvalidArgument, match="group applies to a leaf"):
        mq.add_flow("fg-sub", [Child(1, group="g", children=[Child(2)])])
    assert mq.queue("fg-sub").stats()["pending"] == 0


def test_the_server_refuses_an_overlong_group_itself(mq: EchoMQ) -> None:
    """A client that skips the host's check still cannot write a group past the bound."""
    ks = mq.keys
    keys = [*ks.queue_keys("fg-raw"), ks.job("fg-raw", "JOB-r1"), ks.fair("fg-raw")]
    argv = ["1", 1, 0, 0, "", "", "", "1", "JOB-r1", b"1", "g" * 205]
    with pytest.raises(InvalidJobId, match="at most 204"):
        mq.connection.execute([Call.lua("add", keys, argv)])
    reads = [Call.cmd("EXISTS", ks.job("fg-raw", "JOB-r1")), Call.cmd("EXISTS", ks.fair("fg-raw"))]
    assert mq.connection.execute(reads) == [0, 0]


def test_the_sweep_drops_the_turns_of_groups_behind_the_claims(mq: EchoMQ) -> None:
    """100 groups that ran once leave nothing behind; a group with work ahead keeps its turn;
    the turns after the prune are what they would have been without it."""
    from echomq_core.flows import retention

    q, fair = mq.queue("fg-prune"), mq.keys.fair("fg-prune")
    q.add_bulk([JobSpec({"g": f"once-{i}"}, group=f"once-{i}") for i in range(100)])
    q.add_bulk([JobSpec({"g": "busy"}, group="busy") for _ in range(300)])
    groups_of(mq, "fg-prune", 150)  # the 100 once-groups and 50 of busy: busy is at turn 50
    cursors: dict[str, str] = {}
    dropped = 0
    for _ in range(10):  # slices of 200 fields: round the hash once
        stats = mq.perform(
            retention.sweep(mq.keys, ["fg-prune"], "p1", lease_ms=1000, limit=200, cursors=cursors)
        )
        dropped += stats.groups
        if cursors["fg-prune"] == "0":
            break
    assert dropped == 100
    fields = mq.connection.execute([Call.cmd("HKEYS", fair)])[0]
    assert sorted(f if isinstance(f, str) else f.decode() for f in fields) == ["g:busy", "max"]
    # a once-group that comes back takes turns from where the claims are, as a new one would
    q.add_bulk([JobSpec({"g": "once-7"}, group="once-7") for _ in range(3)])
    assert Counter(groups_of(mq, "fg-prune", 6)) == {"busy": 3, "once-7": 3}


def test_a_queue_rule_takes_the_group_from_the_payload(mq: EchoMQ) -> None:
    q = mq.queue("fg-rule")
    assert mq.group_rule("fg-rule") is None
    mq.set_group_rule("fg-rule", "customer")
    assert mq.group_rule("fg-rule") == "customer"
    ids = q.add_bulk(
        [
            {"customer": "acme", "n": 1},
            {"customer": 42},  # an int, written in decimal
            {"n": 3},  # no such key: no group
            [1, 2],  # not a mapping: no group
            {"customer": 1.5},  # neither str nor int: no group
            JobSpec({"customer": "acme"}, group="own"),  # a job's own group wins
        ]
    )
    got = [mq.get_job("fg-rule", i).group for i in ids]  # type: ignore[union-attr]
    assert got == ["acme", "42", None, None, None, "own"]
    mq.set_group_rule("fg-rule", None)
    assert mq.group_rule("fg-rule") is None
    (plain,) = q.add_bulk([{"customer": "acme"}])
    assert mq.get_job("fg-rule", plain).group is None  # type: ignore[union-attr]


def test_a_queue_rule_names_the_groups_of_a_flows_children(mq: EchoMQ) -> None:
    mq.set_group_rule("fg-rule-kids", "tenant")
    kids = [
        Child({"tenant": "a"}, queue="fg-rule-kids"),
        Child({"tenant": "b"}, queue="fg-rule-kids", group="mine"),
        Child({"x": 1}, queue="fg-rule-kids", children=[Child({"tenant": "c"})]),
        Child({"tenant": "d"}),  # the parent's queue: no rule there
    ]
    ref = mq.add_flow("fg-rule-parents", kids)
    p = ref.parent_id
    assert mq.get_job("fg-rule-kids", f"{p}.0").group == "a"  # type: ignore[union-attr]
    assert mq.get_job("fg-rule-kids", f"{p}.1").group == "mine"  # type: ignore[union-attr]
    assert mq.get_job("fg-rule-kids", f"{p}.2.0").group == "c"  # type: ignore[union-attr]
    assert mq.get_job("fg-rule-parents", f"{p}.3").group is None  # type: ignore[union-attr]


def test_a_bad_rule_or_a_bad_value_is_refused_before_anything_is_written(mq: EchoMQ) -> None:
    for bad in ("", "k" * 129, 7, "tab\there"):
        with pytest.raises(InvalidArgument, match="a group rule is the payload key"):
            mq.set_group_rule("fg-rule-bad", bad)  # type: ignore[arg-type]
    assert mq.group_rule("fg-rule-bad") is None
    mq.set_group_rule("fg-rule-bad", "customer")
    with pytest.raises(InvalidArgument, match=r"payload key 'customer'.*205 bytes"):
        mq.queue("fg-rule-bad").add_bulk([{"customer": "ok"}, {"customer": "c" * 205}])
    with pytest.raises(InvalidArgument, match="payload key 'customer'"):
        mq.add_flow("fg-rule-p", [Child({"customer": ""}, queue="fg-rule-bad")])
    assert mq.queue("fg-rule-bad").stats()["pending"] == 0
    assert mq.list_flows("fg-rule-p") == []


def test_producers_follow_a_rule_within_its_ttl(
    backend: Backend, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer reads a queue's rule with its shards, then again - in an add's own step -
    once what it knows is RULE_TTL s old: it follows a change from the second add after that
    (the TTL is set here, no sleep)."""
    from echomq_core.control import groups

    producer, admin = backend.client(prefix), backend.client(prefix)
    try:
        q = producer.queue("fg-ttl")
        monkeypatch.setattr(groups, "RULE_TTL", 3600.0)
        (first,) = q.add_bulk([{"customer": "acme"}])  # reads: no rule, kept for an hour
        admin.set_group_rule("fg-ttl", "customer")
        (second,) = q.add_bulk([{"customer": "acme"}])
        assert producer.get_job("fg-ttl", second).group is None  # type: ignore[union-attr]
        # past the TTL (0 here): the next add reads the rule again in its own step, the one
        # after it follows the rule
        monkeypatch.setattr(groups, "RULE_TTL", 0.0)
        producer.group_rules.take(["fg-ttl"], [None])  # known: no rule, already stale
        (third,) = q.add_bulk([{"customer": "acme"}])
        (fourth,) = q.add_bulk([{"customer": "acme"}])
        assert producer.get_job("fg-ttl", third).group is None  # type: ignore[union-attr]
        assert producer.get_job("fg-ttl", fourth).group == "acme"  # type: ignore[union-attr]
        assert producer.get_job("fg-ttl", first).group is None  # type: ignore[union-attr]
    finally:
        producer.close()
        admin.close()


def test_the_group_load_shows_the_busiest_groups(mq: EchoMQ) -> None:
    q = mq.queue("fg-load")
    assert mq.group_load("fg-load") == GroupLoad(0, [], True)  # no groups: nothing to read
    q.add_bulk([JobSpec({"g": "big"}, group="big") for _ in range(300)])
    q.add_bulk([JobSpec({"g": f"t{i}"}, group=f"t{i}") for i in range(20) for _ in range(i + 1)])
    load = mq.group_load("fg-load", top=3)
    assert load == GroupLoad(21, [("big", 300), ("t19", 20), ("t18", 19)], True)
    groups_of(mq, "fg-load", 42)  # two turns: 21 groups, one job each per turn
    load = mq.group_load("fg-load", top=2)
    assert (load.waiting, load.busiest) == (19, [("big", 298), ("t19", 18)])


#: A step of the fairness property: ("add", group, jobs) or ("claim", count).
STEP = st.one_of(
    st.tuples(st.just("add"), st.sampled_from("abcd"), st.integers(1, 40)),
    st.tuples(st.just("claim"), st.integers(1, 25)),
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(STEP, min_size=1, max_size=25),
    weights=st.fixed_dictionaries({g: st.sampled_from([1, 1, 2, 3]) for g in "abcd"}),
)
def test_groups_with_work_waiting_are_served_within_one_turn_of_each_other(
    mq: EchoMQ, steps: list[tuple[Any, ...]], weights: dict[str, int]
) -> None:
    """Whatever the adds, claims and weights: over any run of claims during which two groups
    both have jobs waiting, their claimed jobs, each divided by its group's weight, differ by
    at most 2 turns (one at each end) - and nothing is claimed twice or lost. (Without groups -
    first in, first out - it fails.)"""
    queue = f"fg-prop-{uuid.uuid4().hex[:8]}"
    q = mq.queue(queue)
    for group, weight in weights.items():
        mq.set_group_weight(queue, group, weight)
    waiting = dict.fromkeys("abcd", 0)
    served: list[tuple[str, dict[str, int]]] = []  # each claimed job, and who waited before it
    for step in [*steps, ("claim", 10_000)]:
        if step[0] == "add":
            _, group, n = step
            q.add_bulk([JobSpec({"g": group}, group=group) for _ in range(n)])
            waiting[group] += n
            continue
        left = step[1]
        while left:
            jobs = q.claim(min(left, 500))
            if not jobs:
                break
            left -= len(jobs)
            for job in jobs:  # a claim takes them in score order: one at a time, as here
                served.append((job.payload["g"], dict(waiting)))
                waiting[job.payload["g"]] -= 1
    assert all(n == 0 for n in waiting.values()) and q.stats()["pending"] == 0
    for a, b in itertools.combinations("abcd", 2):
        run = 0  # claims of a minus claims of b over the current run where both wait
        for group, before in served:
            if before[a] and before[b]:
                run += (group == a) / weights[a] - (group == b) / weights[b]
                assert abs(run) <= 2 + 1e-9, (a, b, weights, served)
            else:
                run = 0


def test_a_grouped_spec_with_a_bad_option_is_still_refused(mq: EchoMQ) -> None:
    """The add's fast path for specs that set only a payload and a group takes no bool for a
    0 and no NaN for no delay."""
    q = mq.queue("fg-fast")
    for spec in (
        JobSpec(1, group="g", priority=False),  # type: ignore[arg-type]
        JobSpec(1, group="g", delay=float("nan")),
        JobSpec(1, group="g", delay=False),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgument):
            q.add_bulk([JobSpec(0, group="g"), spec])
    assert q.stats()["pending"] == 0


def test_a_weighted_group_gets_its_weight_in_jobs_per_turn(mq: EchoMQ) -> None:
    q = mq.queue("fg-weights")
    mq.set_group_weight("fg-weights", "gold", 3)
    assert mq.group_weight("fg-weights", "gold") == 3
    assert mq.group_weight("fg-weights", "bronze") == 1
    q.add_bulk([JobSpec({"g": "gold"}, group="gold") for _ in range(30)])
    q.add_bulk([JobSpec({"g": "bronze"}, group="bronze") for _ in range(30)])
    # each turn: 3 gold, 1 bronze
    assert Counter(groups_of(mq, "fg-weights", 20)) == {"gold": 15, "bronze": 5}
    load = mq.group_load("fg-weights")
    assert dict(load.busiest) == {"gold": 15, "bronze": 25}  # jobs queued, weights counted
    # an add split in two batches keeps the turn it was filling
    q2 = mq.queue("fg-weights-2")
    mq.set_group_weight("fg-weights-2", "gold", 2)
    q2.add_bulk([JobSpec({"g": "gold"}, group="gold")])
    q2.add_bulk([JobSpec({"g": "bronze"}, group="bronze") for _ in range(3)])
    q2.add_bulk([JobSpec({"g": "gold"}, group="gold") for _ in range(3)])
    assert groups_of(mq, "fg-weights-2", 3).count("gold") == 2  # turn 1: gold x2, bronze
    mq.set_group_weight("fg-weights", "gold", None)  # back to one per turn
    assert mq.group_weight("fg-weights", "gold") == 1
    mq.set_group_weight("fg-weights", "gold", 1)  # the same
    assert mq.group_weight("fg-weights", "gold") == 1


@pytest.mark.parametrize(
    ("group", "weight", "what"),
    [("gold", 0, "weight must be an int between 1 and 1000"), ("gold", 1001, "between 1"),
     ("gold", 2.5, "weight must be an int"), ("gold", True, "weight must be an int"),
     ("", 2, "invalid group")],
)  # fmt: skip
def test_a_bad_weight_is_refused_before_anything_is_written(
    mq: EchoMQ, group: str, weight: Any, what: str
) -> None:
    with pytest.raises(InvalidArgument, match=what):
        mq.set_group_weight("fg-bad-weight", group, weight)
    assert mq.connection.execute([Call.cmd("EXISTS", mq.keys.fair("fg-bad-weight"))]) == [0]


def test_weights_are_set_on_every_shard(mq: EchoMQ) -> None:
    names = mq.set_shards("fg-w-sharded", 2)
    mq.set_group_weight("fg-w-sharded", "gold", 4)
    fields = [Call.cmd("HGET", mq.keys.fair(n), "w:gold") for n in names]
    assert mq.connection.execute(fields) in ([b"4", b"4"], ["4", "4"])
    ids = mq.queue("fg-w-sharded").add_bulk(
        [JobSpec({"g": g}, group=g) for g in ["gold"] * 40 + ["tin"] * 40]
    )
    assert len(ids) == 80
    load = mq.group_load("fg-w-sharded", top=2)
    assert dict(load.busiest) == {"gold": 40, "tin": 40}  # both shards' jobs, added up
