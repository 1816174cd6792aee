"""Per-input read settings through input metadata (``AssetIn(metadata=echomq_input(...))``):
one IO manager, inputs that wait and close their flows each their own way; a typo or a bad
value refused with ``InvalidInput`` naming the key - ``echomq_input`` when the Definitions
load, a hand-written metadata dict before the input waits or reads. Real Dagster, server and
workers."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
from collections.abc import Callable
from typing import Any

import pytest
from dagster import AssetExecutionContext, AssetIn, DagsterInstance, asset, materialize
from dagster_echomq import EchoMQIOManager, EchoMQResource, echomq_input
from dagster_support import client_url

from echomq_core import Child, EchoMQ, FlowRef, FlowTimeout, InvalidInput

PARENT, CHILD = "is-parent", "is-child"


def resources(url: str, prefix: str, **io_options: Any) -> dict[str, Any]:
    echomq = EchoMQResource(url=url, prefix=prefix)
    options = {"poll_interval": 0.05, **io_options}
    return {"echomq": echomq, "echomq_io": EchoMQIOManager.from_resource(echomq, **options)}


@asset(io_manager_key="echomq_io")
def is_fan(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
    children = [Child({"n": i}, queue=CHILD) for i in range(4)]
    return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context))


@pytest.mark.onlystandalone
def test_an_input_keeps_its_flow_open_and_another_closes_it(
    backend: Any, prefix: str, workers: Callable[..., Any], instance: DagsterInstance
) -> None:
    """close_after_read=False on one reader: the flow is still released once it has read it;
    the same run's next reader (the IO manager's default) reads it and closes it."""
    url = client_url(backend)
    workers(url, prefix, CHILD)
    states: dict[str, str | None] = {}

    def state_of(flow: dict[str, Any]) -> str | None:
        parent = next(iter(flow)).rsplit(".", 1)[0]
        with EchoMQ(url, prefix=prefix) as mq:
            return mq.snapshot(PARENT, parent).parent_state

    @asset(ins={"is_fan": AssetIn(metadata=echomq_input(close_after_read=False, page=2))})
    def peek(is_fan: dict[str, Any]) -> int:
        states["peek"] = state_of(is_fan)
        return len(is_fan)

    @asset(deps=[peek])
    def consume(is_fan: dict[str, Any]) -> int:
        states["consume"] = state_of(is_fan)
        return len(is_fan)

    result = materialize(
        [is_fan, peek, consume], resources=resources(url, prefix), instance=instance
    )
    assert (result.output_for_node("peek"), result.output_for_node("consume")) == (4, 4)
    assert states == {"peek": "released", "consume": "closed"}


@pytest.mark.onlystandalone
def test_an_inputs_stall_timeout_overrides_the_io_managers(
    backend: Any, prefix: str, instance: DagsterInstance
) -> None:
    """No worker: the input's own 0.5 s stall limit fails the step, not the IO manager's 20 s,
    and the flow is cancelled as on any stall (its cancel_on_failure left as configured)."""
    url = client_url(backend)

    @asset(ins={"is_fan": AssetIn(metadata={"echomq/stall_timeout": 0.5, "owner": "me"})})
    def impatient(is_fan: dict[str, Any]) -> int:
        return len(is_fan)

    with pytest.raises(FlowTimeout, match=r"no child settled for 0\.5s"):
        materialize(
            [is_fan, impatient],
            resources=resources(url, prefix, stall_timeout=20.0),
            instance=instance,
        )
    with EchoMQ(url, prefix=prefix) as mq:
        assert len(mq.list_flows(PARENT, "cancelled")) == 1


@pytest.mark.onlystandalone
def test_a_misspelt_input_setting_is_refused_before_any_wait(
    backend: Any, prefix: str, instance: DagsterInstance
) -> None:
    """A typo in a hand-written key fails the load at once, naming the key (no worker runs:
    a wait would block for the stall limit), and leaves the flow as it was."""
    url = client_url(backend)

    @asset(ins={"is_fan": AssetIn(metadata={"echomq/stal_timeout": 5})})
    def typo(is_fan: dict[str, Any]) -> int:
        return len(is_fan)

    with pytest.raises(
        InvalidInput,
        match=r"input 'is_fan': unknown EchoMQ input setting "
        r"'echomq/stal_timeout'; known: echomq/wait_timeout, ",
    ):
        materialize(
            [is_fan, typo], resources=resources(url, prefix, stall_timeout=30.0), instance=instance
        )
    with EchoMQ(url, prefix=prefix) as mq:
        (held,) = mq.list_flows(PARENT, "held")
        assert mq.snapshot(PARENT, held.parent_id).outcome == "waiting"  # not cancelled


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        ({"stall_timeout": -1}, r"'echomq/stall_timeout' must be a number of seconds > 0"),
        ({"wait_timeout": "1h"}, r"'echomq/wait_timeout' must be a number of seconds > 0"),
        ({"page": 2.5}, r"'echomq/page' must be a whole number > 0"),
        ({"page": True}, r"'echomq/page' must be a whole number > 0"),
        ({"close_after_read": 1}, r"'echomq/close_after_read' must be True or False"),
        ({"poll_interval": float("nan")}, r"'echomq/poll_interval' must be a number"),
        ({"stall_timeout": 5, "no_stall_limit": True}, "not both"),
    ],
)
def test_echomq_input_refuses_a_bad_value_when_the_definitions_load(
    options: dict[str, Any], refused: str
) -> None:
    with pytest.raises(InvalidInput, match=refused):
        echomq_input(**options)


def test_echomq_input_writes_only_what_it_is_given() -> None:
    assert echomq_input(stall_timeout=30, close_after_read=False) == {
        "echomq/stall_timeout": 30.0,
        "echomq/close_after_read": False,
    }
    assert echomq_input(no_stall_limit=True) == {"echomq/stall_timeout": None}
