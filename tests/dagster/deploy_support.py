"""Helpers of the tests that drive a real ``dagster dev`` (webserver, daemon, code server)
through its GraphQL API, as a user's UI does: a GraphQL client, a bounded poll that fails
with the deployment's logs, process groups (the ``group_spawn`` fixture in conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from echomq_core import server


def free_port() -> int:
    """A port below the kernel's ephemeral range (the servers bind it seconds later; see
    :func:`echomq_core.server.free_port`)."""
    return server.free_port()


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


class GraphQL:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/graphql"

    def __call__(self, query: str, **variables: Any) -> dict[str, Any]:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(
            self.url, body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            reply = json.loads(response.read())
        assert "errors" not in reply, reply["errors"]
        data: dict[str, Any] = reply["data"]
        return data


#: Lines of a deployment's log that say what Dagster decided (kept whole in a timeout's
#: message: the tail alone is the daemon's idle ticks by then).
DECISIONS = re.compile(
    r"evaluation result|Submitted run|RUN_FAILURE|STEP_FAILURE|RUN_CANCELED|ASSET_MATERIALIZATION"
    r"|Traceback|Error"
)


def poll(what: str, check: Callable[[], Any], timeout: float, logs: list[Path]) -> Any:
    """Call ``check`` until it returns something truthy; fail after ``timeout`` seconds with
    the deployment's decisions (:data:`DECISIONS`, the last 40 lines of each log) and the tail
    of each log."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            parts = []
            for path in logs:
                text = path.read_text(errors="replace")
                decided = [line for line in text.splitlines() if DECISIONS.search(line)]
                parts.append(f"--- {path.name}: decisions\n" + "\n".join(decided[-40:]))
                parts.append(f"--- {path.name}: tail\n{text[-3000:]}")
            raise AssertionError(f"timed out waiting for {what}\n" + "\n".join(parts))
        time.sleep(0.5)


def logs_mention(gql: GraphQL, run_id: str, text: str) -> bool:
    """Whether the run's event log has a message containing ``text``."""
    data = gql(
        """query($id: ID!) {
          logsForRun(runId: $id) {
            ... on EventConnection { events { ... on MessageEvent { message } } }
          }
        }""",
        id=run_id,
    )
    events = data["logsForRun"].get("events") or []
    return any(text in (e.get("message") or "") for e in events)


def location_loaded(gql: GraphQL, repository: str = "__repository__") -> bool:
    """Whether the webserver answers and has loaded the code location's repository."""
    try:
        data = gql("{ repositoriesOrError { ... on RepositoryConnection { nodes { name } } } }")
    except (urllib.error.URLError, ConnectionError, OSError):
        return False
    nodes = data["repositoriesOrError"].get("nodes") or []
    return any(n["name"] == repository for n in nodes)


def dagster_home(tmp_path: Path) -> Path:
    """A fresh ``DAGSTER_HOME`` for one ``dagster dev``: its own instance, telemetry off."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return home


def entries(event: dict[str, Any]) -> dict[str, Any]:
    """An event's metadata entries (as GraphQL returns them) as {label: value}."""
    out: dict[str, Any] = {}
    for entry in event["metadataEntries"]:
        values = [v for k, v in entry.items() if k not in ("label", "__typename")]
        out[entry["label"]] = values[0] if values else None
    return out
