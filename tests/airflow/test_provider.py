"""Registration: Airflow's own CLI and ProvidersManager must see the provider.

The CLI runs in child processes, exactly as an operator of Airflow would type it: a provider
whose info Airflow rejects makes every ``airflow`` command fail at start, which these catch.
"""

from __future__ import annotations

import json
from pathlib import Path

from airflow_provider.get_provider_info import get_provider_info

from .helpers import cli_json


def test_provider_info_matches_airflow_schema() -> None:
    import importlib.metadata

    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == importlib.metadata.metadata("echomq")["Name"]


def test_airflow_providers_list_shows_echomq(airflow_db: Path) -> None:
    providers = {p["package_name"]: p for p in cli_json("providers", "list")}
    assert providers["echomq"]["version"] == "0.1.0"


def test_airflow_providers_hooks_shows_connection_type(airflow_db: Path) -> None:
    hooks = {h["connection_type"]: h for h in cli_json("providers", "hooks")}
    assert hooks["echomq"] == {
        "connection_type": "echomq",
        "class": "airflow_provider.hooks.echomq.EchoMQHook",
        "conn_id_attribute_name": "echomq_conn_id",
        "package_name": "echomq",
        "hook_name": "EchoMQ",
    }


def test_connection_form_declared_in_provider_info(airflow_db: Path) -> None:
    from airflow.providers_manager import ProvidersManager

    pm = ProvidersManager()
    widgets = pm.connection_form_widgets
    assert {"extra__echomq__prefix", "extra__echomq__tls", "extra__echomq__cluster"} <= set(widgets)
    assert widgets["extra__echomq__prefix"].field["value"] == "emq"
    behaviour = pm.field_behaviours["echomq"]
    assert behaviour["hidden_fields"] == ["extra"]
    assert behaviour["relabeling"]["schema"] == "Database number"
    assert ("airflow_provider.triggers.echo_flow", "echomq") in {
        (t.trigger_class_name, t.package_name) for t in pm.trigger
    }


def test_hook_uses_no_deprecated_form_methods() -> None:
    from airflow_provider.hooks.echomq import EchoMQHook

    # Declared in provider info instead (Airflow 3.2+ deprecates the hook methods).
    assert "get_connection_form_widgets" not in EchoMQHook.__dict__
    assert "get_ui_field_behaviour" not in EchoMQHook.__dict__
