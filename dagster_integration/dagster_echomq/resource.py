"""``EchoMQResource``: an EchoMQ client for assets, and the Pump for the length of a run.

Using::

    echomq = EchoMQResource(url="redis://localhost:6379/0", prefix="emq")

    @asset(io_manager_key="echomq_io")
    def measurements(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
        children = [Child({"n": n}, queue="squares") for n in range(100)]
        return echomq.add_flow("reports", children, parent_id=echomq.run_scoped_id(context))

    defs = Definitions(assets=[measurements, ...],
                       resources={"echomq": echomq,
                                  "echomq_io": EchoMQIOManager.from_resource(echomq)})

Lifecycle: Dagster calls :meth:`setup_for_execution` once per run and per process (once for
the in-process executor, once per step process under the multiprocess executor), and
:meth:`teardown_after_execution` afterwards, even when the step failed. Setup opens a client;
teardown closes it. Runtime state lives only in private attributes, so the resource stays a
plain, serialisable piece of config.

The settings it shares with the IO manager, and the Pump a run waits with:
:mod:`dagster_echomq.config`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    DagsterLogManager,
    InitResourceContext,
    OpExecutionContext,
    Output,
)
from pydantic import PrivateAttr

from echomq_core import Child, EchoMQ, FlowRef, FlowSnapshot, InvalidArgument, InvalidInput, Pump
from echomq_core.integration import (
    MAX_ID_LENGTH,
    check_job_id,
    check_queue,
    collector_paused,
    id_part,
)

from . import steps
from .config import EchoMQConfig
from .handles import EmptyFlow
from .metadata import ADDED_LOG_PREFIX
from .pumps import PumpShare

#: The longest job id tail (``echomq_core.MAX_ID_LENGTH``: "JOB-" and this many).
_ID_TAIL_MAX = MAX_ID_LENGTH - len("JOB-")
#: The tag Dagster gives every re-execution: the id of the first run of its group.
ROOT_RUN_ID_TAG = "dagster/root_run_id"
#: What ``fan_out`` does with an empty plan: skip the readers, or hand them an empty result.
_ON_EMPTY = ("skip", "empty")


def _planned(children: Iterable[Child]) -> list[Child]:
    """``children`` as a list, built with the cyclic collector paused when it is not one yet
    (a generator of a plan: see :meth:`EchoMQResource.add_flow`)."""
    if isinstance(children, list):
        return children
    with collector_paused():
        return list(children)


# ConfigurableResource is generic only for typing; Dagster documents it unsubscripted.
class EchoMQResource(ConfigurableResource, EchoMQConfig):  # type: ignore[type-arg]
    """An EchoMQ client for assets and ops, with a Pump while the run waits for flows.

    Offers what an asset needs to fan work out and read it back: :meth:`add_flow`,
    :meth:`snapshot`, :meth:`wait`, :meth:`children_values`, :meth:`failed_children`,
    :meth:`ignored_failures`, :meth:`close_flow`, :meth:`cancel_flow`, and :attr:`client`
    for anything else. In a sensor, declare it as a parameter (``echomq: EchoMQResource``):
    Dagster then hands the sensor the configured resource, ``EnvVar`` values resolved.
    """

    _client: EchoMQ | None = PrivateAttr(default=None)
    _pump: Pump | None = PrivateAttr(default=None)
    _pump_key: tuple[Any, ...] | None = PrivateAttr(default=None)
    _log: DagsterLogManager | None = PrivateAttr(default=None)
    _run_id: str | None = PrivateAttr(default=None)

    # -- lifecycle ------------------------------------------------------------------------
    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._client = self.open_client()
        self._log = context.log
        run = getattr(context, "run", None)
        self._run_id = run.run_id if run is not None else None
        if not self.run_pump or self.pump_queues is None:
            return  # Pumps start per wait, for the queues of the flow waited on
        queues = list(self.pump_queues)
        try:
            self._pump_key = self.pump_key(queues)
            self._pump = PumpShare.acquire(self._pump_key, lambda: self.make_pump(queues))
        except BaseException:
            # Dagster does not call teardown when setup raises: undo here.
            self._client.close()
            self._client, self._pump_key = None, None
            raise
        if context.log is not None:
            context.log.debug(f"EchoMQ pump {self._pump.id} serving {queues}")

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        try:
            if self._pump_key is not None and self._pump is not None:
                stopped = PumpShare.release(self._pump_key, self.pump_stop_timeout)
                if not stopped and context.log is not None:
                    context.log.warning(
                        f"EchoMQ pump {self._pump.id} still running after "
                        f"{self.pump_stop_timeout}s; it exits after its current tick"
                    )
        finally:
            if self._run_id is not None:
                steps.forget_run(self._run_id)
            self._pump, self._pump_key, self._log, self._run_id = None, None, None, None
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- clients --------------------------------------------------------------------------
    @property
    def client(self) -> EchoMQ:
        """The run's client. Outside a run (the resource used directly, in a script or a
        test), a client is opened on first use, without a Pump; :meth:`close` closes it."""
        if self._client is None:
            self._client = self.open_client()
        return self._client

    def close(self) -> None:
        """Close a client opened outside a run (a run's teardown does this itself)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def pump(self) -> Pump | None:
        """The Pump this process runs for the run, or None (outside a run, or run_pump off)."""
        return self._pump

    @property
    def pump_running(self) -> bool:
        return self._pump is not None and self._pump.running

    # -- flows ----------------------------------------------------------------------------
    def add_flow(
        self,
        queue: str,
        children: Iterable[Child],
        *,
        payload: Any = None,
        parent_id: str | None = None,
        max_attempts: int = 3,
        min_success: float | None = None,
        barrier: bool = True,
        repair: bool = True,
        max_running: int | None = None,
        stream: bool = False,
    ) -> FlowRef:
        """Add a parent in ``queue`` held until ``children`` settle (see ``EchoMQ.add_flow``).

        Pass ``parent_id=self.run_scoped_id(context)`` so a retried step re-adds the same flow
        (adds converge by id) instead of fanning the work out twice. If that flow had failed
        or was cancelled (the step's first attempt, or a terminated run, left it so), the
        re-add repairs it (``retry_flow``: dead and cancelled children run again, completed
        ones keep their values) unless ``repair`` is off. ``barrier`` (True): the flow is read
        by a downstream asset, not run by a worker; the IO manager closes it once read.
        ``max_running``: at most that many children leased at once (``EchoMQ.add_flow``); a
        retried step must pass the same cap.

        Inside a run, a barrier flow is logged (INFO, ``EchoMQ flow added: {...}``) as soon as
        it is added: should the run fail before anything reads it - even in this very step,
        before its output is stored - ``echomq_cancel_sensors`` find it there and cancel it.
        Inside a step it is also noted as this step's (:mod:`dagster_echomq.steps`): should
        the IO manager refuse the step's output, it cancels the flows the step added.

        ``min_success``: a success threshold (``EchoMQ.add_flow``); a retried step must pass
        the same one.

        ``stream``: keep the flow's settle log (``EchoMQ.add_flow(stream=True)``), so a
        downstream input annotated :class:`~dagster_echomq.following.FlowFollow` gets the
        results as the children settle; a retried step must pass the same.

        ``children``: a list, or a generator of them - which this builds with Python's cyclic
        garbage collector paused (:func:`echomq_core.collector_paused`). Each collection while a big
        plan is built walks the step process's whole heap: a list of 1,000,000 ``Child`` built
        in a process that has imported Dagster took 1.9 s with the collector on and 0.3 s
        paused.
        """
        ref = self.client.add_flow(
            queue,
            _planned(children),
            payload=payload,
            parent_id=parent_id,
            max_attempts=max_attempts,
            min_success=min_success,
            barrier=barrier,
            max_running=max_running,
            stream=stream,
        )
        if barrier:
            steps.record(ref)
            if self._log is not None:
                added = json.dumps({"queue": ref.queue, "parent_id": ref.parent_id})
                self._log.info(f"{ADDED_LOG_PREFIX}{added}")
        if repair and parent_id is not None:  # a fresh id holds nothing to repair
            self.client.repair_on_readd(ref.queue, ref.parent_id, repair=True)
        return ref

    def fan_out(
        self,
        queue: str,
        children: Iterable[Child],
        *,
        on_empty: Literal["skip", "empty"] = "skip",
        **options: Any,
    ) -> Iterator[Output[FlowRef]]:
        """:meth:`add_flow` as the body of an asset: yields the flow's ``Output``. For an empty
        plan no flow is added (a flow of no children is refused, ``InvalidFlow``), and
        ``on_empty`` says what its readers see:

        - ``"skip"`` (the default; declare the asset ``output_required=False``): nothing is
          yielded, the asset is not materialized, and Dagster skips the assets that read it -
          as Airflow skips what follows a fan-out over nothing.
        - ``"empty"``: an :class:`~dagster_echomq.handles.EmptyFlow` is yielded; the asset is
          materialized with N = 0, and each reader gets the empty result of the type a flow's
          read gives (``{}``, or a ``FlowStream`` that yields nothing) at once - as a
          ``DynamicOut`` mapped over nothing hands its collect ``[]``.

        ``options``: those of :meth:`add_flow`. ::

            @asset(io_manager_key="echomq_io", output_required=False)
            def scores(context: AssetExecutionContext, echomq: EchoMQResource):
                children = (Child(row, queue="score") for row in plan())
                yield from echomq.fan_out("reports", children,
                                          parent_id=echomq.run_scoped_id(context))

        ``children`` may be a generator, as above: see :meth:`add_flow`.

        A bad ``queue``, ``parent_id`` or ``on_empty`` is refused (``InvalidQueueName``,
        ``InvalidJobId``, ``InvalidArgument``) also when the plan is empty."""
        check_queue(queue)
        if on_empty not in _ON_EMPTY:
            raise InvalidArgument(
                f"on_empty must be one of {', '.join(map(repr, _ON_EMPTY))}, not {on_empty!r}"
            )
        parent_id = options.get("parent_id")
        if parent_id is not None:
            check_job_id(parent_id)
        planned = _planned(children)
        if planned:
            yield Output(self.add_flow(queue, planned, **options))
            return
        if on_empty == "skip":
            if self._log is not None:
                self._log.info(f"EchoMQ: empty plan for {queue!r}: no flow added, readers skipped")
            return
        if self._log is not None:
            self._log.info(f"EchoMQ: empty plan for {queue!r}: no flow added, readers get {{}}")
        yield Output(EmptyFlow(queue, parent_id or "JOB-" + uuid.uuid4().hex))

    def snapshot(self, flow: FlowRef) -> FlowSnapshot:
        return self.client.snapshot(flow.queue, flow.parent_id)

    def wait(self, flow: FlowRef, *, timeout: float = 60.0, poll: float = 0.2) -> FlowSnapshot:
        """Block until the parent is released, pumping the queues of its children meanwhile;
        raises ``ParentFailed`` (``FlowCancelled``) / ``FlowTimeout`` as ``EchoMQ.wait``."""
        with self.pumping(self.client.child_queues(flow.queue, flow.parent_id)):
            return self.client.wait(flow.queue, flow.parent_id, timeout=timeout, poll=poll)

    def children_values(self, flow: FlowRef) -> dict[str, Any]:
        """Child id -> result, for every child that completed (read in pages)."""
        return dict(self.client.iter_children_values(flow.queue, flow.parent_id))

    def failed_children(self, flow: FlowRef) -> dict[str, str]:
        return self.client.failed_children(flow.queue, flow.parent_id)

    def ignored_failures(self, flow: FlowRef) -> dict[str, str]:
        return self.client.ignored_failures(flow.queue, flow.parent_id)

    def close_flow(self, flow: FlowRef) -> str:
        """Done reading a released barrier flow: its ``closed`` retention starts."""
        return self.client.close_flow(flow.queue, flow.parent_id)

    def cancel_flow(self, flow: FlowRef, reason: str = "") -> str:
        """Cancel the flow: no child that has not started will start; the new state."""
        return self.client.cancel_flow(flow.queue, flow.parent_id, reason=reason).state

    @staticmethod
    def run_scoped_id(
        context: AssetExecutionContext | OpExecutionContext,
        *parts: str,
        partition_key: str | None = None,
    ) -> str:
        """A parent id stable across retries and re-executions of one step, distinct across
        runs: ``JOB-dagster.<root run id>.<asset key or op name>[.<partition>][.<parts>...]``.

        The run id is the root run's (the ``dagster/root_run_id`` tag Dagster gives every
        re-execution; a first run is its own root): re-executing a run whose fan-out step
        failed - before or after it stored its flow - re-adds the same flow, so the add
        converges or repairs it (``add_flow``), and children that completed do not run again.
        A re-executed step must therefore plan the same children (a re-add with others is
        refused, ``FlowConflict``); one that plans anew passes a ``parts`` of its own.

        A step over one partition puts it in the id by itself. A step over several (a
        single-run backfill of a range) adds one flow per partition: pass each one's
        ``partition_key`` (one of ``context.partition_keys``); without it the id would be
        the same for all of them, so that is refused (``InvalidInput``) before anything is
        added.
        """
        if isinstance(context, AssetExecutionContext):
            context = context.op_execution_context
        if context.has_assets_def and len(context.assets_def.keys) == 1:
            name = context.asset_key.to_user_string()
        else:
            name = context.op_def.name
        run = context.run
        root = run.tags.get(ROOT_RUN_ID_TAG) or run.root_run_id or run.run_id
        tail = [root, name]
        if partition_key is not None:
            partitioned = context.has_partition_key_range or context.has_partition_key
            if partitioned and partition_key not in context.partition_keys:
                raise InvalidInput(
                    f"partition_key {partition_key!r} is not one of this step's "
                    f"partitions ({_keys_text(context.partition_keys)})"
                )
            tail.append(partition_key)
        elif context.has_partition_key_range and len(context.partition_keys) != 1:
            raise InvalidInput(
                f"this step covers {len(context.partition_keys)} partitions "
                f"({_keys_text(context.partition_keys)}): add one flow per partition, "
                "passing run_scoped_id(context, partition_key=key) for each"
            )
        elif context.has_partition_key:
            tail.append(context.partition_key)
        elif context.has_partition_key_range:
            tail.append(context.partition_keys[0])
        tail += parts
        joined = ".".join(id_part(p) for p in ["dagster", *tail])
        return "JOB-" + id_part(joined, _ID_TAIL_MAX)


def _keys_text(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:3])
    return shown + (f", ... {len(keys) - 3} more" if len(keys) > 3 else "")
