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
the sensor is marked failed (running or     cancelled
deferred), or killed by execution_timeout
Airflow fails the sensor or the waiting     held: cancelled; released: closed - by the
task without running its code (marked       failure callbacks the provider adds to the task
failed between reschedule pokes, a lost     and its DAG (see :mod:`echomq_provider.settle`)
heartbeat, its process killed)
the sensor is cleared or marked success     left as it is; a cleared sensor waits again
``wait_for_completion=True``: the flow        the task fails and cancels the flow, as the
fails, ``wait_timeout`` passes, or the task  sensor would (``cancel_on_failure=False``: not);
is killed (marked failed) while waiting       cleared or marked success: left as it is
==========================================  ================================================

``wait_for_completion=True`` (and ``@task.echo_flow``, see
:mod:`echomq_provider.decorators.echo_flow`) folds the sensor into this task: after adding,
it waits until the flow is released - in its own process (reads 5 ms apart at first, the
pauses growing by half up to ``poll_interval``), or deferred to the trigger with
``deferrable=True`` (after up to 2 s of those reads, :data:`~echomq_provider.waiting.
IN_TASK_WAIT`: a flow released by then costs no deferral) - and returns the sensor's summary
(or the values, ``return_values``).
Airflow schedules one task instead of two; the slot is held while waiting unless deferred.

Errors: bad input (queue names, child specs, payloads) and conflicts fail the task without
retries (``AirflowFailException``: another try cannot fix them); a lost connection raises as
is, so the task's ``retries`` apply.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from echomq_core import FlowConflict, FlowRef, InvalidInput
from echomq_core.checks import check_int, check_seconds
from echomq_core.flows.lifecycle import repair_on_readd
from echomq_core.flows.waiting import FlowWait
from echomq_core.queues.adding import gc_paused
from echomq_core.wire.keyspace import check_queue

from .. import settle
from .._compat import AirflowFailException, AirflowSkipException, clear_number
from ..errors import TooManyValues
from ..flow_specs import parent_id_for, to_children
from ..hooks.echomq import EchoMQHook
from ..plugins.links import EchoFlowLink
from ..waiting import IN_TASK_WAIT, FlowWaiting, too_many_values

if TYPE_CHECKING:
    from airflow.sdk import Context

#: The choices of ``on_conflict``.
ON_CONFLICT = ("fail", "replace")


class EchoFlowOperator(FlowWaiting, BaseOperator):
    """Add a flow; return its reference (or, with ``wait_for_completion``, what
    :class:`~echomq_provider.sensors.echo_flow.EchoFlowSensor` would return).

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
    :param max_running: at most this many of the flow's children are leased at once, whatever
        the number of workers (``EchoMQ.add_flow(max_running=)``); default None: no cap. An
        Airflow retry must keep it: a re-add with another cap fails the task.
    :param parent_id: an explicit parent id (``JOB-...``). Leave it unset to get the derived,
        retry-safe id; an explicit one must be just as stable across tries.
    :param min_success: a success threshold (``EchoMQ.add_flow(min_success=)``): a fraction
        in (0, 1] or a count of children that must succeed; the others may die without
        failing the flow. Default None: any death fails it.
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
    :param wait_for_completion: after adding, wait until the flow is released and return what
        :class:`~echomq_provider.sensors.echo_flow.EchoFlowSensor` returns (the summary, with
        ``queue`` and ``parent_id``, or the values): one task instead of an operator and a
        sensor. Default False: return the reference at once.
    :param deferrable: with ``wait_for_completion``, wait in the triggerer (the slot is freed;
        resuming costs the scheduler another round) once 2 s of reads in the task did not see
        the flow released (sooner when its settle rate says it will take longer; see
        :data:`~echomq_provider.waiting.IN_TASK_WAIT`). Default: ``[operators]
        default_deferrable``. Not deferred, the task reads the flow in its own process, first
        after 5 ms, then half as long again each time up to ``poll_interval``.
    :param poll_interval: with ``wait_for_completion``, the most seconds between two reads
        (default 0.25; deferred, at most 1).
    :param wait_timeout: with ``wait_for_completion``, the most seconds to wait (default: no
        limit but ``execution_timeout``); past it the task fails and the flow is cancelled.
    :param return_values: with ``wait_for_completion``: as the sensor's (default False).
    :param max_values: with ``wait_for_completion``: as the sensor's (default 1,024).
    :param close_flow: with ``wait_for_completion``: as the sensor's (default True).
    :param cancel_on_failure: with ``wait_for_completion``: cancel the flow when the wait
        fails, times out or the task is killed while waiting (default True).
    :param end_from_trigger: with ``wait_for_completion`` and deferred: as the sensor's
        (default None: the trigger ends the task unless plugins registered listeners).
    :param stream: keep the flow's settle log (``EchoMQ.add_flow(stream=True)``), so a task
        downstream of this one reads the results as the children settle with
        ``flow_results(flow, follow=True)`` (:mod:`echomq_provider.results`). Default False.
        A retry or clear must keep it: a re-add with the other setting fails the task.
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
    #: ``@task.echo_flow``: the children come from the decorated function when it runs.
    _children_from_callable = False

    def __init__(
        self,
        *,
        parent_queue: str,
        children: Any = None,
        payload: Any = None,
        child_queue: str | None = None,
        child_max_attempts: int | None = None,
        child_timeout: float | None = None,
        max_attempts: int = 3,
        max_running: int | None = None,
        parent_id: str | None = None,
        barrier: bool = True,
        min_success: float | None = None,
        repair: bool = True,
        on_conflict: str = "fail",
        echomq_conn_id: str = EchoMQHook.default_conn_name,
        prefix: str | None = None,
        wait_for_completion: bool = False,
        deferrable: bool | None = None,
        poll_interval: float = 0.25,
        wait_timeout: timedelta | float | None = None,
        return_values: bool = False,
        max_values: int = 1024,
        close_flow: bool = True,
        cancel_on_failure: bool = True,
        end_from_trigger: bool | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if children is None and not self._children_from_callable:
            raise InvalidInput(f"{self.task_id}: children is required")
        if not isinstance(wait_for_completion, bool):
            raise InvalidInput(
                f"{self.task_id}: wait_for_completion must be True or False, got "
                f"{wait_for_completion!r}"
            )
        if isinstance(wait_timeout, timedelta):
            wait_timeout = wait_timeout.total_seconds()
        self.wait_for_completion = wait_for_completion
        self.poll_interval = check_seconds("poll_interval", poll_interval, 0.001, 3600)
        self.wait_timeout = (
            None if wait_timeout is None else check_seconds("wait_timeout", wait_timeout, 0.001)
        )
        self._init_waiting(
            deferrable=deferrable,
            return_values=return_values,
            max_values=max_values,
            close_flow=close_flow,
            cancel_on_failure=cancel_on_failure,
            end_from_trigger=end_from_trigger,
            settles=wait_for_completion,
        )
        self._ref: tuple[str, str] | None = None
        self.parent_queue = parent_queue
        self.children = children
        if isinstance(children, list | tuple):  # a literal plan: refused when parsed
            self._check_values(f"{self.task_id}: the plan", len(children))
        self.payload = payload
        self.child_queue = child_queue
        self.child_max_attempts = child_max_attempts
        self.child_timeout = child_timeout
        self.max_attempts = max_attempts
        # refused at parse time, as the core refuses it (InvalidArgument names the value)
        self.max_running = None if max_running is None else check_int("max_running", max_running, 1)
        self.parent_id = parent_id
        self.barrier = barrier
        self.min_success = min_success  # checked by the add (InvalidArgument names it)
        if on_conflict not in ON_CONFLICT:
            raise InvalidInput(
                f"{self.task_id}: on_conflict must be one of {', '.join(ON_CONFLICT)}, "
                f"got {on_conflict!r}"
            )
        for name, flag in (("repair", repair), ("stream", stream)):
            if not isinstance(flag, bool):
                raise InvalidInput(f"{self.task_id}: {name} must be True or False, got {flag!r}")
        self.stream = stream
        if stream and not wait_for_completion:
            # its follower (flow_results(..., follow=True) downstream) may be failed or killed
            # without running its code: Airflow's failure callbacks settle the flow as a
            # waiting task's (a held flow nobody will read cancelled, a released one closed)
            self._settles = True
            settle.install(self)
        self.repair = repair
        self.on_conflict = on_conflict
        self.echomq_conn_id = echomq_conn_id
        self.prefix = prefix

    def execute(self, context: Context) -> Any:
        try:  # one client (FlowWaiting's) for the add and the wait
            ref = self._add(context)
            if not self.wait_for_completion:
                return ref
            self._ref = (ref["queue"], ref["parent_id"])
            with self._cancel_when_giving_up(context):
                return self._wait(context)
        finally:
            self._close()

    def resume_execution(
        self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context
    ) -> Any:
        # Deferred with wait_for_completion: execute_complete, or a deferral that timed out
        # in the triggerer ("__fail__"); either way a failure cancels the flow.
        self._ref = self._own_ref(context)
        try:
            with self._cancel_when_giving_up(context):
                return super().resume_execution(next_method, next_kwargs, context)
        finally:
            self._close()

    def on_kill(self) -> None:
        if self.wait_for_completion and self._ref is not None:  # killed while waiting
            super().on_kill()

    def _wait(self, context: Context) -> Any:
        wait = FlowWait(*self._target(), poll=self.poll_interval, timeout=self.wait_timeout)
        self._in_task = None
        while True:
            client, verdict = self._read(context, wait)
            if verdict.ready:
                return self._succeed(context, client, verdict.snap)
            if verdict.gave_up:
                snap, why = verdict.snap, f": {verdict.hint}" if verdict.hint else ""
                raise AirflowFailException(
                    f"flow {snap.parent_id} in queue {snap.queue!r} not released within "
                    f"wait_timeout={self.wait_timeout:g}s ({snap.dependencies} of {snap.total} "
                    f"outstanding){why}"
                )
            pause = verdict.pause
            if self.deferrable:
                left = wait.left()
                budget = IN_TASK_WAIT if left is None else left
                in_task = self._in_task_pause(verdict.snap, pause, budget)
                if in_task is None:
                    self._defer(self.poll_interval, left)
                pause = in_task
            time.sleep(pause)

    def _check_values(self, what: str, count: int) -> None:
        """``return_values`` with more children than ``max_values`` would fail the wait at its
        first read: refused before anything is added (``TooManyValues``)."""
        if self.wait_for_completion and self.return_values and count > self.max_values:
            raise too_many_values(what, count, self.max_values)

    def _own_ref(self, context: Context) -> tuple[str, str]:
        """The flow this task adds: its queue and parent id."""
        return check_queue(self.parent_queue), self._parent_id(context)

    def _parent_id(self, context: Context) -> str:
        """The explicit ``parent_id``, or the retry-safe one derived from the task instance."""
        ti = context["ti"]
        map_index = -1 if ti.map_index is None else ti.map_index
        return self.parent_id or parent_id_for(ti.dag_id, ti.run_id, ti.task_id, map_index)

    # -- FlowWaiting ----------------------------------------------------------------------
    def _flow_ref(self) -> tuple[str, str]:
        if self._ref is None:
            raise InvalidInput(f"{self.task_id}: no flow added yet")
        return self._ref

    def _callback_ref(self, context: Any) -> tuple[str, str]:
        parent_id = self._rendered(self.parent_id, context) or parent_id_for(
            self.dag_id, context["run_id"], self.task_id, self._map_index(context)
        )
        return check_queue(self._rendered(self.parent_queue, context)), parent_id

    def _poke_seconds(self) -> float:
        return self.poll_interval

    def _kind(self) -> str:
        return "operator"

    # -- adding ---------------------------------------------------------------------------
    def _add(self, context: Context) -> dict[str, str]:
        ti = context["ti"]
        parent_id = self._parent_id(context)
        try:
            # the specs and the add: see echomq_core.queues.adding.gc_paused
            with gc_paused(self.children):
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
                self._check_values(f"flow {parent_id}", len(children))
                ref = self._client().add_flow(
                    self.parent_queue,
                    children,
                    payload=self.payload,
                    parent_id=parent_id,
                    max_attempts=self.max_attempts,
                    min_success=self.min_success,
                    barrier=self.barrier,
                    replace=self.on_conflict == "replace",
                    max_running=self.max_running,
                    stream=self.stream,
                )
        except FlowConflict as exc:
            raise AirflowFailException(
                f"cannot add flow {parent_id}: {exc} (the children differ from the flow "
                "added under this task's id before; on_conflict='replace' replaces it)"
            ) from exc
        except TooManyValues as exc:  # before anything is added
            raise AirflowFailException(f"{type(exc).__name__}: {exc}; nothing added") from exc
        except InvalidInput as exc:
            raise AirflowFailException(f"cannot add flow {parent_id}: {exc}") from exc
        self.log.info(
            "Flow %s in queue %r: %d children (try %s; a retry re-adds the same flow)",
            ref.parent_id,
            ref.queue,
            len(children),
            ti.try_number,
        )
        self._repair_if_needed(ref, clear_number(context))
        return {"queue": ref.queue, "parent_id": ref.parent_id}

    def _repair_if_needed(self, ref: FlowRef, cleared: int | None) -> None:
        """Repair a flow an earlier try gave up on; a run cleared since (``cleared``, its
        clear number) first records its epoch on the flow, so a failure callback of the earlier
        try that Airflow delivers late leaves the flow this try takes up
        (:mod:`echomq_provider.settle`)."""
        mq = self._client()
        epoch = cleared or None  # a run never cleared has nothing to record
        self._epoch_noted = True  # the wait that may follow need not record it again
        found = mq.perform(
            repair_on_readd(mq.keys, ref.queue, ref.parent_id, repair=self.repair, epoch=epoch)
        )
        snap = found.snap
        if snap.outcome == "released":
            self.log.info(
                "Flow %s was released before (%s): nothing re-runs; its results are read again",
                ref.parent_id,
                snap.parent_state,
            )
            return
        if found.repaired is None:
            if found.broken:  # repair=False
                raise AirflowFailException(
                    f"flow {ref.parent_id} is {snap.outcome} ({snap.error}); repair=False"
                )
            return
        self.log.info(
            "Flow %s was %s: repaired (repair %d): %d children re-run; the %d that completed "
            "keep their values",
            ref.parent_id,
            snap.outcome,
            found.repaired.repairs,
            found.repaired.requeued,
            snap.processed,
        )
