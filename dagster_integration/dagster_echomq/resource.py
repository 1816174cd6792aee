"""``EchoMQResource``: an EchoMQ client for assets, and the Pump for the length of a run.

Using::

    echomq = EchoMQResource(url="redis://localhost:6379/0", prefix="emq")

    @asset(io_manager_key="echomq_io")
    def measurements(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
        children = [Child({"n": n}, queue="squares") for n in range(100)]
        return echomq.add_flow("reports", children, parent_id=echomq.run_scoped_id(context))

    defs = Definitions(assets=[measurements, ...],
                       resources={"echomq": echomq, "echomq_io": EchoMQIOManager(echomq=echomq)})

Lifecycle: Dagster calls :meth:`setup_for_execution` once per run and per process (once for
the in-process executor, once per step process under the multiprocess executor), and
:meth:`teardown_after_execution` afterwards, even when the step failed. Setup opens a client
and, unless ``run_pump`` is off, starts a Pump thread; teardown stops and joins the thread and
closes the clients. Runtime state lives only in private attributes, so the resource stays a
plain, serialisable piece of config.

Why the resource runs a Pump at all: a child in another queue than its parent settles the
parent only when a Pump delivers its signal. A run that adds a flow and then waits for it
(the IO manager's ``load_input``) would otherwise depend on a Pump deployed somewhere else;
with this resource the run carries its own, and extra Pumps are harmless (outbox leases make
them take turns).

Why the Pump is shared per process: the IO manager holds the resource as a nested field, so a
step that uses both the resource and the IO manager sets up two instances of it. Both would
otherwise start a Pump on the same keyspace in the same process. :class:`_PumpShare` counts
the instances that set up with the same server, prefix and Pump options, starts one thread
for the first and stops it with the last.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    InitResourceContext,
    OpExecutionContext,
)
from pydantic import Field, PrivateAttr

from echomq_core import Child, EchoMQ, FlowRef, FlowSnapshot, Pump
from echomq_core.keyspace import id_part
from echomq_core.options import PumpOptions, describe

#: The longest job id tail (``echomq_core.keyspace.JOB_ID_RE``).
_ID_TAIL_MAX = 200


@dataclass
class _Shared:
    pump: Pump
    client: EchoMQ
    users: int


class _PumpShare:
    """One Pump thread per process for each (server, prefix, Pump options) key."""

    _lock = threading.Lock()
    _live: dict[tuple[Any, ...], _Shared] = {}

    @classmethod
    def acquire(cls, key: tuple[Any, ...], make: Callable[[], tuple[EchoMQ, Pump]]) -> Pump:
        """Join the Pump for ``key``, starting it with ``make() -> (client, Pump)`` if none."""
        with cls._lock:
            shared = cls._live.get(key)
            if shared is None:
                client, pump = make()
                try:
                    pump.start()
                except BaseException:
                    client.close()
                    raise
                shared = cls._live[key] = _Shared(pump, client, 0)
            shared.users += 1
            return shared.pump

    @classmethod
    def release(cls, key: tuple[Any, ...], timeout: float) -> bool:
        """Leave the Pump for ``key``; the last user stops and joins it. Returns whether the
        thread is gone (False only if it outlived ``timeout``)."""
        with cls._lock:
            shared = cls._live.get(key)
            if shared is None:
                return True
            shared.users -= 1
            if shared.users > 0:
                return True
            del cls._live[key]
        thread = _thread_named(shared.pump.id)
        shared.pump.stop(timeout)
        shared.client.close()
        return thread is None or not thread.is_alive()

    @classmethod
    def live_pumps(cls) -> list[str]:
        """The ids of the Pumps this process runs now (for tests and diagnostics)."""
        with cls._lock:
            return [shared.pump.id for shared in cls._live.values()]


def _thread_named(name: str) -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == name), None)


def _pump_field(name: str, **override: Any) -> Any:
    """A ``pump_<name>`` field whose default and description are PumpOptions' own."""
    default, doc = describe(PumpOptions, name)
    return Field(
        default=override.get("default", default),
        description=override.get("description", doc[0].upper() + doc[1:] + "."),
    )


# ConfigurableResource is generic only for typing; Dagster documents it unsubscripted.
class EchoMQResource(ConfigurableResource):  # type: ignore[type-arg]
    """An EchoMQ client for assets and ops, with a Pump running for the length of the run.

    Offers what an asset needs to fan work out and read it back: :meth:`add_flow`,
    :meth:`snapshot`, :meth:`wait`, :meth:`children_values`, :meth:`failed_children`,
    :meth:`ignored_failures`, and :attr:`client` for anything else.
    """

    url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="Server URL: redis://[user:password@]host:port/db, rediss:// for TLS, "
        "unix:///path, or redis+cluster:// for a Cluster. Kept out of reprs (it may hold a "
        "password); pass it as dagster.EnvVar('ECHOMQ_URL') to keep it out of run config.",
        repr=False,
    )
    cluster: bool | None = Field(
        default=None,
        description="Force Cluster mode on (true) or off (false); unset: decided by the URL.",
    )
    prefix: str = Field(
        default="emq",
        description="Key prefix that namespaces every EchoMQ key; must match the workers'.",
    )
    run_pump: bool = Field(
        default=True,
        description="Run a Pump thread during the run, so children in other queues than their "
        "parent settle it even if no Pump is deployed elsewhere.",
    )
    pump_queues: list[str] | None = Field(
        default=None,
        description="Queues the Pump serves; unset: every queue in the keyspace's registry, "
        "re-read every pump_discover_every seconds.",
    )
    # The Pump's settings: defaults and descriptions come from echomq_core.options.PumpOptions
    # (the same ones `echomq pump` offers), except the lease (see its description).
    pump_page: int = _pump_field("page")
    pump_max_tries: int = _pump_field("max_tries")
    pump_lease: float = _pump_field(
        "lease",
        default=3.0,
        description="Seconds an outbox lease lasts: how soon another Pump takes over the outbox "
        "of one that stopped or died. Shorter than a standalone Pump's 10 s because run Pumps "
        "stop at the end of every step process and the next one waits out the lease.",
    )
    pump_interval: float = _pump_field("interval")
    pump_max_stalls: int = _pump_field("max_stalls")
    pump_discover_every: float = _pump_field("discover_every")
    pump_stop_timeout: float = Field(
        default=10.0,
        description="Seconds teardown waits for the Pump thread to finish its tick and exit.",
    )

    _client: EchoMQ | None = PrivateAttr(default=None)
    _pump: Pump | None = PrivateAttr(default=None)
    _pump_key: tuple[Any, ...] | None = PrivateAttr(default=None)

    # -- lifecycle ------------------------------------------------------------------------
    def setup_for_execution(self, context: InitResourceContext) -> None:
        self._client = self.open_client()
        if not self.run_pump:
            return
        try:
            self._pump_key = self._share_key()
            self._pump = _PumpShare.acquire(self._pump_key, self._make_pump)
        except BaseException:
            # Dagster does not call teardown when setup raises: undo here.
            self._client.close()
            self._client, self._pump_key = None, None
            raise
        if context.log is not None:
            context.log.debug(f"EchoMQ pump {self._pump.id} serving prefix {self.prefix!r}")

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        try:
            if self._pump_key is not None and self._pump is not None:
                stopped = _PumpShare.release(self._pump_key, self.pump_stop_timeout)
                if not stopped and context.log is not None:
                    context.log.warning(
                        f"EchoMQ pump {self._pump.id} still running after "
                        f"{self.pump_stop_timeout}s; it exits after its current tick"
                    )
        finally:
            self._pump, self._pump_key = None, None
            if self._client is not None:
                self._client.close()
                self._client = None

    def _share_key(self) -> tuple[Any, ...]:
        return (
            self.url,
            self.cluster,
            self.prefix,
            tuple(self.pump_queues) if self.pump_queues is not None else None,
            self.pump_page,
            self.pump_max_tries,
            self.pump_lease,
            self.pump_interval,
            self.pump_max_stalls,
            self.pump_discover_every,
        )

    def pump_options(self) -> PumpOptions:
        """The ``pump_*`` fields as the core's :class:`~echomq_core.options.PumpOptions`
        (checked there: a bad value raises ``InvalidArgument`` naming it)."""
        return PumpOptions(
            page=self.pump_page,
            max_tries=self.pump_max_tries,
            lease=self.pump_lease,
            interval=self.pump_interval,
            max_stalls=self.pump_max_stalls,
            discover_every=self.pump_discover_every,
        )

    def _make_pump(self) -> tuple[EchoMQ, Pump]:
        client = self.open_client()
        try:
            pump = Pump(
                client,
                self.pump_queues,
                options=self.pump_options(),
                pump_id="dagster-pump-" + uuid.uuid4().hex[:12],
            )
        except BaseException:
            client.close()
            raise
        return client, pump

    # -- clients --------------------------------------------------------------------------
    def open_client(self) -> EchoMQ:
        """A new client for this resource's server and prefix; the caller closes it."""
        return EchoMQ(self.url, cluster=self.cluster, prefix=self.prefix)

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
        children: Sequence[Child],
        *,
        payload: Any = None,
        parent_id: str | None = None,
        max_attempts: int = 3,
        barrier: bool = True,
    ) -> FlowRef:
        """Add a parent in ``queue`` held until ``children`` settle (see ``EchoMQ.add_flow``).

        Pass ``parent_id=self.run_scoped_id(context)`` so a retried step re-adds the same flow
        (adds converge by id) instead of fanning the work out twice. ``barrier`` (True): the
        flow is read by a downstream asset, not run by a worker; the IO manager closes it
        once it has read it (then its ``closed`` retention runs).
        """
        return self.client.add_flow(
            queue,
            list(children),
            payload=payload,
            parent_id=parent_id,
            max_attempts=max_attempts,
            barrier=barrier,
        )

    def snapshot(self, flow: FlowRef) -> FlowSnapshot:
        return self.client.snapshot(flow.queue, flow.parent_id)

    def wait(self, flow: FlowRef, *, timeout: float = 60.0, poll: float = 0.2) -> FlowSnapshot:
        """Block until the parent is released; raises ``ParentFailed`` / ``FlowTimeout``."""
        return self.client.wait(flow.queue, flow.parent_id, timeout=timeout, poll=poll)

    def children_values(self, flow: FlowRef) -> dict[str, Any]:
        """Child id -> result, for every child that completed (read in pages)."""
        return dict(self.client.iter_children_values(flow.queue, flow.parent_id))

    def failed_children(self, flow: FlowRef) -> dict[str, str]:
        return self.client.failed_children(flow.queue, flow.parent_id)

    def ignored_failures(self, flow: FlowRef) -> dict[str, str]:
        return self.client.ignored_failures(flow.queue, flow.parent_id)

    @staticmethod
    def run_scoped_id(context: AssetExecutionContext | OpExecutionContext, *parts: str) -> str:
        """A parent id stable across retries of one step and distinct across runs:
        ``JOB-dagster.<run id>.<asset key or op name>[.<partition>][.<parts>...]``."""
        if isinstance(context, AssetExecutionContext):
            context = context.op_execution_context
        if context.has_assets_def and len(context.assets_def.keys) == 1:
            name = context.asset_key.to_user_string()
        else:
            name = context.op_def.name
        tail = [context.run_id, name]
        if context.has_partition_key:
            tail.append(context.partition_key)
        tail += parts
        joined = ".".join(id_part(p) for p in ["dagster", *tail])
        return "JOB-" + id_part(joined, _ID_TAIL_MAX)
