"""The first deferral of a fresh triggerer fires within a second of the flow's release.

A real deployment (``examples/airflow/deployment.py``): the sensor defers on a flow whose one
child waits until the test says go; the test says go once the trigger runs (its first progress
line) and its supervisor is ready - the trigger asks for that at its start
(:meth:`~echomq_provider.triggers.echo_flow.EchoFlowTrigger._warm_up`). Then the trigger's
event must follow its read of the release within a second, as in a triggerer that has run
triggers before: without the warm-up, the XCom the trigger stores made the supervisor build its
API client right then, and the event came seconds later.
"""

from __future__ import annotations

import contextlib
import json
import sys
from datetime import datetime
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = ROOT / "examples" / "airflow"
sys.path.insert(0, str(EXAMPLES))

from deployment import Deployment, DeploymentError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.onlystandalone]

DAG_ID = "echomq_first_deferral"
#: The most seconds from the trigger's read of the release to its event.
FIRES_WITHIN = 1.0


def trigger_lines(deployment: Deployment, run_id: str) -> list[tuple[float, str]]:
    """``(epoch seconds, event)`` of each line of the sensor's trigger log."""
    logs = deployment.home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / "task_id=wait"
    lines = []
    for path in sorted(logs.glob("*.trigger.*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                stamp = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
                lines.append((stamp.timestamp(), str(entry.get("event"))))
    return lines


def first_line(lines: list[tuple[float, str]], text: str) -> float | None:
    return next((stamp for stamp, event in lines if text in event), None)


def test_first_deferral_fires_within_a_second(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    deployment = Deployment(
        [HERE / "dags" / "echomq_first_deferral.py"],
        worker_app="worker_proc:HANDLERS",
        pythonpath=[HERE, EXAMPLES, ROOT],
        prefix="first",
        env={"ECHOMQ_TEST_MARKERS": str(markers)},
    )
    try:
        deployment.start()
        run_id = deployment.trigger(DAG_ID)
        deployment.wait_for(
            lambda: first_line(trigger_lines(deployment, run_id), "settled 0 of 1"),
            120,
            "the trigger's first progress line",
        )
        # the gate: the supervisor answered the trigger's warm-up question (without a
        # warm-up there is no such line: go on, the timing below says what that costs)
        with contextlib.suppress(DeploymentError):
            deployment.wait_for(
                lambda: first_line(trigger_lines(deployment, run_id), "supervisor ready"),
                60,
                "the trigger's supervisor ready",
            )
        (markers / f"{run_id.replace(':', '_')}.go").touch()
        assert deployment.wait_run(DAG_ID, run_id) == "success"
        lines = trigger_lines(deployment, run_id)
        released, fired = first_line(lines, "released:"), first_line(lines, "fired")
        assert released is not None and fired is not None, lines
        assert fired - released < FIRES_WITHIN, (
            f"the event fired {fired - released:.2f} s after the trigger read the release"
        )
        assert deployment.xcom(DAG_ID, run_id, "wait")["processed"] == 1
    finally:
        deployment.stop()
        deployment.cleanup()
