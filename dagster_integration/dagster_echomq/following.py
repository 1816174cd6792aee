"""``FlowFollow``: a downstream asset's input that yields the results as the children settle.

Using::

    @asset(io_manager_key="echomq_io")
    def measurements(context, echomq: EchoMQResource) -> FlowRef:
        return echomq.add_flow("reports", [...], parent_id=echomq.run_scoped_id(context),
                               stream=True)          # the flow keeps its settle log

    @asset
    def summary(measurements: FlowFollow) -> int:      # annotated so: followed
        return sum(value["rows"] for _child_id, value in measurements)

Dagster starts a downstream step only once its upstream step has ended. So the fan-out asset
returns as soon as the flow is added (a barrier flow, ``EchoMQIOManager``'s default: no wait
in ``handle_output``), and the downstream's ``load_input`` hands over a ``FlowFollow`` at once,
without waiting for the release: iterating it yields ``(child id, result)`` in the order the
children settle (``EchoMQ.iter_results(..., follow=True)``, :mod:`echomq_core.flows.streaming`),
blocks between them, and ends when the flow is released. The step then ends about when its
fan-out does, where a ``dict`` or ``FlowStream`` input waits for the release before the step's
body starts.

Each pass (each ``iter()``) reads the settle log from its start with a client of its own and a
Pump for the children's queues (``run_pump``), and the first pass read to the release closes
the flow (``close_after_read``). A re-executed run's step reads the same flow (its handle is
the asset's) from the start, so what the step computes holds each child once; a flow that
failed is repaired first, as for the other inputs. A pass raises
:class:`~dagster_echomq.failures.FlowFailedError` at the first read after the flow failed or
was cancelled. A flow added without ``stream=True`` is refused when the input loads, before the
step's body runs (:class:`~echomq_core.InvalidArgument`). A follow has no ``wait_timeout`` or
``stall_timeout``: it blocks until the release (bound the step with Dagster's run timeout).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from echomq_core import EchoMQ, FlowRef, ParentFailed
from echomq_core.integration import MAX_FOLLOW_PAGE

from .failures import flow_error


class FlowFollow(Iterable[tuple[str, Any]]):
    """A flow's results as ``(child id, result)`` pairs, each as its child settles, ending at
    the flow's release. Annotate an input with it to get one (see the module doc). ``total``:
    the flow's number of children when the input was loaded."""

    def __init__(
        self, flow: FlowRef, total: int, passes: Callable[[], Iterator[tuple[str, Any]]]
    ) -> None:
        self.flow = flow
        self.total = total
        self._passes = passes

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return self._passes()

    def __repr__(self) -> str:
        return f"FlowFollow({self.flow.queue!r}, {self.flow.parent_id!r}, total={self.total})"


def check_followable(client: EchoMQ, flow: FlowRef) -> None:
    """Refuse, before the step's body runs, a flow that cannot be followed: gone
    (``JobNotFound``), without a settle log (``InvalidArgument``), failed or cancelled
    (:class:`~dagster_echomq.failures.FlowFailedError`). One read of at most one log entry."""
    try:
        client.iter_results(flow.queue, flow.parent_id, follow=False, page=1).check()
    except ParentFailed:
        raise flow_error(client, client.snapshot(flow.queue, flow.parent_id)) from None


def follow_passes(
    open_client: Callable[[], EchoMQ],
    pumping: Callable[[list[str]], Any],
    flow: FlowRef,
    queues: list[str],
    *,
    close: bool,
    page: int,
) -> Callable[[], Iterator[tuple[str, Any]]]:
    """A new follow of ``flow`` for each pass; the first pass read to the release closes it
    (when ``close``: a barrier flow), later ones find it closed and read the same log."""
    unclosed = [close]

    def one_pass() -> Iterator[tuple[str, Any]]:
        # Its own client: the step's may be closed before a lazy consumer finishes.
        client = open_client()
        try:
            # Children in the parent's own queue settle it themselves: no signal to carry.
            with pumping([q for q in queues if q != flow.queue]):
                results = client.iter_results(
                    flow.queue, flow.parent_id, follow=True, page=min(page, MAX_FOLLOW_PAGE)
                )
                try:
                    yield from results
                except ParentFailed:
                    snap = client.snapshot(flow.queue, flow.parent_id)
                    raise flow_error(client, snap) from None
            if unclosed[0] and client.snapshot(flow.queue, flow.parent_id).parent_state == (
                "released"
            ):
                client.close_flow(flow.queue, flow.parent_id)
                unclosed[0] = False
        finally:
            client.close()

    return one_pass
