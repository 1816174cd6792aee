"""What ``get_provider_info`` declares beyond the hooks and operators, seen through Airflow's
own CLI: the ``[echomq]`` settings (``airflow config list`` / ``config get-value``) and the
"EchoMQ flow" extra links (``airflow providers links``). The schema check is
test_provider.py's; CI runs this directory at the newest and at the floor Airflow.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from echomq_provider.get_provider_info import get_provider_info

from .helpers import ROOT, airflow_cli, cli_json

DASHBOARD = ROOT / "airflow_provider" / "echomq_provider" / "plugins" / "dashboard.py"


def _fallbacks() -> dict[str, str]:
    """Each ``conf.get*(SECTION, "name", fallback=...)`` of the dashboard plugin, the
    fallback written as airflow.cfg would hold it."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(DASHBOARD.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "conf"
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == "SECTION"
        ):
            name = ast.literal_eval(node.args[1])
            [fallback] = [k.value for k in node.keywords if k.arg == "fallback"]
            found[name] = str(ast.literal_eval(fallback))
    return found


def test_the_config_section_declares_what_the_provider_reads() -> None:
    options = get_provider_info()["config"]["echomq"]["options"]
    fallbacks = _fallbacks()
    assert set(fallbacks) == {
        "dashboard",
        "dashboard_conn_id",
        "dashboard_actions",
        "dashboard_token",
        "dashboard_poll",
    }
    # one default: what a setting reads when airflow.cfg leaves it out is what config lists
    assert {name: o["default"] for name, o in options.items()} == fallbacks
    assert [n for n, o in options.items() if o.get("sensitive")] == ["dashboard_token"]


def test_airflow_config_list_shows_the_echomq_section(airflow_db: Path) -> None:
    listed = airflow_cli("config", "list", "--section", "echomq")
    assert listed.returncode == 0, listed.stderr[-3000:]
    text = listed.stdout[listed.stdout.index("[echomq]") :]
    names = [line.lstrip("# ").split(" =", 1)[0] for line in text.splitlines() if " =" in line]
    assert names == list(get_provider_info()["config"]["echomq"]["options"])
    # the defaults are Airflow's own now (3.3 lists names only, hence get-value)
    value = airflow_cli("config", "get-value", "echomq", "dashboard_conn_id")
    assert value.returncode == 0, value.stderr[-3000:]
    assert value.stdout.strip().splitlines()[-1] == "echomq_default"


def test_airflow_providers_links_lists_the_flow_links(airflow_db: Path) -> None:
    links = [row["extra_link_class_name"] for row in cli_json("providers", "links")]
    ours = [name for name in links if name.startswith("echomq_provider.")]
    assert ours == get_provider_info()["extra-links"]
    assert ours == [
        "echomq_provider.plugins.links.EchoFlowLink",
        "echomq_provider.plugins.links.EchoFlowSensorLink",
    ]
    for path in ours:  # each names the class the operator and the sensor declare
        module, name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        assert cls.name == "EchoMQ flow"
