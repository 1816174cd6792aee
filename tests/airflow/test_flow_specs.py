"""DAG values -> flow arguments, and the operator / sensor options that need no DAG run."""

from __future__ import annotations

import pytest
from echomq_provider.flow_specs import flow_target, parent_id_for, to_children

from echomq_core import Child, EchoMQ, FlowRef, InvalidInput
from echomq_core.wire.keyspace import JOB_ID_RE


def test_parent_id_is_stable_unique_and_valid() -> None:
    run_id = "manual__2026-01-01T00:00:00.123456+00:00"  # ':' is not allowed in job ids
    pid = parent_id_for("etl", run_id, "fan_out")
    assert pid == parent_id_for("etl", run_id, "fan_out", -1)  # no try number: retries agree
    assert pid.startswith("JOB-af/etl/fan_out/") and JOB_ID_RE.fullmatch(pid)
    others = {
        parent_id_for("etl", run_id, "fan_out", 0),
        parent_id_for("etl", "r2", "fan_out"),
        parent_id_for("etl", run_id, "other"),
        parent_id_for("etl2", run_id, "fan_out"),
    }
    assert pid not in others and len(others) == 4
    long_id = parent_id_for("d" * 250, run_id, "group." + "t" * 240, 99999)
    assert JOB_ID_RE.fullmatch(long_id + ".1000000")  # room left for child suffixes


def test_children_from_specs_payloads_and_child_objects() -> None:
    children = to_children(
        [
            {"payload": {"n": 1}, "queue": "a", "ignore_failure": True, "max_attempts": 2},
            {"payload": [1, 2]},
            7,
            Child("x", id="JOB-own"),
        ],
        default_queue="work",
        default_max_attempts=5,
    )
    assert [
        (c.payload, c.queue, c.ignore_dependency_on_failure, c.max_attempts) for c in children
    ] == [
        ({"n": 1}, "a", True, 2),
        ([1, 2], "work", False, 5),
        (7, "work", False, 5),
        ("x", "work", False, None),
    ]
    assert children[3].id == "JOB-own"


def test_child_timeouts_pass_through() -> None:
    children = to_children(
        [{"payload": 1, "timeout": 2.5}, {"payload": 2}, 3, Child(4), Child(5, timeout=9)],
        default_timeout=60,
    )
    assert [c.timeout for c in children] == [2.5, 60, 60, 60, 9]
    assert [c.timeout for c in to_children([{"payload": 1}, 2])] == [None, None]


def test_a_childs_group_passes_through() -> None:
    """A spec's ``group`` (a tenant, an account) is its child's fairness group."""
    children = to_children(
        [{"payload": 1, "group": "acme/eu"}, {"payload": 2}, Child(3, group="x")]
    )
    assert [c.group for c in children] == ["acme/eu", None, "x"]


@pytest.mark.parametrize(
    ("items", "complaint"),
    [
        ({"payload": 1}, "must be a list"),
        ("[1, 2]", "must be a list"),
        ([{"n": 1}], r"child 0: unknown key\(s\) 'n'.*under 'payload'"),
        ([1, {"queue": "a"}], "child 1: no 'payload' key"),
        ([{"payload": 1, "ignore_failure": "yes"}], "ignore_failure must be true or false"),
        ([{"payload": 1, "max_attempts": 0}], "max_attempts must be an int >= 1"),
        ([{"payload": 1, "queue": "bad queue"}], "invalid queue name"),
        ([{"payload": 1, "timeout": 0}], "timeout must be seconds > 0"),
        ([{"payload": 1, "timeout": "1m"}], "timeout must be seconds > 0"),
        ([1, {"payload": 1, "group": ""}], "child 1: invalid group ''"),
        ([{"payload": 1, "group": "t" * 205}], "child 0: invalid group .* 205 bytes"),
        ([{"payload": 1, "group": 7}], "child 0: group must be a str"),
    ],
)
def test_bad_children_are_refused_by_item(items: object, complaint: str) -> None:
    with pytest.raises(InvalidInput, match=complaint):
        to_children(items)


def test_flow_target_forms() -> None:
    assert flow_target({"queue": "q", "parent_id": "JOB-1"}) == ("q", "JOB-1")
    assert flow_target(FlowRef("q", "JOB-2")) == ("q", "JOB-2")
    assert flow_target(None, "q", "JOB-3") == ("q", "JOB-3")
    for bad in [
        ({"queue": "q"},),
        ({"queue": "q", "parent_id": "JOB-1"}, "q", None),
        (None, "q", None),
        ("q/JOB-1",),
        (None, "q", "not-a-job"),
    ]:
        with pytest.raises(InvalidInput):
            flow_target(*bad)


def test_sensor_deferrable_defaults_from_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from echomq_provider.sensors.echo_flow import EchoFlowSensor

    ref = {"queue": "q", "parent_id": "JOB-1"}
    assert EchoFlowSensor(task_id="a", flow=ref).deferrable is False
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "true")
    assert EchoFlowSensor(task_id="b", flow=ref).deferrable is True
    assert EchoFlowSensor(task_id="c", flow=ref, deferrable=False).deferrable is False
    with pytest.raises(InvalidInput, match="parent_queue and parent_id"):
        EchoFlowSensor(task_id="d", parent_queue="q")


def test_template_fields_do_not_shadow_operator_fields() -> None:
    from airflow.sdk import BaseOperator
    from echomq_provider.operators.echo_flow import EchoFlowOperator
    from echomq_provider.sensors.echo_flow import EchoFlowSensor

    base = set(BaseOperator(task_id="base").__dict__) | set(dir(BaseOperator))
    for cls in (EchoFlowOperator, EchoFlowSensor):
        assert not set(cls.template_fields) & base, cls


# -- keys ----------------------------------------------------------------------------------


def test_keys_become_child_ids_and_come_back_exactly() -> None:
    from echomq_provider.flow_specs import child_label, keyed_child_id

    parent = parent_id_for("dag", "run", "task")
    keys = ["2026-01-01", "s3://bucket/a b.csv", "ümlaut~", "a" * 50]
    children = to_children(
        [{"payload": i, "key": key} for i, key in enumerate(keys)], parent_id=parent
    )
    assert [c.id for c in children] == [keyed_child_id(parent, k) for k in keys]
    assert [child_label(parent, c.id) for c in children if c.id] == keys
    assert child_label(parent, f"{parent}.7") == 7
    assert child_label(parent, f"{parent}.g3.12") == 12  # a replaced flow's generation
    assert child_label(parent, "JOB-other") == "JOB-other"
    # another parent's keyed ids are not this one's
    assert child_label(parent, keyed_child_id(parent + "x", "k")) != "k"


def test_a_flows_labeller_labels_as_child_label() -> None:
    from echomq_provider.flow_specs import child_label, keyed_child_id, labeller

    parent = parent_id_for("dag", "run", "task")
    ids = [
        f"{parent}.0",
        f"{parent}.19999",
        f"{parent}.g3.12",
        f"{parent}.x1",
        f"{parent}.\u0661",  # a non-ASCII digit: not an index
        f"{parent}x.1",
        "JOB-other",
        keyed_child_id(parent, "7"),
        keyed_child_id(parent + "x", "k"),
    ]
    label = labeller(parent)
    assert [label(i) for i in ids] == [child_label(parent, i) for i in ids]
    assert label(f"{parent}.19999") == 19999 and label(keyed_child_id(parent, "7")) == "7"


@pytest.mark.parametrize(
    ("specs", "complaint"),
    [
        ([{"payload": 1, "key": "a"}, {"payload": 2}], "child 1 has no 'key'"),
        ([{"payload": 1, "key": "a"}, {"payload": 2, "key": "a"}], "also child 0's"),
        ([{"payload": 1, "key": 5}], "key must be a non-empty string"),
        ([{"payload": 1, "key": ""}], "key must be a non-empty string"),
        ([{"payload": 1, "key": "€" * 60}], "too long"),
    ],
)
def test_bad_keys_are_refused_by_name(specs: list[dict[str, object]], complaint: str) -> None:
    with pytest.raises(InvalidInput, match=complaint):
        to_children(specs, parent_id="JOB-p")


def test_grouped_keyed_specs_land_under_the_providers_parent_id(mq: EchoMQ) -> None:
    """Specs as a DAG's upstream task returns them - keyed, grouped - under the parent id the
    provider derives (it holds '/'), added to a real server: each child lands under its keyed
    id, names its group, and the groups take turns."""
    parent = parent_id_for("tenants_daily", "scheduled__2026-12-07T00:00:00+00:00", "fan_out")
    specs = [
        {"payload": {"row": i}, "key": f"{tenant}/{i}", "group": tenant, "queue": "af-groups"}
        for tenant, n in (("big-bank", 40), ("acme/eu", 2)) for i in range(n)
    ]  # fmt: skip
    ref = mq.add_flow("af-parents", to_children(specs, parent_id=parent), parent_id=parent)
    assert "/" in ref.parent_id
    q = mq.queue("af-groups")
    first = [mq.get_job("af-groups", job.id) for job in q.claim(4)]
    assert sorted(j.group for j in first if j) == ["acme/eu", "acme/eu", "big-bank", "big-bank"]
