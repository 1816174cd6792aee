"""The ``echomq`` connection type and the hook that turns a connection into EchoMQ clients.

Using::

    hook = EchoMQHook("echomq_default")
    mq = hook.get_conn()                  # sync EchoMQ, for operators and sensors; cached
    amq = await hook.aget_conn()          # AsyncEchoMQ, for triggers; the caller closes it
    for item, value in hook.iter_results(wait.output):   # a flow's results, page by page
        ...
    for item, value in hook.follow_results(fan_out.output):   # as they settle (stream=True)
        ...

The connection comes from wherever Airflow keeps connections: the metadata DB, a secrets
backend, or an ``AIRFLOW_CONN_ECHOMQ_DEFAULT`` variable in URI form
(``echomq://:pw@host:6379/0?prefix=etl``) or JSON form. Its fields are described in
:mod:`echomq_provider.hooks.settings`; the form Airflow's UI shows for them is declared in
``get_provider_info`` (``conn-fields`` / ``ui-field-behaviour``), not by hook methods, which
Airflow 3.2 deprecated.

Why two fetch paths: inside the triggerer a sync connection read blocks the event loop on a
request to the supervisor that the same loop must answer - a deadlock. :meth:`aget_conn`
fetches the connection with ``aget_connection`` and parses extras with ``aextra_dejson``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from airflow.sdk import BaseHook

from echomq_core import (
    AsyncEchoMQ,
    EchoMQ,
    FlowCancelled,
    FlowTimeout,
    InvalidInput,
    JobNotFound,
    ParentFailed,
)
from echomq_core.checks import check_int
from echomq_core.errors import flow_error
from echomq_core.flows.children import MAX_RANGE
from echomq_core.flows.reads import not_found
from echomq_core.flows.streaming import MAX_PAGE as MAX_FOLLOW_PAGE

from .._compat import (
    CONNECTION_NOT_FOUND,
    FORM_FROM_HOOK,
    aextra_dejson,
    field_behaviour,
    form_widgets,
)
from ..errors import ConnectionNotDefined, FlowNotReleased
from ..flow_specs import flow_span, flow_target, labeller
from .settings import EchoMQConnectionSettings

#: Results read per round trip by :meth:`EchoMQHook.iter_results` (an HSCAN hint): 20,000
#: results in 4 round trips, and a page of small results stays well under a megabyte.
DEFAULT_PAGE = 5000


class EchoMQHook(BaseHook):
    """Clients for one ``echomq`` connection.

    :param echomq_conn_id: the connection (default ``echomq_default``).
    :param prefix: the key prefix, overriding the connection's ``prefix`` extra (so one
        connection can serve several keyspaces).
    """

    conn_name_attr = "echomq_conn_id"
    default_conn_name = "echomq_default"
    conn_type = "echomq"
    hook_name = "EchoMQ"

    def __init__(
        self, echomq_conn_id: str = default_conn_name, *, prefix: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.echomq_conn_id = echomq_conn_id
        self.prefix = prefix
        self._client: EchoMQ | None = None

    if FORM_FROM_HOOK:  # Airflow 3.1; 3.2+ reads the form from provider info

        @classmethod
        def get_connection_form_widgets(cls) -> dict[str, Any]:
            return form_widgets()

        @classmethod
        def get_ui_field_behaviour(cls) -> dict[str, Any]:
            return field_behaviour()

    def __repr__(self) -> str:
        return f"EchoMQHook(echomq_conn_id={self.echomq_conn_id!r}, prefix={self.prefix!r})"

    # -- settings -------------------------------------------------------------------------
    def settings(self) -> EchoMQConnectionSettings:
        """Read the connection (sync: tasks only, never inside a trigger). Raises
        :class:`~echomq_provider.errors.ConnectionNotDefined` when it is not defined."""
        try:
            conn = self.get_connection(self.echomq_conn_id)
        except CONNECTION_NOT_FOUND as exc:
            raise ConnectionNotDefined(self.echomq_conn_id) from exc
        return EchoMQConnectionSettings.from_connection(conn, conn.extra_dejson, prefix=self.prefix)

    async def asettings(self) -> EchoMQConnectionSettings:
        """Read the connection without blocking the event loop (triggers); as :meth:`settings`."""
        try:
            conn = await self.aget_connection(self.echomq_conn_id)
        except CONNECTION_NOT_FOUND as exc:
            raise ConnectionNotDefined(self.echomq_conn_id) from exc
        extra = await aextra_dejson(conn)
        return EchoMQConnectionSettings.from_connection(conn, extra, prefix=self.prefix)

    # -- clients --------------------------------------------------------------------------
    def get_conn(self) -> EchoMQ:
        """The sync client, made on first use and kept until :meth:`close`."""
        if self._client is None:
            s = self.settings()
            self.log.info("EchoMQ connection %r: %s, prefix %r", s.conn_id, s.where, s.prefix)
            self._client = EchoMQ(s.url, cluster=s.cluster, prefix=s.prefix, **s.client_options())
        return self._client

    async def aget_conn(self) -> AsyncEchoMQ:
        """A new async client; the caller owns it and must ``await client.close()``.

        Not cached: a trigger's client lives and dies with the trigger's event loop.
        """
        s = await self.asettings()
        self.log.info("EchoMQ connection %r (async): %s, prefix %r", s.conn_id, s.where, s.prefix)
        return AsyncEchoMQ(s.url, cluster=s.cluster, prefix=s.prefix, **s.client_options())

    # -- results ------------------------------------------------------------------------
    def iter_results(
        self, flow: Any, *, page: int = DEFAULT_PAGE
    ) -> Iterator[tuple[int | str, Any]]:
        """Every completed child's result as ``(index or key, value)``, read from the server
        ``page`` at a time (never through XCom; memory stays flat at any N), in no particular
        order. ``index`` is the position of the child's spec in the operator's ``children``;
        ``key`` the string its spec gave (see :func:`~echomq_provider.flow_specs.child_label`).

        ``flow``: what the sensor or the operator returned (a mapping with ``queue`` and
        ``parent_id``), or a :class:`~echomq_core.FlowRef`. The flow must be released (or
        closed: a closed flow reads until its retention ends). Raises
        :class:`~echomq_provider.errors.FlowNotReleased` while children are outstanding,
        :class:`~echomq_core.ParentFailed` / :class:`~echomq_core.FlowCancelled` for a failed
        or cancelled flow, and :class:`~echomq_core.JobNotFound` once it expired.
        """
        queue, parent_id = flow_target(flow)
        mq = self.get_conn()
        snap = mq.snapshot(queue, parent_id)
        if snap.outcome == "missing":  # the core's error: the queue and id, and the closest queues
            raise mq.perform(not_found(mq.keys, queue, parent_id))
        if snap.outcome in ("failed", "cancelled"):
            failed = mq.failed_children(queue, parent_id)
            raise flow_error(queue, parent_id, snap.outcome, failed, snap.error)
        if snap.outcome != "released":
            raise FlowNotReleased(
                f"flow {parent_id} in queue {queue!r} is not released: {snap.dependencies} of "
                f"{snap.total} children outstanding"
            )
        span = flow_span(flow)
        if span is not None:  # one slice of flow_slices(): its positions only
            start, stop = span
            for low in range(start, stop, page):
                high = min(stop, low + page)
                yield from mq.children_values_range(queue, parent_id, low, high)
            return
        label = labeller(parent_id)
        for child_id, value in mq.iter_children_values(queue, parent_id, page=page):
            yield label(child_id), value

    def follow_results(
        self,
        flow: Any,
        *,
        page: int = DEFAULT_PAGE,
        block: float = 1.0,
        close_flow: bool = True,
        cancel_on_failure: bool = True,
        timeout: float | None = None,
    ) -> Iterator[tuple[int | str, Any]]:
        """The results of a flow added with ``stream=True`` as its children settle: ``(index
        or key, value)`` in the order the parent counted them, labelled as
        :meth:`iter_results` labels them, from the flow's settle log
        (:meth:`EchoMQ.iter_results <echomq_core.EchoMQ.iter_results>`, ``follow=True``).

        While the flow is held it blocks between results (one ``XREAD BLOCK`` of at most
        ``block`` s at a time, woken by the next settle) and it ends when the flow is released;
        a barrier flow is then closed (``close_flow``; its ``closed`` retention starts, as the
        sensor closes what it read), a worker-run parent is left to its worker. Each call reads
        the log from its start: a retried task reads every result again, so what it returns
        holds each child once (see :mod:`echomq_provider.results`). ``page``: entries per read
        when results are already there (at most 1,000, a log page).

        Raises :class:`~echomq_core.ParentFailed` / :class:`~echomq_core.FlowCancelled` at
        the first read after the flow failed or was cancelled; at the first ``next()``, before
        any result: :class:`~echomq_core.JobNotFound` when there is no such flow,
        :class:`~echomq_core.InvalidArgument` for a flow added without ``stream=True``, and
        :class:`~echomq_core.InvalidInput` for a slice of :meth:`slices` (a slice is read
        whole, once released). A failed flow is cancelled as it raises
        (``cancel_on_failure``), as the sensor does: its children that have not started never
        start, and a clear of the operator repairs it. ``timeout``: the most seconds to wait
        for the release in all; past it :class:`~echomq_core.FlowTimeout` is raised and the flow
        cancelled (``cancel_on_failure``), as a sensor that times out gives up on its flow."""
        if flow_span(flow) is not None:
            raise InvalidInput(
                f"a slice of a flow cannot be followed, got {flow!r:.200}: follow the flow "
                "itself (the operator's output), or read the slice with iter_results"
            )
        queue, parent_id = flow_target(flow)
        page = check_int("page", page, 1)
        mq = self.get_conn()
        results = mq.iter_results(
            queue,
            parent_id,
            follow=True,
            block=block,
            page=min(page, MAX_FOLLOW_PAGE),
            timeout=timeout,
        ).check()
        label = labeller(parent_id)
        try:
            for child_id, value in results:
                yield label(child_id), value
        except ParentFailed as exc:
            if cancel_on_failure and not isinstance(exc, FlowCancelled):
                mq.cancel_flow(queue, parent_id, reason=f"a child failed the flow: {exc}"[:500])
            raise
        except FlowTimeout as exc:
            if cancel_on_failure:
                mq.cancel_flow(queue, parent_id, reason=f"the follower gave up: {exc}"[:500])
            raise
        if close_flow and mq.snapshot(queue, parent_id).parent_state == "released":
            mq.close_flow(queue, parent_id)  # a barrier flow, read to its release

    def slices(self, flow: Any, size: int) -> list[dict[str, Any]]:
        """The flow cut in slices of ``size`` positions, each a small mapping (its reference,
        ``start``, ``stop``) that :meth:`iter_results` reads alone: a list to ``.expand()``
        over, so mapped tasks read a flow of any N straight from the server, none of its
        values through XCom. :class:`~echomq_core.InvalidArgument` for a flow whose children
        have ids of their own (keyed specs): their positions are not their ids."""
        size = check_int("size", size, 1, MAX_RANGE)
        queue, parent_id = flow_target(flow)
        mq = self.get_conn()
        snap = mq.snapshot(queue, parent_id)
        if snap.outcome == "missing":
            raise mq.perform(not_found(mq.keys, queue, parent_id))
        total = snap.total
        if not total:
            raise JobNotFound(f"flow {parent_id} in queue {queue!r} has no children")
        mq.children_values_range(queue, parent_id, 0, 0)  # refuses explicit ids, reads nothing
        ref = {"queue": queue, "parent_id": parent_id}
        return [
            {**ref, "start": start, "stop": min(total, start + size)}
            for start in range(0, total, size)
        ]

    def close(self) -> None:
        """Close the sync client, if one was made."""
        if self._client is not None:
            client, self._client = self._client, None
            client.close()

    def test_connection(self) -> tuple[bool, str]:
        """The UI's "Test" button: one round trip that reads the queue registry."""
        try:
            s = self.settings()
            with EchoMQ(s.url, cluster=s.cluster, prefix=s.prefix, **s.client_options()) as mq:
                queues = mq.queues()
        except Exception as exc:  # the UI shows the message; nothing here may raise
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"Connected to {s.where}: {len(queues)} queue(s) under prefix {s.prefix!r}"
