"""Where the dashboard shows a flow: one home for the path, read by the dashboard's routes,
the Airflow provider's extra link and the Dagster integration's metadata. Standard library
only, so the adapters link to the dashboard without its extra installed."""

from __future__ import annotations

from urllib.parse import quote

#: The dashboard's route of a flow's page (a Starlette path template).
FLOW_ROUTE = "/flow/{queue}/{parent_id}"


def flow_page(base: str, queue: str, parent_id: str) -> str:
    """The URL of a flow's page under a dashboard served at ``base`` (``http://host:8787``,
    or ``/echomq`` inside Airflow's api-server); both names are quoted whole."""
    return base.rstrip("/") + FLOW_ROUTE.format(
        queue=quote(queue, safe=""), parent_id=quote(parent_id, safe="")
    )
