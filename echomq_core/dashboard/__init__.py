"""The EchoMQ dashboard: ``echomq dashboard``, or :func:`create_app` mounted in any ASGI server
(the Airflow provider mounts it in Airflow's api-server). Needs the ``dashboard`` extra
(``pip install 'echomq[dashboard]'``: Starlette, Jinja2, uvicorn, prometheus-client).

Read-only unless built with ``actions=True`` and a token; see :mod:`.security`."""

from __future__ import annotations

from .app import Dashboard as Dashboard
from .app import create_app as create_app

__all__ = ["Dashboard", "create_app"]
