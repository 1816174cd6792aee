"""``EchoMQConfig``: the settings :class:`~dagster_echomq.EchoMQResource` and
:class:`~dagster_echomq.EchoMQIOManager` share - where the server is, the key prefix - and the
Pump a step runs while it waits for a flow.

Why a step runs a Pump while it waits: a child in another queue than its parent settles the
parent only when a Pump delivers its signal. A step that waits for a flow (the IO manager's
``load_input``, :meth:`~dagster_echomq.EchoMQResource.wait`) would otherwise depend on a Pump
deployed somewhere else; so it runs one for the queues of that flow's children (read from the
flow's row, ``EchoMQ.child_queues``), for as long as it waits, and no other queue of the
keyspace. Extra Pumps are harmless (outbox leases make them take turns). ``pump_queues``
instead runs one Pump for the whole run on the queues it names. A flow released while no run
waits for it (the sensor path) is pumped by the sensor itself, or by a long-lived ``echomq
pump`` (see the docs/dagster.md, the deploying note).

Why the Pump is shared per process: two waits of one process on flows with the same child
queues (two inputs, two partitions) would otherwise start two Pumps on the same outboxes.
:class:`~dagster_echomq.pumps.PumpShare` counts the users of each (server, prefix, queues, Pump
options) key, starts one thread for the first and stops it with the last.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from dagster import Config
from pydantic import Field

from echomq_core import EchoMQ, Pump
from echomq_core.integration import PumpOptions, describe_option, flow_page

from .pumps import PumpShare


def _pump_field(name: str, **override: Any) -> Any:
    """A ``pump_<name>`` field whose default and description are PumpOptions' own."""
    default, doc = describe_option(PumpOptions, name)
    return Field(
        default=override.get("default", default),
        description=override.get("description", doc[0].upper() + doc[1:] + "."),
    )


class EchoMQConfig(Config):
    """The settings :class:`EchoMQResource` and :class:`~dagster_echomq.EchoMQIOManager` share:
    where the server is, the key prefix, and how a Pump runs while a step waits for a flow.

    Both classes carry these fields themselves (rather than the IO manager nesting the
    resource): a nested resource is set up a second time inside the IO manager, and on
    Dagster 1.13 that path goes through the deprecated ``InitResourceContext.dagster_run``.
    ``EchoMQIOManager.from_resource(echomq)`` copies them, ``EnvVar`` values included.
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
        description="Run a Pump thread while a step waits for a flow (and, with pump_queues, "
        "for the whole run), so children in other queues than their parent settle it even "
        "if no Pump is deployed elsewhere.",
    )
    pump_queues: list[str] | None = Field(
        default=None,
        description="Queues the run's Pump serves, for the whole run; unset: while a step "
        "waits for a flow, the queues of that flow's children (read from the server).",
    )
    # The Pump's settings: defaults and descriptions come from
    # echomq_core.PumpOptions (the same ones `echomq pump` offers), except the
    # lease (see its description).
    pump_page: int = _pump_field("page")
    pump_max_tries: int = _pump_field("max_tries")
    pump_lease: float = _pump_field(
        "lease",
        default=3.0,
        description="Seconds an outbox lease lasts: how soon another Pump takes over the outbox "
        "of one that stopped or died. Shorter than a standalone Pump's 10 s because run Pumps "
        "stop at the end of every wait and the next one waits out the lease.",
    )
    pump_interval: float = _pump_field("interval")
    pump_max_stalls: int = _pump_field("max_stalls")
    pump_discover_every: float = _pump_field("discover_every")
    pump_stop_timeout: float = Field(
        default=10.0,
        description="Seconds a stopping Pump is given to finish its tick and exit.",
    )
    dashboard_url: str | None = Field(
        default=None,
        description="Where an EchoMQ dashboard serves this keyspace (`echomq dashboard`, e.g. "
        "http://127.0.0.1:8787, or Airflow's api-server URL + /echomq); set, every flow's "
        "materialization and input metadata links to its page (flow_page).",
    )

    def flow_page(self, queue: str, parent_id: str) -> str | None:
        """The flow's page in the dashboard, if ``dashboard_url`` is set."""
        if not self.dashboard_url:
            return None
        return flow_page(self.dashboard_url, queue, parent_id)

    def open_client(self) -> EchoMQ:
        """A new client for this server and prefix; the caller closes it."""
        return EchoMQ(self.url, cluster=self.cluster, prefix=self.prefix)

    def pump_options(self) -> PumpOptions:
        """The ``pump_*`` fields as the core's :class:`~echomq_core.PumpOptions`
        (checked there: a bad value raises ``InvalidArgument`` naming it)."""
        return PumpOptions(
            page=self.pump_page,
            max_tries=self.pump_max_tries,
            lease=self.pump_lease,
            interval=self.pump_interval,
            max_stalls=self.pump_max_stalls,
            discover_every=self.pump_discover_every,
        )

    def pump_key(self, queues: Sequence[str] | None) -> tuple[Any, ...]:
        """What makes two Pumps of one process the same one (see :class:`PumpShare`)."""
        return (
            self.url,
            self.cluster,
            self.prefix,
            tuple(sorted(set(queues))) if queues is not None else None,
            self.pump_options(),
        )

    def make_pump(self, queues: Sequence[str] | None) -> tuple[EchoMQ, Pump]:
        """A client and a (not started) Pump serving ``queues`` (None: every queue)."""
        client = self.open_client()
        try:
            pump = Pump(
                client,
                sorted(set(queues)) if queues is not None else None,
                options=self.pump_options(),
                pump_id="dagster-pump-" + uuid.uuid4().hex[:12],
            )
        except BaseException:
            client.close()
            raise
        return client, pump

    @contextmanager
    def pumping(self, queues: Sequence[str]) -> Iterator[Pump | None]:
        """Run a Pump for ``queues`` (``pump_queues`` if set) for the length of the block,
        shared with any other block of this process that pumps the same queues. Nothing
        (None) when ``run_pump`` is off or there is no queue to serve."""
        chosen = list(self.pump_queues) if self.pump_queues is not None else list(queues)
        if not self.run_pump or not chosen:
            yield None
            return
        key = self.pump_key(chosen)
        pump = PumpShare.acquire(key, lambda: self.make_pump(chosen))
        try:
            yield pump
        finally:
            PumpShare.release(key, self.pump_stop_timeout)
