"""W7: fan-out/fan-in of N trivial items inside the orchestrators, native vs EchoMQ.

::

    .venv/bin/python -m bench.orchestrators                        # everything (long)
    .venv/bin/python -m bench.orchestrators --only airflow --n 100 500 --runs 3
    .venv/bin/python -m bench.orchestrators --only dagster --budget 600 --json
    .venv/bin/python -m bench.orchestrators --out bench/results/w7/   # JSON + markdown there
    .venv/bin/python -m bench.orchestrators --cluster --shards 3 --n 200000 --skip-native

Four ways to do the same thing - ``plan`` makes N integers, each is doubled (the "work"),
``collect`` sums the results:

* **Airflow native**: ``collect(work.expand(item=plan()))`` (dynamic task mapping), in a real
  deployment (``examples/airflow/deployment.py``'s :class:`Deployment`: api-server, scheduler,
  dag-processor, triggerer as processes, LocalExecutor, SQLite), triggered through the REST
  API. Above ``[core] max_map_length`` (1,024 by default) the run is made once at the default
  and what fails, with what error, is recorded.
* **Airflow EchoMQ**: ``plan -> EchoFlowOperator -> EchoFlowSensor (deferrable) -> collect``
  (and two shorter ways: the operator waiting; ``@task.echo_flow``); the children run in an
  ``echomq worker`` process (same trivial work), ``collect`` reads the values page by page
  (``flow_results``).
* **Dagster native**: an op with ``DynamicOut`` yielding N ``DynamicOutput`` s,
  ``.map(work).collect()`` into ``collect``, run with ``dagster job execute`` (the default
  executor: multiprocess, one process per step).
* **Dagster EchoMQ**: an asset adding the flow with ``EchoMQResource`` (its output stored by
  ``EchoMQIOManager``), a downstream asset getting ``{child id: result}`` as its input;
  an ``echomq worker`` process runs the children; ``dagster job execute`` the same way.

Two baselines for each EchoMQ way (:mod:`bench.w7_report` computes both): its **plain twin**
``plain_<way>``, the same DAG or job shape without EchoMQ with every task run and the
doubling done in process, at the same N (interleaved run by run with the way); and the same
DAG or job with **0 items** (Airflow: an empty plan skips the fan-out; Dagster: the resource's
``fan_out(on_empty="empty")`` adds no flow and ``fan_in`` gets ``{}``; results from before it
used the plain job at 0 items, marked *). ``baseline`` is Airflow's ``plan -> collect`` and
the plain Dagster job, both with 0 items, the measure of the earlier results.

Figures per run: Airflow - the DAG run's ``end_date - start_date`` (the scheduler's clock) and
trigger-to-end (the REST POST to ``end_date``); Dagster - CLI start to exit, and the run's
start-to-end from the event log. Each run also keeps its **timeline** (where the time goes):
each task instance's scheduled / queued / start / end (Airflow's DB), each step's worker
start, STEP_START, input loads, handled outputs and STEP_SUCCESS (Dagster's event log) and,
for EchoMQ runs, the flow's parent row (created, released, closed) and the workers' busy
window: the first to the last completion time of the run's children, read from the server
(the child queue's ``completed`` index). A run past ``--budget`` seconds is stopped (Airflow:
the run is marked failed through the REST API; Dagster: the CLI's process group is killed)
and recorded as such. Figures only: nothing here asserts a time.

Where the EchoMQ ways run (:mod:`bench.w7_server`): one embedded standalone server, or with
``--cluster`` a real 3-master Cluster, the child queue in ``--shards`` K shards, ``--workers``
``echomq worker`` processes; the Airflow deployment, the Dagster runs, the workers and the Pump
all get the one URL. Every run records that setup, each master's server CPU over the run, the
children each shard completed, and whether the last step summed the right total.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "airflow"))

from bench.w7_report import markdown, table, twin  # noqa: E402
from bench.w7_server import (  # noqa: E402
    PARENT_QUEUE,
    PREFIX,
    WORK_QUEUE,
    W7Server,
    busy_window,
    cpu_delta,
    flow_times,
    masters_cpu,
    serve,
)
from echomq_core import Job  # noqa: E402

NATIVE_N = (100, 500, 2000, 20_000)
ECHOMQ_N = (*NATIVE_N, 200_000)
#: The EchoMQ ways in Airflow (DAG ``w7_<way>``): operator + sensor; the operator waiting
#: (``wait_for_completion``); ``@task.echo_flow`` planning, adding and waiting in one task.
AIRFLOW_ECHOMQ_WAYS = ("echomq", "echomq_wait", "echomq_task")
MAX_MAP_LENGTH = 1024  # Airflow's default [core] max_map_length
#: Each ``echomq worker`` process's concurrency (the deployment's default).
WORKER_CONCURRENCY = 4


def work(job: Job) -> int:
    """The EchoMQ workers' handler: the same trivial work as the native ``work`` task."""
    return int(job.payload) * 2


HANDLERS = {WORK_QUEUE: work}

AIRFLOW_DAGS = f'''
from datetime import datetime
from airflow.sdk import dag, task
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.results import flow_results
from echomq_provider.sensors.echo_flow import EchoFlowSensor

ARGS = dict(schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
            params={{"n": 100}}, max_active_runs=1)


@dag(dag_id="w7_native", **ARGS)
def w7_native():
    @task
    def plan(params=None):
        return list(range(params["n"]))

    @task
    def work(item):
        return item * 2

    @task
    def collect(values):
        return sum(values)

    collect(work.expand(item=plan()))


@dag(dag_id="w7_echomq", **ARGS)
def w7_echomq():
    @task
    def plan(params=None):
        return list(range(params["n"]))

    fan_out = EchoFlowOperator(task_id="fan_out", parent_queue="{PARENT_QUEUE}",
                               children=plan(), child_queue="{WORK_QUEUE}")
    wait = EchoFlowSensor(task_id="wait", flow=fan_out.output, deferrable=True,
                          poke_interval=1, timeout=3600)

    @task
    def collect(flow):
        return sum(value for _index, value in flow_results(flow))

    collect(wait.output)


@dag(dag_id="w7_echomq_wait", **ARGS)
def w7_echomq_wait():
    @task
    def plan(params=None):
        return list(range(params["n"]))

    fan_out = EchoFlowOperator(task_id="fan_out", parent_queue="{PARENT_QUEUE}",
                               children=plan(), child_queue="{WORK_QUEUE}",
                               wait_for_completion=True)

    @task
    def collect(flow):
        return sum(value for _index, value in flow_results(flow))

    collect(fan_out.output)


@dag(dag_id="w7_echomq_task", **ARGS)
def w7_echomq_task():
    @task.echo_flow(parent_queue="{PARENT_QUEUE}", child_queue="{WORK_QUEUE}",
                    wait_for_completion=True)
    def fan_out(params=None):
        return list(range(params["n"]))

    @task
    def collect(flow):
        return sum(value for _index, value in flow_results(flow))

    collect(fan_out())


@dag(dag_id="w7_baseline", **ARGS)
def w7_baseline():
    """The EchoMQ DAG without the fan-out (a flow needs a child; an empty plan skips)."""
    @task
    def plan(params=None):
        return list(range(params["n"]))

    @task
    def collect(values):
        return sum(values)

    collect(plan())


@dag(dag_id="w7_plain_echomq", **ARGS)
def w7_plain_echomq():
    """op + sensor's shape without EchoMQ: the work in fan_out's place, a pass-through wait."""
    @task
    def plan(params=None):
        return list(range(params["n"]))

    @task
    def fan_out(values):
        return [value * 2 for value in values]

    @task
    def wait():
        return None

    @task
    def collect(values):
        return sum(values)

    results = fan_out(plan())
    waited = wait()
    results >> waited >> collect(results)


@dag(dag_id="w7_plain_echomq_wait", **ARGS)
def w7_plain_echomq_wait():
    """The op-wait shape without EchoMQ: plan -> the work in one task -> collect."""
    @task
    def plan(params=None):
        return list(range(params["n"]))

    @task
    def fan_out(values):
        return [value * 2 for value in values]

    @task
    def collect(values):
        return sum(values)

    collect(fan_out(plan()))


@dag(dag_id="w7_plain_echomq_task", **ARGS)
def w7_plain_echomq_task():
    """The @task.echo_flow shape without EchoMQ: one task plans and does the work."""
    @task
    def fan_out(params=None):
        return [value * 2 for value in range(params["n"])]

    @task
    def collect(values):
        return sum(values)

    collect(fan_out())


w7_native()
w7_echomq()
w7_echomq_wait()
w7_echomq_task()
w7_baseline()
w7_plain_echomq()
w7_plain_echomq_wait()
w7_plain_echomq_task()
'''

DAGSTER_DEFS = f'''
import os
from typing import Any

from dagster import (DynamicOut, DynamicOutput, Definitions, EnvVar, asset,
                     define_asset_job, job, op)
from dagster_echomq import EchoMQIOManager, EchoMQResource

from echomq_core import Child


def n() -> int:
    return int(os.environ["W7_N"])


@op(out=DynamicOut())
def plan():
    for i in range(n()):
        yield DynamicOutput(i, mapping_key=str(i))


@op
def work(item: int) -> int:
    return item * 2


@op
def collect(values: list) -> int:
    return sum(values)


@job
def w7_native():
    collect(plan().map(work).collect())


@asset(io_manager_key="echomq_io")
def fan_out(context, echomq: EchoMQResource):
    """An empty plan (N = 0) adds no flow: fan_in gets {{}} (on_empty="empty")."""
    children = (Child(i, queue="{WORK_QUEUE}") for i in range(n()))  # as docs/dagster.md says
    yield from echomq.fan_out("{PARENT_QUEUE}", children, on_empty="empty",
                              parent_id=echomq.run_scoped_id(context))


@asset
def fan_in(fan_out: dict[str, Any]) -> int:
    return sum(fan_out.values())


@asset
def plain_fan_out() -> dict[str, int]:
    """fan_out's shape without EchoMQ: the N results, computed in process, as its output."""
    return {{str(i): i * 2 for i in range(n())}}


@asset
def plain_fan_in(plain_fan_out: dict[str, int]) -> int:
    return sum(plain_fan_out.values())


echomq = EchoMQResource(url=EnvVar("ECHOMQ_URL"), prefix="{PREFIX}")
defs = Definitions(
    assets=[fan_out, fan_in, plain_fan_out, plain_fan_in],
    jobs=[w7_native,
          define_asset_job("w7_echomq", selection=["fan_out", "fan_in"]),
          define_asset_job("w7_plain_echomq", selection=["plain_fan_out", "plain_fan_in"])],
    resources={{"echomq": echomq, "echomq_io": EchoMQIOManager.from_resource(echomq)}},
)
'''


# -- helpers -------------------------------------------------------------------------------
def ts(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def db_ts(text: str | None) -> float | None:
    """A time from Airflow's SQLite DB (naive UTC, as the DB stores them)."""
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def offset(moment: float | None, start: float) -> float | None:
    return None if moment is None else round(moment - start, 2)


#: A task instance's marks from the metadata DB, in the order of the query's columns.
DB_MARKS = ("scheduled", "queued", "start", "end")
#: Marks read from a task's log (its own process's clock): (label, event, first or last).
#: ``parsed``: the DAG file parsed in the task's process; ``executing``: the pre-execute
#: group closed, the operator's ``execute`` starts; ``returned``: it returned (post-execute:
#: the XCom push and the state report follow).
TASK_LOG_MARKS = (
    ("parsed", "Worker startup parse complete", 0),
    ("executing", "::endgroup::", 0),
    ("returned", "::group::Post Execute", 1),
)


def task_log_marks(home: Path, dag_id: str, run_id: str, task: str, start: float) -> dict[str, Any]:
    """A task's marks from its log's JSON lines (every attempt; a deferred task resumes in
    the same file, so ``returned`` is the last one)."""
    seen: dict[str, list[float]] = {}
    folder = home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task}"
    for path in sorted(folder.glob("attempt=*.log")):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
                event = json.loads(line)
                for label, text, _ in TASK_LOG_MARKS:
                    if event["event"] == text:
                        seen.setdefault(label, []).append(ts(event["timestamp"]) or 0.0)
    return {
        label: offset(seen[label][-1 if last else 0], start)
        for label, _, last in TASK_LOG_MARKS
        if label in seen
    }


def echomq_timeline(result: dict[str, Any], start: float) -> list[dict[str, Any]]:
    """The EchoMQ rows of a run's timeline: the flow (add to release; its close) and the
    children's completions, on the run's clock."""
    rows = []
    if result.get("flow_created"):
        rows.append({
            "step": "EchoMQ flow: created -> released",
            "marks": {"start": offset(result["flow_created"], start),
                      "end": offset(result.get("flow_released"), start)},
        })  # fmt: skip
    if result.get("flow_closed"):
        rows.append(
            {
                "step": "EchoMQ flow: closed",
                "marks": {"start": offset(result["flow_closed"], start)},
            }
        )
    if result.get("first_completed"):
        rows.append({
            "step": "EchoMQ children: first -> last completion",
            "marks": {"start": offset(result["first_completed"], start),
                      "end": offset(result["last_completed"], start)},
        })  # fmt: skip
    return rows


class Recorder:
    """Collects every run; writes the JSON after each one (a cut-short bench keeps its runs).
    Each run is stamped with :attr:`setup` (the server, the child queue's shards, the worker
    processes), so runs of several setups in one folder are never compared with each other."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.setup: dict[str, Any] = {}
        self.runs: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        if out is not None and (out / "results.json").exists():  # add to an earlier invocation
            old = json.loads((out / "results.json").read_text())
            self.runs, self.notes, self.started = old["runs"], old["notes"], old["started"]

    def add(self, run: dict[str, Any]) -> None:
        run.setdefault("setup", dict(self.setup))
        self.runs.append(run)
        print(json.dumps(run), flush=True)
        self.save()

    def note(self, text: str) -> None:
        self.notes.append(text)
        print("NOTE:", text, flush=True)
        self.save()

    def report(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "machine": f"{os.cpu_count()} cores",
            "runs": self.runs,
            "notes": self.notes,
            "table": table(self.runs),
        }

    def save(self) -> None:
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "results.json").write_text(json.dumps(self.report(), indent=2) + "\n")
        (self.out / "results.md").write_text(markdown(self.report()))


# -- Airflow -------------------------------------------------------------------------------
def airflow_run(
    dep: Any, rec: Recorder, way: str, n: int, budget: float, raised: int = 0
) -> dict[str, Any]:
    dag_id = f"w7_{way}"
    label = way if way != "native" or not raised else f"native, max_map_length {raised:,}"
    dep.wait_dag(dag_id)
    counted = way in AIRFLOW_ECHOMQ_WAYS and n > 0
    cpu_before = masters_cpu(dep.echomq_url) if counted else {}
    triggered = time.time()
    run_id = dep.trigger(dag_id, {"n": n})
    state = None
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        state = dep.run_state(dag_id, run_id)
        if state in ("success", "failed"):
            break
        time.sleep(1)
    else:
        state = "budget exceeded"
        with contextlib.suppress(Exception):
            dep.api("PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}", {"state": "failed"})
    run = dep.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}")
    start, end = ts(run.get("start_date")), ts(run.get("end_date"))
    tis = dep.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances?limit=100")
    with sqlite3.connect(dep.home / "airflow.db", timeout=60) as db:
        rows = db.execute(
            "SELECT task_id, state, COUNT(*) FROM task_instance WHERE dag_id = ? AND run_id = ? "
            "GROUP BY task_id, state",
            (dag_id, run_id),
        ).fetchall()
        spans = db.execute(
            "SELECT task_id, COUNT(*), MIN(scheduled_dttm), MIN(queued_dttm), MIN(start_date), "
            "MAX(end_date) FROM task_instance WHERE dag_id = ? AND run_id = ? GROUP BY task_id",
            (dag_id, run_id),
        ).fetchall()
    counts = {f"{task}:{ti_state}": int(count) for task, ti_state, count in rows}
    result: dict[str, Any] = {
        "system": "airflow",
        "way": label,
        "n": n,
        "run_id": run_id,
        "state": state,
        "wall_s": round(end - start, 2) if start and end else None,
        "end_to_end_s": round(end - triggered, 2) if end else None,
        "task_states": counts,
        "task_instances_total": tis.get("total_entries"),
    }
    if start:  # where the time goes: each task's marks (a mapped task: over its instances)
        result["timeline"] = [
            {"step": "REST trigger", "marks": {"start": round(triggered - start, 2)}},
            {"step": "DAG run", "marks": {"start": 0.0, "end": offset(end, start)}},
        ] + [
            {
                "step": task if count == 1 else f"{task} (x{count:,})",
                "marks": {
                    label: offset(db_ts(value), start)
                    for label, value in zip(DB_MARKS, marks, strict=True)
                },
            }
            for task, count, *marks in spans
        ]
        if way != "native":  # inside each task's process: its task log's own marks
            for entry in result["timeline"][2:]:
                entry["marks"].update(
                    task_log_marks(dep.home, dag_id, run_id, entry["step"], start)
                )
    if state == "budget exceeded":
        result["wall_s"] = result["end_to_end_s"] = None
        result["stopped_after_s"] = budget
    if counts.get("collect:success") and way != "native":  # what collect summed (its XCom)
        result.update(check_sum(way, n, dep.xcom(dag_id, run_id, "collect")))
    if counted and state == "success":
        result["server_cpu_s"] = cpu_delta(cpu_before, masters_cpu(dep.echomq_url))
        result.update(busy_window(dep.echomq_url, triggered))
        result.update(flow_times(dep.echomq_url, triggered))
        if start:
            result["timeline"] += echomq_timeline(result, start)
        with sqlite3.connect(dep.home / "airflow.db") as db:
            rows = db.execute(
                "SELECT task_id, SUM(LENGTH(value)) FROM xcom WHERE dag_id = ? AND run_id = ? "
                "GROUP BY task_id",
                (dag_id, run_id),
            ).fetchall()
        result["xcom_bytes_by_task"] = {t: int(s) for t, s in rows}
    if state != "success":
        result["errors"] = failure_lines(dep, dag_id, run_id)
        if rec.out is not None:  # everything that speaks of the run, to read afterwards
            result["logs"] = keep_logs(dep, run_id, rec.out)
    rec.add(result)
    return result


def check_sum(way: str, n: int, collected: Any) -> dict[str, Any]:
    """What the run's last step summed against what it must be: the doubled items (the
    baseline sums the plan itself)."""
    expected = n * (n - 1) // (2 if way == "baseline" else 1)
    return {"collected": collected, "sum_ok": collected == expected}


def keep_logs(dep: Any, run_id: str, out: Path) -> str:
    """The run's task and trigger logs, and the components' lines from its time, in one file
    under ``out/failures/``; returns its path relative to ``out``."""
    path = out / "failures" / f"{run_id.replace(':', '_').replace('+', '_')}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as dump:
        for log, text in dep.logs().items():
            if run_id in str(log):
                dump.write(f"==== {log}\n{text}\n")
            elif "logs" not in log.parts:  # a component's own log: its tail
                dump.write(f"==== {log} (last 400 lines)\n")
                dump.write("\n".join(text.splitlines()[-400:]) + "\n")
    return str(path.relative_to(out))


def failure_lines(dep: Any, dag_id: str, run_id: str) -> list[str]:
    """What failed, and why: the exceptions in the run's task logs (JSON lines)."""
    found = []
    for path, text in dep.logs().items():
        if run_id not in str(path):
            continue
        for line in text.splitlines():
            with contextlib.suppress(ValueError, TypeError, KeyError, IndexError):
                event = json.loads(line)
                for err in event.get("error_detail") or []:
                    found.append(
                        f"{event.get('task_id')}: {err['exc_type']}: {str(err['exc_value'])[:600]}"
                    )
    return sorted(set(found))[:20]


def bench_airflow(args: argparse.Namespace, rec: Recorder) -> None:
    dags = Path(tempfile.mkdtemp()) / "w7_dags.py"
    dags.write_text(AIRFLOW_DAGS)
    try:
        with serve(args.cluster, args.shards) as server:
            rec.setup = setup(server, args, pump="one echomq pump (the deployment's)")
            airflow_deployment(args, rec, dags, server)
    finally:
        shutil.rmtree(dags.parent, ignore_errors=True)


def setup(server: W7Server, args: argparse.Namespace, pump: str) -> dict[str, Any]:
    """What the runs ran on, as every run records it."""
    return {
        **server.describe(),
        "worker_processes": args.workers,
        "worker_concurrency": WORKER_CONCURRENCY,
        "pump": pump,
    }


def airflow_deployment(
    args: argparse.Namespace, rec: Recorder, dags: Path, server: W7Server
) -> None:
    from deployment import Deployment

    raised = args.max_map_length
    extra = {"AIRFLOW__CORE__MAX_MAP_LENGTH": str(raised)} if raised else {}
    dep = Deployment(
        [dags],
        worker_app="bench.orchestrators:HANDLERS",
        worker_queues=[WORK_QUEUE],
        pythonpath=[ROOT, ROOT / "examples" / "airflow"],
        prefix=PREFIX,
        echomq_url=server.url,
        env={
            "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD": "600",
            # The DAG file does not change during the bench: a re-parse every 30 s wrote to
            # SQLite while runs did, and a task's final state then waited up to 5 s for it.
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
            **extra,
        },
    )
    try:
        with dep:
            for i in range(2, args.workers + 1):  # the deployment starts the first
                dep.start_worker(f"worker-{i}", [WORK_QUEUE], WORKER_CONCURRENCY)
            airflow_runs(args, rec, dep, raised)
    finally:
        dep.cleanup()  # AIRFLOW_HOME: the metadata DB and every log


def airflow_runs(args: argparse.Namespace, rec: Recorder, dep: Any, raised: int) -> None:
    ways = [] if args.skip_echomq else args.ways
    plain = [] if args.skip_plain else [twin(way) for way in ways]
    every = ("baseline", "native", *AIRFLOW_ECHOMQ_WAYS, *(twin(w) for w in AIRFLOW_ECHOMQ_WAYS))
    for way in every:
        dep.wait_dag(f"w7_{way}", timeout=300)
    # A DAG's first run in a deployment is seconds slower (imports, first parse in the
    # worker): one run of each with 0 items first, not counted.
    warm = Recorder(None)
    for way in ["baseline", *([] if args.skip_native else ["native"]), *ways, *plain]:
        with contextlib.redirect_stdout(sys.stderr):
            run = airflow_run(dep, warm, way, 0, args.budget)
        rec.note(f"Airflow warm-up run of w7_{way} (0 items, not counted): {run['wall_s']} s")
    # EchoMQ first: the runs the goal is about
    for _ in range(args.baseline_runs if ways else 0):
        airflow_run(dep, rec, "baseline", 0, args.budget)
    for _ in range(args.zero_runs):  # the same DAG with 0 items: an empty plan skips
        for way in ways:
            airflow_run(dep, rec, way, 0, args.budget)
    for n in [n for n in args.n if n > 0]:
        for _ in range(runs_for(args, n)):  # interleaved, so load drifts hit every way alike
            for way in ways:
                if not args.skip_plain:
                    airflow_run(dep, rec, twin(way), n, args.budget)
                airflow_run(dep, rec, way, n, args.budget)
    if args.skip_native:
        return
    per_task = None
    medians: dict[int, float] = {}
    stopped = 0  # the N whose run was stopped at the budget: larger ones are not run
    for n in [n for n in (args.native_n or args.n) if 0 < n <= 20_000]:
        if stopped:
            rec.note(
                f"Airflow native N={n:,}"
                + (f" with max_map_length {raised:,}" if raised else "")
                + f": not run (N={stopped:,} did not finish within the "
                f"{args.budget:.0f} s budget)"
                + (
                    f"; estimated {args.per_task * n / 60:.0f} min from the measured "
                    f"{args.per_task:.2f} s per mapped task"
                    if args.per_task
                    else ""
                )
            )
            continue
        if n > MAX_MAP_LENGTH and not raised:
            run = airflow_run(dep, rec, "native", n, args.budget)
            note = (
                f"Airflow native N={n:,} at the default max_map_length {MAX_MAP_LENGTH}: "
                f"run {run['state']}; tasks {run['task_states']}; "
                + "; ".join(run.get("errors", []))
            )
            if per_task:
                est = per_task * n / 60
                note += (
                    f". With max_map_length raised: not run, estimated {est:.0f} min "
                    f"from the measured {per_task:.2f} s per mapped task (over the "
                    f"{args.budget:.0f} s budget)"
                    if est * 60 > args.budget
                    else f". With max_map_length raised (a separate deployment: "
                    f"--max-map-length): estimated {est:.1f} min"
                )
            rec.note(note)
            continue
        if raised and args.per_task and args.per_task * n > 2 * args.budget:
            rec.note(
                f"Airflow native N={n:,} with max_map_length {raised:,}: not run, estimated "
                f"{args.per_task * n / 60:.0f} min from the measured {args.per_task:.2f} s "
                f"per mapped task (over the {args.budget:.0f} s budget)"
            )
            continue
        done = []
        for i in range(runs_for(args, n)):
            run = airflow_run(dep, rec, "native", n, args.budget, raised)
            if run["state"] == "budget exceeded":
                stopped = n
            if run["state"] != "success":
                break
            done.append(run["wall_s"])
            if run["wall_s"] * (runs_for(args, n) - i - 1) > args.budget:
                break  # the rest would take longer than one budget: fewer runs at this N
        if done:
            medians[n] = statistics.median(done)
            per_task = marginal(medians)
            rec.note(f"Airflow native: {per_task:.3f} s per mapped task (up to N={n:,})")


def marginal(medians: dict[int, float]) -> float:
    """Seconds per item: the slope between the two largest Ns run (one N: wall / N)."""
    ns = sorted(medians)
    if len(ns) == 1:
        return medians[ns[0]] / ns[0]
    a, b = ns[-2], ns[-1]
    return max(medians[b] - medians[a], 0.0) / (b - a) or medians[b] / b


def runs_for(args: argparse.Namespace, n: int) -> int:
    return args.runs if n <= 20_000 else max(1, min(args.runs, args.big_runs))


# -- Dagster -------------------------------------------------------------------------------
def bench_dagster(args: argparse.Namespace, rec: Recorder) -> None:
    """On a Cluster the processes are the deployment's (``examples/dagster/Procfile``): the
    workers and an ``echomq pump``; on standalone the workers alone, as the earlier results
    ran (their own Pump and the resource's, while a step waits, deliver the signals)."""
    with serve(args.cluster, args.shards) as server:
        pump = "one echomq pump (the Procfile's)" if args.cluster else "none (the workers' own)"
        rec.setup = setup(server, args, pump=pump)
        if args.dagster_python != sys.executable:
            rec.setup["python"] = python_env(args.dagster_python)
        dagster_bench(args, rec, server)


def python_env(python: str) -> str:
    """What a Dagster run's interpreter has that its step processes' start-up depends on."""
    probe = (
        "import importlib.util as u; print(','.join(m for m in ('airflow', 'opentelemetry.sdk')"
        " if u.find_spec(m.split('.')[0]) and u.find_spec(m)))"
    )
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True)
    has = found.stdout.strip()
    return f"{python} (with {has})" if has else f"{python} (no Airflow, no OpenTelemetry SDK)"


def dagster_bench(args: argparse.Namespace, rec: Recorder, server: W7Server) -> None:
    home = Path(tempfile.mkdtemp(prefix="w7-dagster-"))
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    defs = home / "w7_defs.py"
    defs.write_text(DAGSTER_DEFS)
    env = dict(
        os.environ,
        W7_DAGSTER_PYTHON=args.dagster_python,
        DAGSTER_HOME=str(home),
        ECHOMQ_URL=server.url,
        ECHOMQ_PREFIX=PREFIX,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
    )
    worker = [sys.executable, "-m", "echomq_core.cli", "worker", WORK_QUEUE, "--app",
              "bench.orchestrators:HANDLERS", "--concurrency", str(WORKER_CONCURRENCY)]  # fmt: skip
    commands = {f"worker-{i}": worker for i in range(1, args.workers + 1)}
    if args.cluster:
        commands["pump"] = [sys.executable, "-m", "echomq_core.cli", "pump"]
    procs = [
        subprocess.Popen(
            command,
            env=env,
            stdout=open(home / f"{name}.log", "ab"),  # noqa: SIM115 - the process owns it
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for name, command in commands.items()
    ]
    try:
        # the instance's first run creates its storage: one uncounted run first
        with contextlib.redirect_stdout(sys.stderr):
            run = dagster_run(home, defs, env, Recorder(None), "baseline", 0, args.budget)
        rec.note(
            f"Dagster warm-up run of w7_plain_echomq (0 items, not counted): {run['wall_s']} s"
        )
        for _ in range(0 if args.skip_echomq else args.baseline_runs):
            dagster_run(home, defs, env, rec, "baseline", 0, args.budget)
        for _ in range(0 if args.skip_echomq else args.zero_runs):
            run = dagster_run(home, defs, env, rec, "echomq", 0, args.budget)
            if run["state"] != "success":  # an empty plan refused: once is enough to say so
                rec.note(
                    "Dagster w7_echomq with 0 items: "
                    + (run.get("step_errors") or run.get("errors") or [run["state"]])[0][:300]
                )
                break
        for n in [n for n in args.n if n > 0 and not args.skip_echomq]:
            for _ in range(runs_for(args, n)):  # interleaved with the plain twin
                if not args.skip_plain:
                    dagster_run(home, defs, env, rec, "plain_echomq", n, args.budget)
                dagster_run(home, defs, env, rec, "echomq", n, args.budget)
        if args.skip_native:
            return
        per_step = None
        medians: dict[int, float] = {}
        stopped = 0
        for n in [n for n in (args.native_n or args.n) if 0 < n <= 20_000]:
            # an N estimated at over twice the budget is not run; one near it runs (and is
            # stopped at the budget if it gets there)
            if stopped or (per_step and per_step * n > 2 * args.budget):
                why = (
                    f"N={stopped:,} did not finish within the {args.budget:.0f} s budget"
                    if stopped
                    else f"over twice the {args.budget:.0f} s budget"
                )
                est = (
                    f"; estimated {per_step * n / 60:.0f} min from the measured "
                    f"{per_step:.2f} s per mapped step"
                    if per_step
                    else ""
                )
                rec.note(f"Dagster native N={n:,}: not run ({why}){est}")
                continue
            done = []
            for _ in range(runs_for(args, n)):
                run = dagster_run(home, defs, env, rec, "native", n, args.budget)
                if run["state"] == "budget exceeded":
                    stopped = n
                if run["state"] != "success":
                    break
                done.append(run["end_to_end_s"])
                if run["end_to_end_s"] * (runs_for(args, n) - len(done)) > args.budget:
                    break  # the rest would take longer than one budget: fewer runs at this N
            if not done:
                continue
            medians[n] = statistics.median(done)
            per_step = marginal(medians)
            rec.note(f"Dagster native: {per_step:.3f} s per mapped step (up to N={n:,})")
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)


def dagster_run(
    home: Path, defs: Path, env: dict[str, str], rec: Recorder, way: str, n: int, budget: float
) -> dict[str, Any]:
    job = {"baseline": "w7_plain_echomq"}.get(way, f"w7_{way}")
    python = env.get("W7_DAGSTER_PYTHON", sys.executable)
    command = [python, "-m", "dagster", "job", "execute", "-f", str(defs), "-j", job]
    counted = way == "echomq" and n > 0
    cpu_before = masters_cpu(env["ECHOMQ_URL"]) if counted else {}
    started = time.time()
    log = home / f"cli-{job}-{n}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command,
            env=dict(env, W7_N=str(n)),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=home,
        )
        try:
            code: int | None = proc.wait(budget)
        except subprocess.TimeoutExpired:
            code = None
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    ended = time.time()
    result: dict[str, Any] = {
        "system": "dagster",
        "way": way,
        "n": n,
        "state": "success" if code == 0 else ("budget exceeded" if code is None else "failed"),
        "end_to_end_s": round(ended - started, 2),
        "wall_s": None,
    }
    stats = run_stats(env)
    events = stats.pop("events", {})
    if stats.get("run_start"):
        if code == 0 and stats.get("run_end"):
            result["wall_s"] = round(stats["run_end"] - stats["run_start"], 2)
        result["timeline"] = dagster_timeline(events, stats, (started, ended))
    result.update(stats)
    if code is None:
        result["end_to_end_s"] = None
        result["stopped_after_s"] = budget
    if code == 0 and way != "native":  # what the last asset summed, from its stored output
        last = {"echomq": "fan_in"}.get(way, "plain_fan_in")
        result.update(check_sum(way, n, stored_output(home, last)))
    if counted and code == 0:
        result["server_cpu_s"] = cpu_delta(cpu_before, masters_cpu(env["ECHOMQ_URL"]))
        result.update(busy_window(env["ECHOMQ_URL"], started))
        result.update(flow_times(env["ECHOMQ_URL"], started))
        if stats.get("run_start"):
            result["timeline"] += echomq_timeline(result, stats["run_start"])
    if code != 0:
        tail = log.read_text(errors="replace").splitlines()
        result["errors"] = [line[:400] for line in tail if "rror" in line][-10:]
    rec.add(result)
    return result


def stored_output(home: Path, asset: str) -> Any:
    """An asset's last output as the default IO manager stored it (a pickle under the
    instance's ``storage/``); None if there is none."""
    try:
        return pickle.loads((home / "storage" / asset).read_bytes())
    except FileNotFoundError:
        return None


#: Run in a fresh process (the CLI's instance, not this one's): the latest run's id, status,
#: start/end, the first and last time of each (step, event type) in its event log, and the
#: failed steps' errors.
RUN_STATS = """
import json
from dagster import DagsterInstance
i = DagsterInstance.get()
r = i.get_runs(limit=1)[0]
s = i.get_run_stats(r.run_id)
events, errors = {}, []
for e in i.all_logs(r.run_id):
    if e.dagster_event is None:
        continue
    kind = e.dagster_event.event_type_value
    span = events.setdefault(e.step_key or "", {}).setdefault(kind, [e.timestamp, e.timestamp])
    span[0], span[1] = min(span[0], e.timestamp), max(span[1], e.timestamp)
    if kind == "STEP_FAILURE":
        error = getattr(e.dagster_event.event_specific_data, "error", None)
        while getattr(error, "cause", None) is not None:  # the user code's own error
            error = error.cause
        errors.append(f"{e.step_key}: {getattr(error, 'message', '')}".strip()[:600])
print(json.dumps({'dagster_run_id': r.run_id, 'dagster_status': r.status.value,
    'run_start': s.start_time, 'run_end': s.end_time, 'steps_succeeded': s.steps_succeeded,
    'steps_failed': s.steps_failed, 'events': events, 'step_errors': errors}))
"""

#: A Dagster step's marks: (label, event type, first or last of that type).
STEP_MARKS = (
    ("launched", "STEP_WORKER_STARTING", 0),
    ("resources", "RESOURCE_INIT_STARTED", 0),
    ("resources ready", "RESOURCE_INIT_SUCCESS", 1),
    ("start", "STEP_START", 0),
    ("inputs loaded", "LOADED_INPUT", 1),
    ("output handled", "HANDLED_OUTPUT", 1),
    ("end", "STEP_SUCCESS", 1),
)


def dagster_timeline(
    events: dict[str, dict[str, list[float]]], stats: dict[str, Any], cli: tuple[float, float]
) -> list[dict[str, Any]]:
    """The CLI process, the run and each step, from the event log (offsets from RUN_START)."""
    start = stats["run_start"]
    rows: list[dict[str, Any]] = [
        {"step": "CLI process", "marks": {"start": offset(cli[0], start),
                                          "end": offset(cli[1], start)}},
        {"step": "run", "marks": {"start": 0.0, "end": offset(stats.get("run_end"), start)}},
    ]  # fmt: skip
    groups: dict[str, dict[str, list[float]]] = {}  # a mapped step's copies as one row
    counts: dict[str, int] = {}
    for step, kinds in events.items():
        if not step:
            continue
        name = step.split("[", 1)[0]
        counts[name] = counts.get(name, 0) + 1
        group = groups.setdefault(name, {})
        for kind, (first, last) in kinds.items():
            span = group.setdefault(kind, [first, last])
            span[0], span[1] = min(span[0], first), max(span[1], last)
    for name, kinds in groups.items():
        marks = {
            label: offset(kinds[kind][which], start)
            for label, kind, which in STEP_MARKS
            if kind in kinds
        }
        if "launched" not in marks:  # an in-process executor: the step's first event
            marks["launched"] = offset(min(span[0] for span in kinds.values()), start)
        step = name if counts[name] == 1 else f"{name} (x{counts[name]:,})"
        rows.append({"step": step, "marks": marks})
    return rows


def run_stats(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [env.get("W7_DAGSTER_PYTHON", sys.executable), "-c", RUN_STATS],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return {"run_stats_error": done.stderr[-500:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# -- main ------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=None, help="Ns (default: all)")
    parser.add_argument("--runs", type=int, default=3, help="runs per N (up to 20,000)")
    parser.add_argument("--big-runs", type=int, default=2, help="runs at N above 20,000")
    parser.add_argument("--only", choices=("airflow", "dagster"), default=None)
    parser.add_argument("--budget", type=float, default=600.0, help="seconds per run at most")
    parser.add_argument("--baseline-runs", type=int, default=5, help="runs of the baseline")
    parser.add_argument(
        "--zero-runs",
        type=int,
        default=3,
        help="Airflow: runs of each EchoMQ DAG with 0 items (the same DAG, nothing fanned out)",
    )
    parser.add_argument(
        "--ways",
        nargs="+",
        choices=AIRFLOW_ECHOMQ_WAYS,
        default=list(AIRFLOW_ECHOMQ_WAYS),
        help="Airflow: the EchoMQ DAGs to run (default: all)",
    )
    parser.add_argument(
        "--skip-plain",
        action="store_true",
        help="no runs of the plain twins (each EchoMQ way's DAG/job shape without EchoMQ)",
    )
    parser.add_argument(
        "--native-n", type=int, nargs="+", default=None, help="Ns of the native runs (--n)"
    )
    parser.add_argument("--skip-native", action="store_true", help="EchoMQ runs only")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="run on a real 3-master Cluster (tests/clusterkit.py) instead of standalone",
    )
    parser.add_argument(
        "--shards", type=int, default=1, help="shards of the child queue (set_shards; default 1)"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help=f"echomq worker processes (each at concurrency "
        f"{WORKER_CONCURRENCY}; default 1)"
    )  # fmt: skip
    parser.add_argument("--skip-echomq", action="store_true", help="native runs only")
    parser.add_argument(
        "--max-map-length",
        type=int,
        default=0,
        help="Airflow: raise [core] max_map_length (a separate deployment; native runs)",
    )
    parser.add_argument(
        "--per-task",
        type=float,
        default=None,
        help="Airflow: seconds per mapped task measured before; with --max-map-length, an "
        "N whose estimate exceeds the budget is not run",
    )
    parser.add_argument(
        "--dagster-python",
        default=sys.executable,
        help="Dagster: the interpreter of `dagster job execute` and so of its step processes "
        "(bench/dagster_only_venv.sh makes one without Airflow; default: this one)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--out", type=Path, default=None, help="write results.json/.md here")
    args = parser.parse_args()
    args.n_given = args.n is not None
    args.n = sorted(args.n if args.n is not None else set(ECHOMQ_N))
    # SIGTERM unwinds like Ctrl-C, so every process started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rec = Recorder(args.out)
    if args.only in (None, "airflow"):
        bench_airflow(args, rec)
    if args.only in (None, "dagster"):
        bench_dagster(args, rec)
    report = rec.report()
    print(json.dumps(report, indent=2) if args.json else markdown(report))


if __name__ == "__main__":
    main()
