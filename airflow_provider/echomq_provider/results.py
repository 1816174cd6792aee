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

The sensor closes the flow once it is released, which starts its ``closed`` retention (1 day by
default, ``echomq queue config QUEUE --closed-age``): downstream readers - and re-runs of them
- read it until then.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .hooks.echomq import DEFAULT_PAGE, EchoMQHook


def flow_results(
    flow: Any,
    *,
    echomq_conn_id: str = EchoMQHook.default_conn_name,
    prefix: str | None = None,
    page: int = DEFAULT_PAGE,
) -> Iterator[tuple[int | str, Any]]:
    """Every completed child's ``(index or key, value)``; see the module doc.

    ``flow``: the sensor's (or the operator's) output. Raises what
    :meth:`~echomq_provider.hooks.echomq.EchoMQHook.iter_results` raises.
    """
    hook = EchoMQHook(echomq_conn_id, prefix=prefix)
    try:
        yield from hook.iter_results(flow, page=page)
    finally:
        hook.close()
