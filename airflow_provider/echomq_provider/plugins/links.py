"""The "EchoMQ flow" extra links of the flow operator and sensor (see :mod:`.dashboard`).

Kept apart from the plugin so the operator and sensor modules can import them cheaply. Airflow
3 computes a task's extra links in the worker when the task ends (only those its class
declares in ``operator_extra_links``) and serves them from XCom; so the classes declare::

    operator_extra_links = (EchoFlowLink(),)        # EchoFlowOperator
    operator_extra_links = (EchoFlowSensorLink(),)  # EchoFlowSensor
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperatorLink

from echomq_core.integration import flow_page

from .._compat import conf

#: Where the dashboard is mounted in the api-server.
URL_PREFIX = "/echomq"


def flow_url(queue: str, parent_id: str) -> str:
    """The flow's page in the mounted dashboard (absolute when ``[api] base_url`` is set)."""
    base = conf.get("api", "base_url", fallback="") or ""
    return flow_page(base.rstrip("/") + URL_PREFIX, queue, parent_id)


class EchoFlowLink(BaseOperatorLink):
    """ "EchoMQ flow" on an :class:`EchoFlowOperator` task instance: the flow it added (what
    the operator returned; else the id it derives from the task instance)."""

    name = "EchoMQ flow"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        flow = None
        pull = getattr(ti_key, "xcom_pull", None)  # the worker passes its task instance
        if pull is not None:
            try:
                flow = pull(task_ids=ti_key.task_id, key="return_value")
            except Exception:  # no XCom (the task failed before returning): derive the id
                flow = None
        if isinstance(flow, dict) and "queue" in flow and "parent_id" in flow:
            return flow_url(str(flow["queue"]), str(flow["parent_id"]))
        from ..flow_specs import parent_id_for

        map_index = getattr(ti_key, "map_index", -1)
        parent_id = getattr(operator, "parent_id", None) or parent_id_for(
            ti_key.dag_id, ti_key.run_id, ti_key.task_id, -1 if map_index is None else map_index
        )
        return flow_url(str(operator.parent_queue), str(parent_id))


class EchoFlowSensorLink(BaseOperatorLink):
    """ "EchoMQ flow" on an :class:`EchoFlowSensor` task instance: the flow it waits on."""

    name = "EchoMQ flow"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from ..flow_specs import flow_target

        queue, parent_id = flow_target(
            getattr(operator, "flow", None),
            getattr(operator, "parent_queue", None),
            getattr(operator, "parent_id", None),
        )
        return flow_url(queue, parent_id)
