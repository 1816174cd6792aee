"""EchoMQ inside Airflow's UI: the dashboard mounted in the api-server, a link to it in the
navigation, and an extra link from each flow task instance to its flow's page.

Registered through the ``airflow.plugins`` entry point of the provider's distribution (Airflow
loads a provider's ``get_provider_info`` plugins only when providers are not discovered
lazily; entry-point plugins always), so installing ``airflow-provider-echomq[dashboard]`` is
all it takes:

* ``fastapi_apps``: the dashboard (:func:`echomq_core.dashboard.create_app`) at ``/echomq``
  of the api-server. It is built on the first request, not at import (every Airflow process
  imports plugins; the connection may not exist yet when the api-server starts), from the
  connection ``[echomq] dashboard_conn_id`` (default ``echomq_default``).
* ``external_views``: "EchoMQ" in the navigation (Browse), opening ``/echomq/`` inside
  Airflow's page.
* :class:`~.links.EchoFlowLink` / :class:`~.links.EchoFlowSensorLink`: "EchoMQ flow" on a
  task instance of
  :class:`~echomq_provider.operators.echo_flow.EchoFlowOperator` /
  :class:`~echomq_provider.sensors.echo_flow.EchoFlowSensor`, pointing at
  ``<[api] base_url>/echomq/flow/<queue>/<parent id>``. Airflow 3 computes an operator's
  extra links in the worker when the task ends and keeps them as XCom; only links the operator
  class declares are computed, so each class carries ``operator_extra_links`` naming its link.

Security: Airflow does not put its login in front of plugin apps. Mounted here the dashboard is
therefore read-only unless ``[echomq] dashboard_actions = True`` AND ``[echomq]
dashboard_token`` is set (then actions need that token, as with ``echomq dashboard``); reads
are open to whoever reaches the api-server - set ``[echomq] dashboard = False`` to not mount
it at all.

Airflow 3.1 to 3.3 all have ``fastapi_apps``, ``external_views`` and ``airflow.sdk``'s
``BaseOperatorLink`` (tests/airflow/test_dashboard_plugin.py runs at both ends).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from .._compat import conf
from .links import URL_PREFIX
from .links import EchoFlowLink as EchoFlowLink
from .links import EchoFlowSensorLink as EchoFlowSensorLink

log = logging.getLogger(__name__)

SECTION = "echomq"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def dashboard_settings() -> dict[str, Any]:
    """The ``[echomq]`` settings the mounted dashboard reads (at its first request)."""
    return {
        "conn_id": conf.get(SECTION, "dashboard_conn_id", fallback="echomq_default"),
        "actions": conf.getboolean(SECTION, "dashboard_actions", fallback=False),
        "token": conf.get(SECTION, "dashboard_token", fallback="") or None,
        "poll": conf.getfloat(SECTION, "dashboard_poll", fallback=2.0),
    }


class LazyDashboard:
    """An ASGI app that builds the dashboard on its first request and then hands every
    request to it. A failure to build (the connection is missing, the ``dashboard`` extra is
    not installed) answers 503 with the reason and is tried again at the next request."""

    def __init__(self, settings: Callable[[], dict[str, Any]] = dashboard_settings) -> None:
        self._settings = settings
        self._app: Any = None
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget the built dashboard (its client is closed): the next request builds it
        again from the settings then in force."""
        with self._lock:
            app, self._app = self._app, None
        if app is not None:
            app.state.dashboard.client.close()

    def _build(self) -> Any:
        with self._lock:
            if self._app is None:
                s = self._settings()
                try:
                    from echomq_core.dashboard import create_app
                except ImportError as exc:
                    raise RuntimeError(
                        "the EchoMQ dashboard needs its extra: pip install "
                        f"'airflow-provider-echomq[dashboard]' ({exc})"
                    ) from exc
                from ..hooks.echomq import EchoMQHook

                client = EchoMQHook(s["conn_id"]).get_conn()
                self._app = create_app(
                    client,
                    actions=bool(s["actions"] and s["token"]),
                    token=s["token"] if s["actions"] else None,
                    poll=s["poll"],
                    title="EchoMQ",
                )
                log.info("EchoMQ dashboard mounted at %s (connection %r)", URL_PREFIX, s["conn_id"])
            return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # mounted apps get none; answer one if asked
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        try:
            import anyio.to_thread

            app = await anyio.to_thread.run_sync(self._build)  # reads the connection: blocks
        except Exception as exc:
            log.warning("EchoMQ dashboard unavailable: %s", exc)
            body = f"EchoMQ dashboard unavailable: {type(exc).__name__}: {exc}\n".encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await app(scope, receive, send)


def _mounted() -> bool:
    return conf.getboolean(SECTION, "dashboard", fallback=True)


class EchoMQPlugin(AirflowPlugin):
    """The provider's plugin: the dashboard app, its navigation entry, the flow links."""

    name = "echomq"
    fastapi_apps = (
        [{"app": LazyDashboard(), "url_prefix": URL_PREFIX, "name": "EchoMQ dashboard"}]
        if _mounted()
        else []
    )
    external_views = (
        [
            {
                "name": "EchoMQ",
                "href": "echomq/",
                "destination": "nav",
                "category": "browse",
                "url_route": "echomq",
            }
        ]
        if _mounted()
        else []
    )
