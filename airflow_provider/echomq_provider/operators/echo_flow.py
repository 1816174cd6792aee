"""EchoFlowOperator: add a flow (a parent held until its children settle) from a DAG.

Using::

    plan = plan_work()                     # an upstream task returning child specs
    fan_out = EchoFlowOperator(
        task_id="fan_out",
        parent_queue="reports",            # the parent's queue
        payload={"day": "{{ ds }}"},       # the parent's payload (templated)
        children=plan,                     # a literal list, or an upstream task's output
        child_queue="work",                # default queue of children that name none
    )
    wait = EchoFlowSensor(task_id="wait", flow=fan_out.output)

The task returns ``{"queue": ..., "parent_id": ...}`` as its XCom value: the reference a
sensor (or anything else) reads the flow by. A child spec may give a ``key`` (every spec or
none): its result is then read back under that key instead of the spec's index.

Retry-safe: the parent id comes from :func:`~echomq_provider.flow_specs.parent_id_for` (dag
id, run id, task id, map index; never the try number) and child ids from the parent's, so an
Airflow retry of this task re-adds the same flow, which EchoMQ converges, instead of adding a
second one.

What each Airflow action does to the flow (with the sensor's defaults):

==========================================  ================================================
Airflow action                              the flow
==========================================  ================================================
the operator runs                           added (parent held, children pending)
the operator runs with no children (an      nothing is added: the task is skipped, and so are
empty plan)                                 the tasks waiting on it - as ``.expand()`` over an
                                            empty list skips its mapped task
the operator retries (try 2, 3, ...)        the same flow: the add converges, nothing twice
operator cleared, flow released or closed   nothing re-runs; the sensor reads it again
(within retention)                          (closed retention: 1 day by default)
operator cleared, flow failed or cancelled  repaired: dead (and cancelled, never-started)
                                            children re-run with fresh attempts; completed
                                            ones keep their values (``repair=False``: the
                                            task fails instead)
operator cleared, the plan changed          ``on_conflict="fail"`` (default): the task fails
(other children)                            naming the conflict; ``"replace"``: the old flow
                                            is cancelled and taken away, the new one added
                                            as a new generation of child ids
operator cleared after the flow expired     added afresh: every child runs
the sensor succeeds                         closed: retention starts, results stay readable
a fail-parent child dies                    the sensor fails at once naming it; the flow is
                                            cancelled (``cancel_on_failure=False``: not)
the sensor times out (soft_fail or not)     cancelled
the sensor is marked failed (running or     cancelled; in reschedule mode between two pokes
deferred), or killed by execution_timeout   no code runs: ``echomq flow cancel`` it
the sensor is cleared or marked success     left as it is; a cleared sensor waits again
==========================================  ================================================

Errors: bad input (queue names, child specs, payloads) and conflicts fail the task without
retries (``AirflowFailException``: another try cannot fix them); a lost connection raises as
is, so the task's ``retries`` apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from echomq_core import FlowConflict, FlowRef, InvalidInput

from .._compat import AirflowFailException, AirflowSkipException
from ..flow_specs import parent_id_for, to_children
from ..hooks.echomq import EchoMQHook
from ..plugins.links import EchoFlowLink

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The choices of ``on_conflict``.
ON_CONFLICT = ("fail", "replace")


class EchoFlowOperator(BaseOperator):
    """Add a flow; return its reference.

    :param parent_queue: the parent's queue. (Not ``queue``: that is every operator's executor
        queue.)
    :param children: the children: a list whose items are child specs
        (``{"payload": ..., "queue": ..., "ignore_failure": bool, "max_attempts": int,
        "timeout": seconds}``), bare
        payloads, or :class:`~echomq_core.Child` objects; or an upstream task's output
        (an ``XComArg``) that resolves to such a list. See
        :func:`~echomq_provider.flow_specs.to_children`.
    :param payload: the parent's payload (JSON-serialisable).
    :param child_queue: the queue of children that name none (default: the parent's).
    :param child_max_attempts: attempts of children that set none (default: ``max_attempts``).
    :param child_timeout: the handler time limit (seconds) of children that set none (default:
        the worker's queue setting). Past it the worker fails the attempt with TimeoutError.
    :param max_attempts: the parent's attempts, and the children's default.
    :param parent_id: an explicit parent id (``JOB-...``). Leave it unset to get the derived,
        retry-safe id; an explicit one must be just as stable across tries.
    :param barrier: True (the default): the flow is read by a sensor, not run by a worker -
        its parent is never claimed, and :class:`~echomq_provider.sensors.echo_flow.
        EchoFlowSensor` closes it once it has read the results (its retention then runs).
        False: a worker runs the parent (give it a handler for ``parent_queue``).
    :param repair: when the flow under this task's id failed or was cancelled (the task was
        cleared after its sensor failed), repair it - re-run its dead and cancelled children
        only (default True); False: fail the task.
    :param on_conflict: what to do when this task's id holds a flow of *other* children (the
        plan changed before a clear): ``"fail"`` (the default) or ``"replace"`` (cancel the
        old flow and add this one as a new generation).
    :param echomq_conn_id: the ``echomq`` connection.
    :param prefix: key prefix, overriding the connection's.
    """

    #: "EchoMQ flow" on the task instance: the flow's page in the dashboard the plugin
    #: mounts in the api-server (see :mod:`echomq_provider.plugins`).
    operator_extra_links = (EchoFlowLink(),)
    template_fields: Sequence[str] = (
        "parent_queue",
        "children",
        "payload",
        "child_queue",
        "parent_id",
    )
    template_fields_renderers = {"children": "json", "payload": "json"}
    ui_color = "#f4d9c6"

    def __init__(
        self,
        *,
        parent_queue: str,
        children: Any,
        payload: Any = None,
        child_queue: str | None = None,
        child_max_attempts: int | None = None,
        child_timeout: float | None = None,
        max_attempts: int = 3,
        parent_id: str | None = None,
        barrier: bool = True,
        repair: bool = True,
        on_conflict: str = "fail",
        echomq_conn_id: str = EchoMQHook.default_conn_name,
        prefix: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.parent_queue = parent_queue
        self.children = children
        self.payload = payload
        self.child_queue = child_queue
        self.child_max_attempts = child_max_attempts
        self.child_timeout = child_timeout
        self.max_attempts = max_attempts
        self.parent_id = parent_id
        self.barrier = barrier
        if on_conflict not in ON_CONFLICT:
            raise InvalidInput(
                f"{self.task_id}: on_conflict must be one of {', '.join(ON_CONFLICT)}, "
                f"got {on_conflict!r}"
            )
        if not isinstance(repair, bool):
            raise InvalidInput(f"{self.task_id}: repair must be True or False, got {repair!r}")
        self.repair = repair
        self.on_conflict = on_conflict
        self.echomq_conn_id = echomq_conn_id
        self.prefix = prefix

    def execute(self, context: Context) -> dict[str, str]:
        ti = context["ti"]
        map_index = -1 if ti.map_index is None else ti.map_index
        parent_id = self.parent_id or parent_id_for(ti.dag_id, ti.run_id, ti.task_id, map_index)
        hook = EchoMQHook(self.echomq_conn_id, prefix=self.prefix)
        try:
            try:
                children = to_children(
                    self.children,
                    default_queue=self.child_queue,
                    default_max_attempts=self.child_max_attempts,
                    default_timeout=self.child_timeout,
                    parent_id=parent_id,
                )
                if not children:  # a flow needs a child; an empty plan skips, as .expand()
                    raise AirflowSkipException(
                        f"no children for flow {parent_id}: nothing to fan out (the tasks "
                        "waiting on this one are skipped too)"
                    )
                ref = hook.get_conn().add_flow(
                    self.parent_queue,
                    children,
                    payload=self.payload,
                    parent_id=parent_id,
                    max_attempts=self.max_attempts,
                    barrier=self.barrier,
                    replace=self.on_conflict == "replace",
                )
            except FlowConflict as exc:
                raise AirflowFailException(
                    f"cannot add flow {parent_id}: {exc} (the children differ from the flow "
                    "added under this task's id before; on_conflict='replace' replaces it)"
                ) from exc
            except InvalidInput as exc:
                raise AirflowFailException(f"cannot add flow {parent_id}: {exc}") from exc
            self.log.info(
                "Flow %s in queue %r: %d children (try %s; a retry re-adds the same flow)",
                ref.parent_id,
                ref.queue,
                len(children),
                ti.try_number,
            )
            self._repair_if_needed(hook, ref)
        finally:
            hook.close()
        return {"queue": ref.queue, "parent_id": ref.parent_id}

    def _repair_if_needed(self, hook: EchoMQHook, ref: FlowRef) -> None:
        mq = hook.get_conn()
        snap = mq.snapshot(ref.queue, ref.parent_id)
        if snap.outcome == "released":
            self.log.info(
                "Flow %s was released before (%s): nothing re-runs; its results are read again",
                ref.parent_id,
                snap.parent_state,
            )
            return
        if snap.outcome not in ("failed", "cancelled"):
            return
        if not self.repair:
            raise AirflowFailException(
                f"flow {ref.parent_id} is {snap.outcome} ({snap.error}); repair=False"
            )
        result = mq.retry_flow(ref.queue, ref.parent_id)
        self.log.info(
            "Flow %s was %s: repaired (repair %d): %d children re-run; the %d that completed "
            "keep their values",
            ref.parent_id,
            snap.outcome,
            result.repairs,
            result.requeued,
            snap.processed,
        )
