"""``EchoMQIOManager``: a flow handle goes out of one asset, its children's results come into
the next.

Using::

    @asset(io_manager_key="echomq_io")
    def measurements(context, echomq: EchoMQResource) -> FlowRef:
        return echomq.add_flow("reports", [...], parent_id=echomq.run_scoped_id(context))

    @asset
    def summary(measurements: dict[str, Any]) -> ...:   # child id -> result
        ...

    @asset
    def big_summary(measurements: FlowStream) -> ...:   # (child id, result) pairs, page by page
        ...

    @asset
    def table(measurements: pl.DataFrame) -> ...:   # a row per child (pd.DataFrame, pa.Table)
        ...

**Output.** ``handle_output`` stores the handle (see :mod:`dagster_echomq.handles`) and
records what is true when the flow is added: its queue, parent id and N. A partitioned asset
adds one flow per partition: a step over one partition returns a ``FlowRef``; a step over
several (a single-run backfill of a range) returns ``{partition key: FlowRef}`` for exactly its
partitions (``context.partition_keys``), and each partition's materialization records its own
flow (partition-scoped asset metadata). Anything else - other partitions, a value that is no
flow, a flow added without ``barrier=True`` (:class:`NotABarrierFlow`) - is refused with
``InvalidInput`` before a handle is written, and the barrier flows the step added through
``EchoMQResource.add_flow`` are cancelled (:mod:`dagster_echomq.steps`): the step fails with
nothing left fanned out and unread.

**Input.** ``load_input`` finds the flow (the upstream's handle, or the flow an ``AssetSpec``
names, or - a spec naming only a queue - the flow the sensor launched this run for), runs a
Pump for the queues of its children while it waits (:mod:`dagster_echomq.resource`), logs
progress, and returns ``{child id: result}``; an input annotated :class:`FlowStream` gets an
iterable of ``(child id, result)`` that reads the results page by page instead (memory flat
at any N; each pass over it reads them again); an input annotated ``pandas.DataFrame``,
``polars.DataFrame`` or ``pyarrow.Table`` gets the results as that frame, built page by page
(:mod:`echomq_core.flows.frames`: a ``child_id`` column, a mapping value's fields as columns; the
library comes with the ``echomq[pandas|polars|arrow]`` extra); an input annotated
:class:`~dagster_echomq.following.FlowFollow` is handed over at once, without a wait, and
yields ``(child id, result)`` as the children settle (a flow added with ``stream=True``; see
:mod:`dagster_echomq.following`). A downstream
step over several partitions gets ``{partition key: <that>}``. It records the final counts
and the ids and errors of failed and ignored children (capped) as an observation of the
upstream asset (of each partition read) written as an event of the run and step, so the UI
shows it with the run - also when the load then fails. A flow added without ``barrier=True``
is refused before any wait (:class:`NotABarrierFlow`).

**Per-input settings.** An input's own metadata under ``echomq/`` (``AssetIn(metadata=
echomq_input(stall_timeout=600, close_after_read=False))``) overrides the reading settings
below for that input alone (:mod:`dagster_echomq.input_settings`); an unknown ``echomq/`` key
or a bad value is refused with ``InvalidInput`` naming it, before any wait or read.

**Empty plans.** An :class:`~dagster_echomq.handles.EmptyFlow` output (``fan_out(...,
on_empty="empty")``) names no flow: its handle is stored marked empty, its materialization
records N = 0, and ``load_input`` returns at once the empty result of a flow's read (``{}``,
a ``FlowStream`` that yields nothing, or a frame of no rows) - no wait, no Pump, nothing to close.

**Lifecycle.** Once read, a released flow is closed (``close_after_read``; a streamed input
closes it when a first pass over it is read to its end), so its ``closed`` retention starts
and the sensor never requests a run for it. A flow that failed or was cancelled raises
:class:`FlowFailedError` (after recording an observation of the upstream with the failed
children), unless the run is a re-execution (``dagster/parent_run_id``): then the flow is
repaired once (``retry_flow``: its dead children run again, completed ones keep their values)
and waited for again (``repair_on_reexecution``). A wait that times out or a step that is
terminated while waiting cancels the flow, so no child starts for a run that will not read
it (``cancel_on_failure``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from dagster import (
    AssetObservation,
    ConfigurableIOManager,
    InitResourceContext,
    InputContext,
    OutputContext,
)
from dagster._core.events import DagsterEvent
from pydantic import Field, PrivateAttr

from echomq_core import EchoMQ, FlowRef, FlowSnapshot, FlowTimeout, InvalidInput
from echomq_core.integration import MISSING, WAITING, frame_library, kind_of, results_frame

from . import steps
from .config import EchoMQConfig
from .failures import NotABarrierFlow, flow_error
from .following import FlowFollow, check_followable, follow_passes
from .handles import EmptyFlow, read_handle, store_handle
from .handles import handle_name as handle_name  # the handle helpers, beside the IO manager
from .input_settings import ReadSettings
from .io_context import (
    identifier_of,
    named_flow,
    output_flows,
    parent_run_id,
    run_id_of,
    step_context_of,
    step_of,
    wanted_frame,
    wants_follow,
    wants_stream,
)
from .metadata import FLOW_PARENT_ID, FLOW_QUEUE, added_metadata, empty_metadata, settled_metadata
from .reading import FlowStream, wait_settled
from .reading import wait_released as wait_released
from .resource import EchoMQResource


class EchoMQIOManager(ConfigurableIOManager, EchoMQConfig):
    """Stores an asset's flow handle; loads a downstream input as the flow's results once
    its parent is released. Takes the same connection and Pump settings as
    :class:`EchoMQResource` (``EchoMQIOManager.from_resource(echomq)`` copies them)."""

    wait_timeout: float = Field(
        default=3600.0,
        description="Seconds load_input waits in all for a flow to be released before "
        "raising FlowTimeout.",
    )
    stall_timeout: float = Field(
        default=120.0,
        description="Seconds load_input waits without any child settling before raising "
        "FlowTimeout (naming the children's queues): a step whose flow has no workers fails "
        "in this long, not after wait_timeout.",
    )
    poll_interval: float = Field(
        default=0.5, description="Seconds between two reads of the flow's state while waiting."
    )
    log_every: float = Field(
        default=10.0, description="Seconds between two progress lines while waiting."
    )
    page: int = Field(
        default=1000,
        description="Results read per round trip when building the input (HSCAN page size).",
    )
    close_after_read: bool = Field(
        default=True,
        description="Close a released barrier flow once an input has read it, so its closed "
        "retention starts and the sensor never requests a run for it.",
    )
    cancel_on_failure: bool = Field(
        default=True,
        description="Cancel the flow when the wait for it times out or the step is "
        "terminated while waiting, so none of its children starts for a run that will not "
        "read it.",
    )
    repair_on_reexecution: bool = Field(
        default=True,
        description="In a re-executed run, repair a failed or cancelled flow (its dead "
        "children run again) and wait again, instead of failing on it again.",
    )
    wait_on_output: bool = Field(
        default=False,
        description="Also wait in handle_output, so a failed flow fails the upstream step "
        "itself and its materialization records the final counts.",
    )

    _client: EchoMQ | None = PrivateAttr(default=None)

    @classmethod
    def from_resource(cls, echomq: EchoMQResource, **options: Any) -> EchoMQIOManager:
        """An IO manager on the same server, prefix and Pump settings as ``echomq``
        (``EnvVar`` values stay ``EnvVar``s, resolved when Dagster loads the config)."""
        shared = {name: getattr(echomq, name) for name in EchoMQConfig.model_fields}
        return cls(**{**shared, **options})

    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._client = self.open_client()

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def client(self) -> EchoMQ:
        if self._client is None:  # used outside a run (tests, scripts)
            self._client = self.open_client()
        return self._client

    # -- output ---------------------------------------------------------------------------
    def handle_output(self, context: OutputContext, obj: Any) -> None:
        client = self.client
        try:  # a bad value is refused before any handle is written
            flows = output_flows(context, obj)
            for flow in client.worker_run(_real(flows.values())):
                why = "EchoMQIOManager stores no handle for it"
                raise NotABarrierFlow(flow.queue, flow.parent_id, why)
        except InvalidInput as refused:
            self._cancel_added(context, refused)
            raise
        step = step_of(context)
        for key, flow in flows.items():
            store_handle(client, identifier_of(context, key), flow)
        if step is not None:
            steps.stored(*step, _real(flows.values()))
        per_flow: dict[str | None, dict[str, Any]] = {}
        for key, flow in flows.items():
            if isinstance(flow, EmptyFlow):
                per_flow[key] = empty_metadata(flow)
                continue
            page = self.flow_page(flow.queue, flow.parent_id)
            if self.wait_on_output:
                snap = self._settle(context, flow, ReadSettings.of(self))
                if snap.outcome != "released":
                    raise flow_error(client, snap)
                per_flow[key] = settled_metadata(client, snap, page)
            else:
                snap = client.snapshot(flow.queue, flow.parent_id)
                per_flow[key] = added_metadata(flow, snap, page)
        if len(per_flow) == 1:  # one flow (of the asset, or of its one partition)
            (meta,) = per_flow.values()
            context.add_output_metadata(meta)
            return
        # A step over several partitions: each partition's materialization names its own flow
        # (Dagster merges partition-scoped metadata into the one event of that partition).
        for key, meta in per_flow.items():
            context.step_context.add_asset_metadata(
                meta, asset_key=context.asset_key, partition_key=key
            )

    def _cancel_added(self, context: OutputContext, refused: InvalidInput) -> None:
        """The step's output was refused: cancel the barrier flows it added (nobody will
        read them, no handle names them) and say so in the error."""
        step = step_of(context)
        added = steps.take(*step) if step is not None else []
        if step is None or not added:
            return
        run_id, step_key = step
        reason = f"dagster run {run_id}: the output of step {step_key} was refused"
        for flow in added:
            self.client.cancel_flow(flow.queue, flow.parent_id, reason=reason)
        ids = ", ".join(f.parent_id for f in added[:3]) + (
            f", ... {len(added) - 3} more" if len(added) > 3 else ""
        )
        note = f"; the {len(added)} flow(s) this step added were cancelled ({ids})"
        refused.args = (f"{refused.args[0] if refused.args else refused}{note}", *refused.args[1:])
        context.log.warning(f"EchoMQ: cancelled {len(added)} flow(s) of a refused output: {ids}")

    # -- input ----------------------------------------------------------------------------
    def load_input(self, context: InputContext) -> Any:
        # the input's own echomq/ metadata, checked before anything is waited for or read
        settings = ReadSettings.of(self).for_input(context.definition_metadata, context.name)
        flows = self.flows_for_input(context)
        for flow in self.client.worker_run(_real(flows.values())):
            raise NotABarrierFlow(flow.queue, flow.parent_id, "EchoMQIOManager does not read it")
        stream = wants_stream(context, partitioned=len(flows) > 1)
        if wants_follow(context, partitioned=len(flows) > 1):  # no wait: followed as it runs
            return self._followed(context, flows, settings)
        frame = wanted_frame(context, partitioned=len(flows) > 1)
        if frame is not None:
            frame_library(frame)  # a missing library is named before any wait
        observe_in_run = context.has_asset_key and len(flows) == 1
        values: dict[str | None, Any] = {}
        for key, flow in flows.items():
            if isinstance(flow, EmptyFlow):  # nothing to wait for, read or close
                values[key] = self._empty(context, key, flow, stream, observe_in_run)
                if frame is not None:
                    values[key] = results_frame((), frame)
                continue
            snap = self._settle(context, flow, settings)
            meta = settled_metadata(self.client, snap, self.flow_page(flow.queue, flow.parent_id))
            if snap.outcome != "released":
                self._observe(context, key, meta, "EchoMQ flow did not complete")
                raise flow_error(self.client, snap)
            if snap.failed:  # a success threshold tolerated them (metadata lists them)
                context.log.warning(
                    f"EchoMQ flow {flow.parent_id} released with {snap.failed} of {snap.total} "
                    f"children failed (min_success allows {snap.allowed}): "
                    + ", ".join(meta["failed_children"].value)
                )
            if observe_in_run:
                context.add_input_metadata(meta, description="EchoMQ flow released")
            else:
                self._observe(context, key, meta, "EchoMQ flow released")
            # Only a barrier flow is closed by its reader (a worker-run parent is 'pending'
            # or 'completed' when released, and its completion starts its retention).
            close = settings.close_after_read and snap.parent_state == "released"
            if stream:
                values[key] = FlowStream(flow, snap, self._passes(flow, close, settings.page))
            elif frame is not None:
                values[key] = self._frame(flow, close, settings.page, frame)
            else:
                values[key] = self._read(flow, close, settings.page)
        if len(values) == 1:  # unpartitioned, or one partition: the flow's values themselves
            return next(iter(values.values()))
        return values

    def flows_for_input(self, context: InputContext) -> dict[str | None, FlowRef]:
        """The flow(s) an input reads, by upstream partition (None: not partitioned): named
        in the upstream asset's metadata (an external flow), else the handles its
        materializations stored."""
        upstream = context.upstream_output
        meta = upstream.definition_metadata if upstream is not None else {}
        if meta and FLOW_QUEUE in meta:
            return {None: named_flow(context, meta)}
        if context.has_asset_key and context.has_asset_partitions:
            keys: list[str | None] = list(context.asset_partition_keys)
        else:
            keys = [None]
        found: dict[str | None, FlowRef] = {}
        for key in keys:
            identifier = identifier_of(context, key)
            flow = read_handle(self.client, identifier)
            if flow is None:
                raise InvalidInput(
                    f"no EchoMQ flow stored for {'/'.join(identifier)!r} under prefix "
                    f"{self.prefix!r}: materialize the upstream asset first, or name the "
                    f"flow in its metadata ({FLOW_QUEUE!r}, {FLOW_PARENT_ID!r})"
                )
            found[key] = flow
        return found

    def _followed(
        self, context: InputContext, flows: dict[str | None, FlowRef], settings: ReadSettings
    ) -> Any:
        """An input annotated :class:`~dagster_echomq.following.FlowFollow`: per flow, a
        re-executed run's failed flow repaired first, a flow that cannot be followed refused
        now, and no wait - the step's body consumes the results as they settle."""
        client = self.client
        parent_run = parent_run_id(context) if settings.repair_on_reexecution else None
        values: dict[str | None, Any] = {}
        for key, flow in flows.items():
            if isinstance(flow, EmptyFlow):
                self._empty(context, key, flow, False, context.has_asset_key and len(flows) == 1)
                values[key] = FlowFollow(flow, 0, lambda: iter(()))
                continue
            found = client.repair_on_readd(flow.queue, flow.parent_id, repair=bool(parent_run))
            if found.repaired is not None:
                context.log.info(
                    f"EchoMQ flow {flow.parent_id} {found.snap.outcome} in an earlier run "
                    f"({parent_run}): repaired, {found.repaired.requeued} children run again"
                )
            check_followable(client, flow)
            queues = client.child_queues(flow.queue, flow.parent_id)
            passes = follow_passes(
                self.open_client,
                self.pumping,
                flow,
                queues,
                close=settings.close_after_read,
                page=settings.page,
            )
            values[key] = FlowFollow(flow, found.snap.total, passes)
            context.log.info(
                f"EchoMQ: following flow {flow.parent_id} ({found.snap.processed} of "
                f"{found.snap.total} children done)"
            )
        return next(iter(values.values())) if len(values) == 1 else values

    # -- helpers --------------------------------------------------------------------------
    def _empty(
        self, context: InputContext, key: str | None, flow: EmptyFlow, stream: bool, in_run: bool
    ) -> Any:
        """An empty plan's input: the empty result of the type a flow's read gives."""
        meta = empty_metadata(flow)
        if in_run:
            context.add_input_metadata(meta, description="EchoMQ empty plan")
        else:
            self._observe(context, key, meta, "EchoMQ empty plan")
        context.log.info(f"EchoMQ: empty plan for {flow.queue!r}: the input is empty")
        if not stream:
            return {}
        nothing = FlowSnapshot(flow.queue, flow.parent_id, None, 0, 0, 0, 0, 0)
        return FlowStream(flow, nothing, lambda: iter(()))

    def _settle(
        self, context: InputContext | OutputContext, flow: FlowRef, settings: ReadSettings
    ) -> FlowSnapshot:
        """Wait (pumping) until ``flow`` settles; in a re-executed run, repair it once first
        if it failed; cancel it if the wait times out or the step is interrupted.

        The first read (the repair check's snapshot) comes at once, and a flow it finds
        settled is returned as it is: no Pump starts and no wait runs for it. That is the
        usual case of a downstream step, which starts seconds after its upstream added the
        flow, and what a Pump would cost there - its start, and its stop, which waits for its
        blocking read of the outboxes' hint to end - is spent for nothing. A flow still held
        is waited for with a Pump, as before."""
        client = self.client
        parent_run = parent_run_id(context) if settings.repair_on_reexecution else None
        found = client.repair_on_readd(flow.queue, flow.parent_id, repair=parent_run is not None)
        if found.repaired is not None:
            context.log.info(
                f"EchoMQ flow {flow.parent_id} {found.snap.outcome} in an earlier run "
                f"({parent_run}): repaired, {found.repaired.requeued} children run again"
            )
        elif kind_of(found.snap) not in (WAITING, MISSING):
            return found.snap  # released, closed, failed or cancelled: nothing to wait for
        queues = client.child_queues(flow.queue, flow.parent_id)
        try:
            # Children in the parent's own queue settle it themselves: no signal to carry.
            with self.pumping([q for q in queues if q != flow.queue]):
                return wait_settled(
                    client,
                    flow,
                    timeout=settings.wait_timeout,
                    stall_timeout=settings.stall_timeout,
                    poll=settings.poll_interval,
                    log=context.log,
                    log_every=settings.log_every,
                    queues=queues,
                )
        except FlowTimeout:
            if settings.cancel_on_failure:
                self._cancel(context, flow, "the wait for it timed out")
            raise
        except Exception:
            raise
        except BaseException:  # the step was terminated (Dagster interrupts it) or killed
            if settings.cancel_on_failure:
                self._cancel(context, flow, "the step was terminated while waiting")
            raise

    def _cancel(self, context: InputContext | OutputContext, flow: FlowRef, why: str) -> None:
        reason = f"dagster run {run_id_of(context)}: {why}"
        state = self.client.cancel_flow(flow.queue, flow.parent_id, reason=reason).state
        context.log.warning(f"EchoMQ flow {flow.parent_id} {state}: {why}")

    def _observe(
        self, context: InputContext, key: str | None, meta: dict[str, Any], text: str
    ) -> None:
        """An observation of the upstream asset, written to the run's event log at once:
        also when the load then fails, and for one partition of several (what
        ``add_input_metadata`` cannot do). It carries the run and step, so the UI shows it
        with the run that observed it."""
        if not context.has_asset_key:
            return
        event = AssetObservation(
            asset_key=context.asset_key, partition=key, metadata=meta, description=text
        )
        step_context = step_context_of(context)
        if step_context is None:  # a context built outside a run: nothing to attach it to
            context.instance.report_runless_asset_event(event)
            return
        DagsterEvent.asset_observation(step_context, event)  # written as it is built

    def _read(self, flow: FlowRef, close: bool, page: int) -> dict[str, Any]:
        values = dict(self.client.iter_children_values(flow.queue, flow.parent_id, page=page))
        if close:
            self.client.close_flow(flow.queue, flow.parent_id)
        return values

    def _frame(self, flow: FlowRef, close: bool, page: int, kind: str) -> Any:
        """The results as a frame of ``kind``, read and built page by page (the Python
        objects of one page at a time beside the frame)."""
        pairs = self.client.iter_children_values(flow.queue, flow.parent_id, page=page)
        table = results_frame(pairs, kind, page=page)
        if close:
            self.client.close_flow(flow.queue, flow.parent_id)
        return table

    def _passes(
        self, flow: FlowRef, close: bool, page: int
    ) -> Callable[[], Iterator[tuple[str, Any]]]:
        """A new read of the results for each pass over a :class:`FlowStream`; the first
        pass read to its end closes the flow (the later ones find it closed)."""
        unclosed = [close]

        def one_pass() -> Iterator[tuple[str, Any]]:
            # Its own client: the step's may be closed before a lazy consumer finishes.
            client = self.open_client()
            try:
                yield from client.iter_children_values(flow.queue, flow.parent_id, page=page)
                if unclosed[0]:
                    client.close_flow(flow.queue, flow.parent_id)
                    unclosed[0] = False
            finally:
                client.close()

        return one_pass


def _real(flows: Iterable[FlowRef]) -> list[FlowRef]:
    """The flows that exist on the server: all but the handles of empty plans."""
    return [f for f in flows if not isinstance(f, EmptyFlow)]
