"""Results that stream, in a real deployment: Airflow's api-server, scheduler, dag-processor and
triggerer as processes (LocalExecutor, SQLite), an EchoMQ server, ``echomq worker`` and
``echomq pump`` - started by ``examples/airflow/deployment.py`` - driven through the REST API.

1. the provider's example DAG ``echomq_stream`` succeeds: ``load``, downstream of the operator,
   returns every child's result once and closes the flow;
2. ``echomq_stream_gated`` (the test's gates: the children settle only once ``load`` runs, the
   last only after ``load`` had its first value), three runs: ``load`` ends within a second of
   the last child's completion - the child's ``finished_ms`` on the server against the task's
   ``end_date`` in the metadata database (the bound asserted is generous; the median printed).
"""

from __future__ import annotations

import json
import statistics
import sys
from datetime import datetime
from pathlib import Path

import pytest
from echomq_provider.flow_specs import parent_id_for

from echomq_core import EchoMQ

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = ROOT / "examples" / "airflow"
sys.path.insert(0, str(EXAMPLES))

from deployment import EXAMPLE_DAGS, Deployment  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.onlystandalone]

GATED, N = "echomq_stream_gated", 6


def test_a_follower_task_ends_with_the_fan_out_in_a_real_deployment(tmp_path: Path) -> None:
    markers, record = tmp_path / "markers", tmp_path / "record.jsonl"
    markers.mkdir()
    deployment = Deployment(
        [EXAMPLE_DAGS / "echomq_stream.py", HERE / "dags" / "echomq_stream_gated.py"],
        worker_app="worker_proc:HANDLERS",
        pythonpath=[HERE, EXAMPLES, ROOT],
        prefix="stream",
        env={"ECHOMQ_TEST_MARKERS": str(markers), "ECHOMQ_TEST_RECORD": str(record)},
    )
    try:
        deployment.start()
        with EchoMQ(deployment.echomq_url, prefix="stream") as mq:
            run_id = deployment.trigger("echomq_stream")
            assert deployment.wait_run("echomq_stream", run_id) == "success"
            got = deployment.xcom("echomq_stream", run_id, "load")
            assert sorted(got["order"]) == list(range(8))
            assert got["sum"] == sum(n * n for n in range(1, 9))
            parent = parent_id_for("echomq_stream", run_id, "fan_out")
            assert mq.snapshot("example.reports", parent).parent_state == "closed"

            lags = []
            for n in range(3):
                run_id = deployment.trigger(GATED, conf={"n": N, "run": f"r{n}"})
                deployment.wait_task(GATED, run_id, "load", ["running"])
                (markers / f"go-r{n}").touch()  # the children settle while load runs
                assert deployment.wait_run(GATED, run_id) == "success"
                parent = parent_id_for(GATED, run_id, "fan_out")
                jobs = [mq.get_job("example.square", f"{parent}.{i}") for i in range(N)]
                last_ms = max(job.finished_ms or 0 for job in jobs)
                ti = deployment.task_instance(GATED, run_id, "load")
                end_ms = datetime.fromisoformat(ti["end_date"]).timestamp() * 1000
                lags.append((end_ms - last_ms) / 1000)
                records = [json.loads(line) for line in record.read_text().splitlines()]
                got_at = min(r["at"] for r in records if r["run"] == f"r{n}")
                assert int(got_at * 1000) <= last_ms  # load had a value first (whole ms)
            print(f"load ended after the last child by {lags} s, median {statistics.median(lags)}")
            assert all(0 < lag < 5 for lag in lags) and statistics.median(lags) < 1.0, lags
    finally:
        deployment.stop()
        deployment.cleanup()
