"""Read a flow's results in a downstream task, page by page, without the metadata database.

Using::

    from echomq_provider.results import flow_results

    @task
    def summarise(flow: dict) -> int:
        return sum(value["rows"] for _item, value in flow_results(flow))

    summarise(wait.output)            # the sensor's return value: the flow's reference and counts

:func:`flow_results` is :meth:`EchoMQHook.iter_results
<echomq_provider.hooks.echomq.EchoMQHook.iter_results>` with the hook made and closed for you:
it yields ``(index, value)`` - ``index`` the position of the child's spec in the operator's
``children`` - or ``(key, value)`` when the specs gave keys, in no particular order, reading
``page`` results per round trip. Memory stays flat at any N (200,000 children read in pages
of 5,000, the default, hold one page at a time).

Mapped tasks, one per slice: :func:`flow_slices` cuts a released flow into slices of
``size`` positions (small mappings: its reference, ``start``, ``stop``) to ``.expand()`` over,
and :func:`flow_results` of a slice reads that slice's values only, straight from the server
(two round trips a page). The metadata database holds the slices, about 130 bytes each, never
a value: 100,000 children in slices of 1,000 are 100 mapped tasks and a 13 KB XCom, where
``return_values=True`` stops at ``max_values`` (1,024, Airflow's ``max_map_length``)::

    @task
    def slices(flow: dict) -> list[dict]:
        return flow_slices(flow, size=1000)

    @task
    def load(part: dict) -> int:
        return sum(value["rows"] for _index, value in flow_results(part))

    load.expand(part=slices(wait.output))

As a data frame: :func:`flow_frame` gives the same results as a pandas or polars DataFrame or
an Arrow table (``kind``), built one page at a time (:mod:`echomq_core.flows.frames`): a ``child``
column (the index or key) and the value's fields as columns (a value that is not a mapping in
one ``value`` column). It reads a slice as :func:`flow_results` does. Return a summary of it,
not the frame, from the task: a frame returned goes to XCom whole::

    @task
    def load(part: dict) -> int:
        frame = flow_frame(part, kind="polars")
        return int(frame["rows"].sum())

Slices are positions in ``children``: a flow whose specs gave keys (ids of their own) is
refused with :class:`~echomq_core.InvalidArgument`; read it whole.

The sensor closes the flow once it is released, which starts its ``closed`` retention (1 day by
default, ``echomq queue config QUEUE --closed-age``): downstream readers - and re-runs of them
- read it until then.

As the children settle: a flow added with ``stream=True`` (``EchoFlowOperator(...,
stream=True)`` or ``@task.echo_flow(..., stream=True)``) keeps a settle log, and
``flow_results(flow, follow=True)`` in a task downstream of the *operator* (no sensor between)
runs while the fan-out does: it yields ``(index or key, value)`` in the order the children
settled, blocks between them, and ends when the flow is released, so the task ends about when
the fan-out does::

    fan_out = EchoFlowOperator(task_id="fan_out", ..., stream=True)

    @task
    def load(flow: dict) -> int:
        return sum(value["rows"] for _index, value in flow_results(flow, follow=True))

    load(fan_out.output)

What a retry guarantees: each ``flow_results(..., follow=True)`` reads the log from its start,
and a task's return value is written only when the task succeeds, so a task that failed half
way and is retried reads every result again and returns what it computed from each child
once - nothing skipped, nothing twice. Side effects it had per result in the failed try (rows
written elsewhere) happen again: make them idempotent (keyed by the index or key). The cursor
is never stored; nothing in the metadata database grows with N.

Who closes the flow: the follower, once it read it to the release (a barrier flow;
``close_flow=False`` leaves it released), or a sensor that also waits on it - whichever comes
first, the other finds it closed. It raises :class:`~echomq_core.ParentFailed` at the first
read after a fail-the-parent child died, and cancels the flow then, as the sensor does (its
unstarted children never start; a clear of the operator repairs it; ``cancel_on_failure=False``
leaves it), :class:`~echomq_core.FlowCancelled` for a cancelled flow, and
:class:`~echomq_core.InvalidArgument` for a flow added without ``stream=True``, before any
result. A follower that fails in its own code leaves the flow to its children: it is released
when they settle, and a retry reads it again. When the run fails for good (the follower out of
tries, killed, marked failed), the operator's failure callbacks - a ``stream=True`` operator
carries them as a waiting task does (:mod:`echomq_provider.settle`) - cancel a flow still
held and close a released one, so nothing waits for its ``unclosed`` retention.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from echomq_core import InvalidInput
from echomq_core.integration import frame_library, results_frame

from .hooks.echomq import DEFAULT_PAGE, EchoMQHook


def flow_results(
    flow: Any,
    *,
    follow: bool = False,
    echomq_conn_id: str = EchoMQHook.default_conn_name,
    prefix: str | None = None,
    page: int = DEFAULT_PAGE,
    close_flow: bool = True,
    cancel_on_failure: bool = True,
    timeout: float | None = None,
) -> Iterator[tuple[int | str, Any]]:
    """Every completed child's ``(index or key, value)``; see the module doc.

    ``flow``: the sensor's (or the operator's) output. Raises what
    :meth:`~echomq_provider.hooks.echomq.EchoMQHook.iter_results` raises.
    ``follow=True``: the results of a flow added with ``stream=True`` as its children settle,
    ending at the release (:meth:`~echomq_provider.hooks.echomq.EchoMQHook.follow_results`,
    which closes a barrier flow then unless ``close_flow=False``, and cancels a failed one
    unless ``cancel_on_failure=False``); ``timeout``: the most seconds it waits for the release
    (then ``FlowTimeout``, the flow cancelled unless ``cancel_on_failure=False``).
    """
    flags = {"follow": follow, "close_flow": close_flow, "cancel_on_failure": cancel_on_failure}
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise InvalidInput(f"{name} must be True or False, got {flag!r}")
    hook = EchoMQHook(echomq_conn_id, prefix=prefix)
    try:
        if follow:
            yield from hook.follow_results(
                flow,
                page=page,
                close_flow=close_flow,
                cancel_on_failure=cancel_on_failure,
                timeout=timeout,
            )
        elif timeout is not None:
            raise InvalidInput("timeout applies to follow=True (a released flow is read at once)")
        else:
            yield from hook.iter_results(flow, page=page)
    finally:
        hook.close()


def flow_slices(
    flow: Any,
    *,
    size: int = 1000,
    echomq_conn_id: str = EchoMQHook.default_conn_name,
    prefix: str | None = None,
) -> list[dict[str, Any]]:
    """The flow cut in slices of ``size`` positions, for ``.expand()``; see the module doc
    (:meth:`EchoMQHook.slices <echomq_provider.hooks.echomq.EchoMQHook.slices>`)."""
    hook = EchoMQHook(echomq_conn_id, prefix=prefix)
    try:
        return hook.slices(flow, size)
    finally:
        hook.close()


def flow_frame(
    flow: Any,
    kind: str = "pandas",
    *,
    key: str = "child",
    echomq_conn_id: str = EchoMQHook.default_conn_name,
    prefix: str | None = None,
    page: int = DEFAULT_PAGE,
) -> Any:
    """The results :func:`flow_results` yields, as a frame of ``kind`` (``"pandas"``,
    ``"polars"`` or ``"arrow"``) whose ``key`` column holds each child's index or key; see
    :func:`echomq_core.results_frame`. A kind not installed is refused before anything
    is read."""
    frame_library(kind)
    return results_frame(
        flow_results(flow, echomq_conn_id=echomq_conn_id, prefix=prefix, page=page),
        kind,
        key=key,
        page=page,
    )
