"""What Airflow learns about this provider, through the ``apache_airflow_provider`` entry point.

Airflow calls :func:`get_provider_info` at the start of every ``airflow`` command and checks
it against ``provider_info.schema.json``. Two rules matter:

* ``package-name`` must equal the distribution name (``airflow-provider-echomq``): Airflow
  compares them and raises otherwise, which makes *every* ``airflow`` command fail at start.
  Airflow 3.3 also imports ``package-name`` with dashes as underscores
  (``airflow_provider_echomq``) to look for example DAGs; that module ships with the provider
  and points at :mod:`echomq_provider.example_dags`.
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
        "connection-types": [
            {
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
        ],
    }
