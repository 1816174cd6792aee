"""The Dagster stack users run in production: PostgreSQL storage (``dagster-postgres``), the
daemon with the queued run coordinator (at most 2 runs at once), the webserver, and the
example's definitions as a code location in a ``dagster code-server`` process of its own;
EchoMQ's workers and a long-lived ``echomq pump`` beside them. Every component is its own
process, each in its own session, killed with its group at the end.

Stories, driven through the GraphQL API as the UI is:

* the example's sensor launches exactly one run per flow added outside Dagster (the runs
  queued by the coordinator and dequeued by the daemon), each reads and closes its flow; a run
  terminated while it waits ends CANCELED and the daemon's run-status sensor cancels its flow
  (the same stories as the ``dagster dev`` test, :mod:`test_dagster_deployment`);
* a second code location (``run_jobs.py``, a code server of its own): a run whose fan-out step
  fails after adding its flow; the daemon's cancel sensor cancels the flow; re-executed from
  failure (a new run id, the root run in its tag), the run repairs that same flow and the
  completed children do not run again (as :mod:`test_dagster_dev_runs` does under
  ``dagster dev``);
* a backfill of 10 daily partitions (single-run policy: one run) is launched while no EchoMQ
  worker runs, so its run holds its 10 flows open; the daemon is killed (SIGKILL, its whole
  group) and started again, then the workers: the backfill completes with one run, one flow
  per day, each read and closed - none added twice (a second run would add its own
  run-scoped flows).

"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dagster_support import EXAMPLE_DIR, ROOT, WORKER_PROC, client_url
from deploy_support import GraphQL, free_port, location_loaded, poll, signal_group
from test_dagster_deployment import LOCATION, REPORTS, backfill, sensor_and_terminate
from test_dagster_dev_runs import reexecuted_from_failure

from echomq_core import EchoMQ
from tests.airflow.postgres import Postgres, available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.onlystandalone,
    pytest.mark.production,
    pytest.mark.timeout(900),  # a whole stack and three stories: past the suite's 300 s
    pytest.mark.skipif(not available(), reason="needs Debian's postgresql-15"),
]

BIN = Path(sys.executable).parent
RUNS_DEFS = ROOT / "tests" / "dagster" / "run_jobs.py"
RUNS_LOCATION = "run_jobs.py"  # as test_dagster_dev_runs's selectors name it
DONE, LATER = "rj-done", "rj-later"  # run_jobs.py's child queues
LOCATIONS = """{ repositoriesOrError { ... on RepositoryConnection {
  nodes { location { name } } } } }"""


def locations(gql: GraphQL) -> set[str]:
    nodes = gql(LOCATIONS)["repositoriesOrError"].get("nodes") or []
    return {n["location"]["name"] for n in nodes}


DAYS = [f"2026-11-{d:02d}" for d in range(1, 11)]
BACKFILL_RUNS = """query($id: String!) {
  runsOrError(filter: {tags: [{key: "dagster/backfill", value: $id}]}) {
    ... on Runs { results { runId status } }
  }
}"""


def instance_yaml(pg: Postgres) -> str:
    return f"""storage:
  postgres:
    postgres_url: "postgresql+psycopg2://airflow@127.0.0.1:{pg.port}/airflow"
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    max_concurrent_runs: 2
telemetry:
  enabled: false
"""


def test_dagster_on_postgres_with_its_daemon_and_a_code_server(
    backend: Any,
    prefix: str,
    proc_env: dict[str, str],
    group_spawn: Callable[..., subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    url = client_url(backend)
    with Postgres() as pg:
        home = tmp_path / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text(instance_yaml(pg))
        code_port, runs_port, web_port = free_port(), free_port(), free_port()
        workspace = tmp_path / "workspace.yaml"
        workspace.write_text(
            "load_from:\n"
            + "".join(
                f"  - grpc_server:\n      host: 127.0.0.1\n      port: {port}\n"
                f"      location_name: {name}\n"
                for port, name in ((code_port, LOCATION), (runs_port, RUNS_LOCATION))
            )
        )
        marker, record = tmp_path / "fixed", tmp_path / "ran.txt"
        env = {
            **proc_env,
            "ECHOMQ_URL": url,
            "ECHOMQ_PREFIX": prefix,
            "ECHOMQ_EXAMPLE_N": "5",
            "ECHOMQ_SENSOR_INTERVAL": "5",
            "DAGSTER_HOME": str(home),
            "ECHOMQ_RUNS_URL": url,  # run_jobs.py's settings
            "ECHOMQ_RUNS_PREFIX": prefix,
            "ECHOMQ_RUNS_MARKER": str(marker),
            "ECHOMQ_RUNS_RECORD": str(record),
        }
        names = ("code-server", "webserver", "daemon", "workers", "pump", "daemon-2", "workers-2",
                 "runs-code-server", "done-worker", "later-worker")  # fmt: skip
        logs = [tmp_path / f"{n}.log" for n in names]
        workers = [sys.executable, str(EXAMPLE_DIR / "workers.py")]
        daemon = [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)]
        group_spawn(
            [str(BIN / "dagster"), "code-server", "start", "-h", "127.0.0.1", "-p",
             str(code_port), "-f", str(EXAMPLE_DIR / "definitions.py"), "--location-name",
             LOCATION],
            env, logs[0],
        )  # fmt: skip
        group_spawn(
            [str(BIN / "dagster"), "code-server", "start", "-h", "127.0.0.1", "-p",
             str(runs_port), "-f", str(RUNS_DEFS), "--location-name", RUNS_LOCATION],
            env, logs[7],
        )  # fmt: skip
        group_spawn([sys.executable, str(WORKER_PROC), url, prefix, DONE], env, logs[8])
        group_spawn(
            [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(web_port), "-w",
             str(workspace)],
            env, logs[1],
        )  # fmt: skip
        first_daemon = group_spawn(daemon, env, logs[2])
        first_workers = group_spawn(workers, env, logs[3])
        group_spawn([str(BIN / "echomq"), "pump", "--url", url, "--prefix", prefix], env, logs[4])
        gql = GraphQL(web_port)
        poll(
            "the webserver and both code servers' locations",
            lambda: location_loaded(gql) and locations(gql) >= {LOCATION, RUNS_LOCATION},
            240,
            logs,
        )

        mq = EchoMQ(url, prefix=prefix)
        try:
            sensor_and_terminate(gql, mq, logs)
            later = [sys.executable, str(WORKER_PROC), url, prefix, LATER]
            reexecuted_from_failure(
                gql, mq, logs, marker, record, lambda: group_spawn(later, env, logs[9])
            )

            # -- the backfill's run holds its flows; the daemon dies and comes back -------
            signal_group(first_workers, signal.SIGTERM)  # no child runs until the restart
            first_workers.wait(60)

            launched: list[str] = []
            timed: dict[str, float] = {}

            def kill_the_daemon(backfill_id: str) -> None:
                launched.append(backfill_id)

                def held() -> bool:
                    runs = gql(BACKFILL_RUNS, id=backfill_id)["runsOrError"]["results"]
                    days = [
                        f for f in mq.list_flows(REPORTS, "held") if ".day_numbers." in f.parent_id
                    ]
                    return bool(runs) and runs[0]["status"] == "STARTED" and len(days) == len(DAYS)

                poll("the backfill's run holding its 10 flows", held, 300, logs)
                signal_group(first_daemon, signal.SIGKILL)
                first_daemon.wait(30)
                group_spawn(daemon, env, logs[5])
                group_spawn(workers, env, logs[6])
                timed["restarted"] = time.monotonic()

            backfill(gql, mq, logs, DAYS, during=kill_the_daemon)
            runs = gql(BACKFILL_RUNS, id=launched[0])["runsOrError"]["results"]
            assert [r["status"] for r in runs] == ["SUCCESS"], runs  # one run, not relaunched
            assert mq.list_flows(REPORTS, "held") == []
            done = time.monotonic() - timed["restarted"]
            print(json.dumps({"daemon_restart_to_backfill_complete_s": round(done, 1)}))
        finally:
            mq.close()
