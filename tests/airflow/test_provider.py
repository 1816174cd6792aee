"""Registration: Airflow's own CLI and ProvidersManager must see the provider.

The CLI runs in child processes, exactly as an operator of Airflow would type it: a provider
whose info Airflow rejects makes every ``airflow`` command fail at start, which these catch.
"""

from __future__ import annotations

import json
from pathlib import Path

from echomq_provider.get_provider_info import get_provider_info

from .helpers import cli_json


def test_provider_info_matches_airflow_schema() -> None:
    import importlib.metadata

    import airflow
    import jsonschema

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == importlib.metadata.metadata("airflow-provider-echomq")["Name"]


def test_airflow_providers_list_shows_echomq(airflow_db: Path) -> None:
    providers = {p["package_name"]: p for p in cli_json("providers", "list")}
    assert providers["airflow-provider-echomq"]["version"] == "0.1.0"


def test_airflow_providers_hooks_shows_connection_type(airflow_db: Path) -> None:
    hooks = {h["connection_type"]: h for h in cli_json("providers", "hooks")}
    assert hooks["echomq"] == {
        "connection_type": "echomq",
        "class": "echomq_provider.hooks.echomq.EchoMQHook",
        "conn_id_attribute_name": "echomq_conn_id",
        "package_name": "airflow-provider-echomq",
        "hook_name": "EchoMQ",
    }


def test_connection_form_declared_in_provider_info(airflow_db: Path) -> None:
    import importlib.util

    from airflow.providers_manager import ProvidersManager
    from echomq_provider._compat import FORM_FROM_HOOK

    pm = ProvidersManager()
    widgets = pm.connection_form_widgets
    if FORM_FROM_HOOK and importlib.util.find_spec("flask_appbuilder") is None:
        # Airflow 3.1 builds the form from wtforms and Flask-AppBuilder, which its default
        # install lacks: it then registers no provider's form (it logs so at INFO and stops
        # before the field behaviour). What the hook would answer is checked against Airflow's
        # own schema instead.
        from echomq_provider.hooks.echomq import EchoMQHook

        assert not any(name.startswith("extra__echomq__") for name in widgets)
        behaviour = EchoMQHook.get_ui_field_behaviour()
        pm._customized_form_fields_schema_validator.validate(behaviour)
    else:
        wanted = {"extra__echomq__prefix", "extra__echomq__tls", "extra__echomq__cluster"}
        assert wanted <= set(widgets)
        # no stored default: Airflow masks string extras and warns about short ones ("emq")
        prefix = widgets["extra__echomq__prefix"].field
        assert (prefix["value"] if isinstance(prefix, dict) else prefix.kwargs["default"]) is None
        behaviour = pm.field_behaviours["echomq"]
    assert behaviour["hidden_fields"] == ["extra"]
    assert behaviour["relabeling"]["schema"] == "Database number"
    assert ("echomq_provider.triggers.echo_flow", "airflow-provider-echomq") in {
        (t.trigger_class_name, t.package_name) for t in pm.trigger
    }


def test_hook_uses_no_deprecated_form_methods() -> None:
    from echomq_provider._compat import FORM_FROM_HOOK
    from echomq_provider.hooks.echomq import EchoMQHook

    # Declared in provider info (Airflow 3.2+ deprecates the hook methods); Airflow 3.1 knows
    # only the methods, which then answer from the same declaration.
    assert ("get_connection_form_widgets" in EchoMQHook.__dict__) is FORM_FROM_HOOK
    assert ("get_ui_field_behaviour" in EchoMQHook.__dict__) is FORM_FROM_HOOK


def test_default_install_with_example_dags_logs_nothing_from_echomq(tmp_path: Path) -> None:
    """Airflow's default settings load every provider's example DAGs (``load_examples``): our
    provider's bundle is found (through ``airflow_provider_echomq``) and parses, and nothing
    it logs is a warning or an error."""
    import os
    import subprocess
    import sys

    home = tmp_path / "airflow"
    env = dict(
        os.environ,
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="True",
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
    )
    (home / "dags").mkdir(parents=True)
    airflow = [sys.executable, "-m", "airflow"]
    for args in (["db", "migrate"], ["dags", "reserialize"]):
        done = subprocess.run(
            [*airflow, *args], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        lines = (done.stdout + done.stderr).splitlines()
        ours = [
            line
            for line in lines
            if "echomq" in line.lower()
            and any(word in line.lower() for word in ("warn", "error", "exception", "could not"))
        ]
        assert ours == [], ours
    listed = subprocess.run(
        [*airflow, "dags", "list", "-o", "json"], env=env, capture_output=True, text=True
    )
    table = next(line for line in listed.stdout.splitlines() if line.startswith("[{"))
    dags = {d["dag_id"]: d for d in json.loads(table)}
    from airflow.dag_processing.bundles import manager

    if hasattr(manager, "_add_provider_example_dags_to_bundle"):  # Airflow 3.3+
        assert dags["echomq_fan_out"]["bundle_name"] == "airflow-provider-echomq-example-dags"
    else:  # before 3.3 Airflow loads no example DAGs of providers outside airflow.providers
        assert "echomq_fan_out" not in dags
