"""What Airflow learns about this provider, through the ``apache_airflow_provider`` entry point.

Airflow calls :func:`get_provider_info` at the start of every ``airflow`` command and checks
it against ``provider_info.schema.json``. Two rules matter:

* ``package-name`` must equal the distribution name (``airflow-provider-echomq``): Airflow
  compares them and raises otherwise, which makes *every* ``airflow`` command fail at start.
  Airflow 3.3 also imports ``package-name`` with dashes as underscores
  (``airflow_provider_echomq``) to look for example DAGs; that module ships with the provider
  and points at :mod:`echomq_provider.example_dags`.
* ``config`` declares the ``[echomq]`` settings the provider reads (the dashboard plugin's:
  :mod:`echomq_provider.plugins.dashboard`), so ``airflow config list --section echomq`` shows
  them with their defaults; each default is the fallback the code reads with.
* ``extra-links`` names the "EchoMQ flow" link classes (``airflow providers links``).
* The connection form is declared here (``conn-fields`` for the extras,
  ``ui-field-behaviour`` for the standard fields) - the Airflow 3.2+ way. Declared like this,
  Airflow builds the form without importing the hook; the hook methods
  ``get_connection_form_widgets`` / ``get_ui_field_behaviour`` are deprecated.

This module imports nothing from Airflow or EchoMQ, so it stays cheap to call; the version is
the installed distribution's (Airflow finds this function through that distribution's entry
point), which is echomq's (one version source: see hatch_build.py).
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

_INTEGRATION = "EchoMQ"


def _option(
    description: str, kind: str, default: str, *, sensitive: bool = False
) -> dict[str, Any]:
    """One option of ``config``, in the shape of Airflow's provider_info schema (defaults are
    strings, as in airflow.cfg)."""
    option = {
        "description": description,
        "version_added": None,
        "type": kind,
        "example": None,
        "default": default,
    }
    return {**option, "sensitive": True} if sensitive else option


#: The ``[echomq]`` section. Every default equals the ``fallback`` the dashboard plugin passes
#: to ``conf`` (tests/airflow/test_provider_config.py compares them).
_CONFIG = {
    "echomq": {
        "description": "The EchoMQ dashboard inside Airflow's api-server (the provider's "
        "plugin, at /echomq; it needs airflow-provider-echomq[dashboard]).\n",
        "options": {
            "dashboard": _option(
                "Mount the EchoMQ dashboard in the api-server. Airflow's login does not guard "
                "plugin apps: its pages are open to whoever reaches the api-server.\n",
                "boolean",
                "True",
            ),
            "dashboard_conn_id": _option(
                "The EchoMQ connection the dashboard reads (read at its first request).\n",
                "string",
                "echomq_default",
            ),
            "dashboard_actions": _option(
                "Allow the dashboard's actions (cancel, repair and close flows, replay poison "
                "jobs): on only when dashboard_token is set too, and each then needs it.\n",
                "boolean",
                "False",
            ),
            "dashboard_token": _option(
                "The token the dashboard's actions need (empty: actions stay off).\n",
                "string",
                "",
                sensitive=True,
            ),
            "dashboard_poll": _option(
                "Seconds between the dashboard pages' refreshes (0.2 to 3600).\n",
                "float",
                "2.0",
            ),
        },
    }
}


#: The ``echomq`` connection type: its hook, and the form Airflow's UI shows for it (the
#: extras as ``conn-fields``, the standard fields' labels as ``ui-field-behaviour``).
_CONNECTION_TYPE = {
    "connection-type": "echomq",
    "hook-class-name": "echomq_provider.hooks.echomq.EchoMQHook",
    "hook-name": "EchoMQ",
    "conn-fields": {
        "prefix": {
            "label": "Key prefix",
            "description": "Namespace of every EchoMQ key (several keyspaces can share "
            "a server). Must match the workers' prefix. Empty: emq.",
            # No default value: Airflow masks every string extra in logs and warns
            # about each one shorter than 5 characters, so a form that stored "emq"
            # would warn on every connection read. Unset means emq.
            "schema": {
                "type": ["string", "null"],
                "pattern": "^[A-Za-z0-9._-]{1,32}$",
            },
        },
        "tls": {
            "label": "TLS",
            "description": "Connect with TLS (rediss://).",
            "schema": {"type": ["boolean", "null"]},
        },
        "cluster": {
            "label": "Cluster",
            "description": "The server is a Redis Cluster; host and port: any node.",
            "schema": {"type": ["boolean", "null"]},
        },
        "ssl_cert_reqs": {
            "label": "TLS certificate check",
            "description": "required (empty), optional or none.",
            "schema": {
                "type": ["string", "null"],
                "enum": ["required", "optional", "none", None],
            },
        },
        "ssl_ca_certs": {
            "label": "TLS CA bundle path",
            "description": "Path of a CA bundle on the workers and triggerer (default: "
            "the system's).",
            "schema": {"type": ["string", "null"]},
        },
    },
    "ui-field-behaviour": {
        "hidden-fields": ["extra"],
        "relabeling": {"login": "Username (ACL)", "schema": "Database number"},
        "placeholders": {
            "host": "127.0.0.1",
            "port": "6379",
            "schema": "0",
            "login": "default",
        },
    },
}


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-echomq",
        "name": "EchoMQ",
        "description": "Durable fan-out / fan-in on Redis-protocol servers: add a flow from a "
        "task, wait for its children (poke, reschedule or deferrable), and hand "
        "their results to downstream tasks through XCom.",
        "versions": [version("airflow-provider-echomq")],
        "integrations": [{"integration-name": _INTEGRATION, "tags": ["service"]}],
        "operators": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": ["echomq_provider.operators.echo_flow"],
            }
        ],
        "sensors": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": ["echomq_provider.sensors.echo_flow"],
            }
        ],
        "hooks": [
            {"integration-name": _INTEGRATION, "python-modules": ["echomq_provider.hooks.echomq"]}
        ],
        "triggers": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": ["echomq_provider.triggers.echo_flow"],
            }
        ],
        "task-decorators": [
            {
                "name": "echo_flow",
                "class-name": "echomq_provider.decorators.echo_flow.echo_flow_task",
            }
        ],
        "config": _CONFIG,
        "extra-links": [
            "echomq_provider.plugins.links.EchoFlowLink",
            "echomq_provider.plugins.links.EchoFlowSensorLink",
        ],
        "connection-types": [_CONNECTION_TYPE],
    }
