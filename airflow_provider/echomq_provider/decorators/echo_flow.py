"""``@task.echo_flow``: a TaskFlow function whose return value is fanned out as a flow.

Using::

    from airflow.sdk import dag, task

    @task.echo_flow(parent_queue="reports", child_queue="work", wait_for_completion=True)
    def fan_out(day: str) -> list[dict]:
        return [{"payload": {"day": day, "shard": n}} for n in range(200)]

    @task
    def summarise(flow: dict) -> int:
        return sum(value for _index, value in flow_results(flow))

    summarise(fan_out("{{ ds }}"))

The function plans the children (a list of child specs, bare payloads or
:class:`~echomq_core.Child` objects, as :class:`~echomq_provider.operators.echo_flow.
EchoFlowOperator`'s ``children``); the task adds them as one flow. Every other argument is
EchoFlowOperator's: with ``wait_for_completion=True`` the same task waits until the flow is
released and returns the sensor's summary (or, with ``return_values=True``, the values), so
plan, fan-out and wait are one task - against three (``plan``, the operator, the sensor)
done separately. Without it the task returns the flow's reference for an
:class:`~echomq_provider.sensors.echo_flow.EchoFlowSensor`.

Everything the operator promises holds: a retry re-adds the same flow (the parent id is
derived from the task instance), an empty list skips the task and what waits on it, a clear
after a failure repairs the flow, ``.expand()`` gives each mapped instance its own flow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, task_decorator_factory
from airflow.sdk.definitions.context import context_merge

from .._compat import determine_kwargs
from ..operators.echo_flow import EchoFlowOperator

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.bases.decorator import TaskDecorator


class _EchoFlowDecoratedOperator(DecoratedOperator, EchoFlowOperator):
    """EchoFlowOperator whose children are what the decorated function returns."""

    custom_operator_name = "@task.echo_flow"
    template_fields: Sequence[str] = (
        *DecoratedOperator.template_fields,
        *(name for name in EchoFlowOperator.template_fields if name != "children"),
    )
    template_fields_renderers = {
        **DecoratedOperator.template_fields_renderers,
        **EchoFlowOperator.template_fields_renderers,
    }
    _children_from_callable = True

    def __init__(
        self,
        *,
        python_callable: Callable[..., Any],
        op_args: Sequence[Any] | None = None,
        op_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs["multiple_outputs"] = False  # the return value is the operator's, not the plan
        super().__init__(
            python_callable=python_callable, op_args=op_args, op_kwargs=op_kwargs, **kwargs
        )

    def execute(self, context: Context) -> Any:
        context_merge(context, self.op_kwargs)
        kwargs = determine_kwargs(self.python_callable, self.op_args, context)
        self.children = self.python_callable(*self.op_args, **kwargs)
        return super().execute(context)


def echo_flow_task(
    python_callable: Callable[..., Any] | None = None, **kwargs: Any
) -> TaskDecorator:
    """Wrap a function planning a flow's children into an EchoFlowOperator
    (``@task.echo_flow(parent_queue=..., ...)``; the arguments are the operator's)."""
    return task_decorator_factory(
        python_callable=python_callable,
        multiple_outputs=False,
        decorated_operator_class=_EchoFlowDecoratedOperator,
        **kwargs,
    )
