"""A whole Airflow + EchoMQ deployment on one machine, from one script.

::

    python examples/airflow/deployment.py            # start everything, run the example DAG, stop

What runs where (docs/airflow.md, "Deploying with Airflow", says the same):

==================  =========================================================================
process             does
==================  =========================================================================
``echomq server``   the Redis-protocol server (any Redis 7+ / Valkey 8+ in production)
``airflow           the REST API and UI, and the Task Execution API the workers and the
api-server``        triggerer talk to
``airflow           schedules DAG runs; with LocalExecutor it also runs the tasks
scheduler``         (``EchoFlowOperator`` adds the flow, ``EchoFlowSensor`` waits)
``airflow           parses the DAG files
dag-processor``
``airflow           runs deferred sensors' ``EchoFlowTrigger`` s: one event loop polls every
triggerer``         waiting flow (one cheap read each, at least once a second)
``echomq worker``   runs the children: the handlers of their queues (any host, any number)
``echomq pump``     delivers completions across queues (children in other queues than their
                    parent), promotes retries, recovers expired leases, applies retention
==================  =========================================================================

:class:`Deployment` starts them as child processes with their own ``AIRFLOW_HOME`` (SQLite,
LocalExecutor, free ports), talks to the REST API v2 (trigger, clear, read states and XComs)
and stops every process it started - also when something fails. ``tests/airflow/
test_deployment.py`` drives the same class.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from echomq_core.server import EmbeddedServer, free_port
from echomq_core.wire.targets import parse_url

HERE = Path(__file__).resolve().parent
EXAMPLE_DAGS = HERE.parents[1] / "airflow_provider" / "echomq_provider" / "example_dags"
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


def hostname() -> str:
    """Airflow's ``[core] hostname_callable`` in a deployment: the component's name (set by
    :meth:`Deployment._spawn`), else the machine's."""
    return os.environ.get("ECHOMQ_DEPLOY_HOST") or socket.getfqdn()


class DeploymentError(RuntimeError):
    """Raised when a component does not start or a bounded wait runs out."""


class Deployment:
    """Airflow's four components, an EchoMQ server, workers and a Pump, as processes.

    :param dags: DAG files to copy into the DAGs folder.
    :param worker_app: ``module:object`` of the workers' handlers (``echomq worker --app``).
    :param worker_queues: the queues the worker serves.
    :param pythonpath: extra import paths for every process (where ``worker_app`` lives).
    :param env: more environment for every process.
    :param database: the metadata database's SQLAlchemy URL (PostgreSQL in production); None:
        SQLite in the deployment's home.
    :param executor: ``LocalExecutor`` (tasks run under the scheduler) or ``CeleryExecutor``
        (tasks run in ``celery_workers`` worker processes; their broker is a Redis-protocol
        server of its own, not EchoMQ's, so a broker outage is no EchoMQ outage).
    :param replicas: how many of each component run, e.g. ``{"scheduler": 2, "triggerer": 2}``
        (the second is ``scheduler-2``, ...); 1 each by default.
    :param echomq_url: an EchoMQ server the deployment uses but does not start or stop (a
        Cluster: ``redis+cluster://host:port``); every component, worker and the Pump get it
        (the ``echomq_default`` connection with ``cluster=true`` for a Cluster). None: the
        deployment's own server.
    """

    def __init__(
        self,
        dags: Iterable[Path],
        *,
        worker_app: str = "echomq_worker:HANDLERS",
        worker_queues: Sequence[str] = ("example.square", "example.cube"),
        pythonpath: Sequence[Path] = (HERE,),
        prefix: str = "example",
        env: dict[str, str] | None = None,
        database: str | None = None,
        executor: str = "LocalExecutor",
        celery_workers: int = 2,
        replicas: dict[str, int] | None = None,
        echomq_url: str | None = None,
    ) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="echomq-deploy-"))
        #: in every component's environment (and so its tasks'): what :meth:`stop` ends
        self.id = self.home.name
        self.database = database
        self.executor = executor
        self.celery_workers = celery_workers if executor == "CeleryExecutor" else 0
        self.replicas = {name: 1 for name in COMPONENTS} | dict(replicas or {})
        self.broker = EmbeddedServer() if self.celery_workers else None
        self.dags = list(dags)
        self.worker_app = worker_app
        self.worker_queues = list(worker_queues)
        self.prefix = prefix
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = EmbeddedServer()
        self.external_url = echomq_url
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._commands: dict[str, list[str]] = {}
        self._token: str | None = None
        path = [str(p) for p in pythonpath] + [os.environ.get("PYTHONPATH", "")]
        self.env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, path)),
            AIRFLOW_HOME=str(self.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(self.home / "dags"),
            AIRFLOW__CORE__EXECUTOR=executor,
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{self.base}/execution/",
            AIRFLOW__CORE__PARALLELISM="8",
            # SQLite serialises writers: wait up to 60 s for the lock instead of failing at 5
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=(
                database or f"sqlite:///{self.home}/airflow.db?timeout=60"
            ),
            AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__API__BASE_URL=self.base,
            AIRFLOW__API__WORKERS="1",
            AIRFLOW__API_AUTH__JWT_SECRET="echomq-deployment-example-" + "0123456789abcdef" * 4,
            AIRFLOW__LOGGING__BASE_LOG_FOLDER=str(self.home / "logs"),
            # the log servers of the scheduler and the triggerer: free ports, so that several
            # deployments (and other Airflows) can run on one machine
            AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
            # the scheduler notices new runs, finished triggers and cleared tasks quickly
            AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="5",
            AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC="1",
        )
        if self.celery_workers or any(n > 1 for n in self.replicas.values()):
            # several of a component: each its own Airflow hostname, so the job table tells
            # them apart (one of each keeps the machine's)
            self.env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] = "deployment.hostname"
        self.env.pop("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", None)
        self.env.update(env or {})

    # -- life -----------------------------------------------------------------------------
    def __enter__(self) -> Deployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def echomq_url(self) -> str:
        return self.external_url or f"{self.server.url}/0"

    def _connection_uri(self) -> str:
        """``echomq_default`` as a URI: the server's address (and credentials), database 0 or
        ``cluster=true`` (a Cluster has no database number), the prefix."""
        target = parse_url(self.echomq_url)
        where = urlsplit(self.echomq_url).netloc
        if target.cluster:
            return f"echomq://{where}?prefix={self.prefix}&cluster=true"
        db = urlsplit(self.echomq_url).path.strip("/") or "0"
        return f"echomq://{where}/{db}?prefix={self.prefix}"

    def start(self, timeout: float = 180.0) -> None:
        """Start everything; return once the API reports every component healthy."""
        if self.external_url is None:
            self.server.start()
        (self.home / "dags").mkdir(parents=True)
        for dag in self.dags:
            shutil.copy(dag, self.home / "dags" / dag.name)
        self.env["AIRFLOW_CONN_ECHOMQ_DEFAULT"] = self._connection_uri()
        self.env["ECHOMQ_URL"] = self.echomq_url
        self.env["ECHOMQ_PREFIX"] = self.prefix
        if self.broker is not None:
            self.broker.start()
            self.env["AIRFLOW__CELERY__BROKER_URL"] = f"{self.broker.url}/0"
            self.env["AIRFLOW__CELERY__RESULT_BACKEND"] = "db+" + str(self.database)
        self.airflow("db", "migrate")
        for name in COMPONENTS:
            for n in range(1, self.replicas.get(name, 1) + 1):
                label = name if n == 1 else f"{name}-{n}"
                self._spawn(label, [sys.executable, "-m", "airflow", name])
        for n in range(1, self.celery_workers + 1):
            command = [sys.executable, "-m", "airflow", "celery", "worker", "--concurrency", "8"]
            self._spawn(f"celery-worker-{n}", [*command, "--celery-hostname", f"w{n}@%h"])
        self.start_worker("worker", self.worker_queues)
        self._spawn("pump", [sys.executable, "-m", "echomq_core.cli", "pump"])
        self.wait_for(self._healthy, timeout, "every Airflow component healthy")

    def start_worker(self, name: str, queues: Sequence[str], concurrency: int = 4) -> None:
        """An ``echomq worker`` process for ``queues`` (its log: ``<name>.log``)."""
        command = [sys.executable, "-m", "echomq_core.cli", "worker", *queues]
        self._spawn(name, [*command, "--app", self.worker_app, "--concurrency", str(concurrency)])

    def stop(self) -> None:
        """Stop every process started (SIGTERM, then SIGKILL), then the server."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
            else:  # the component is gone; end whatever it left in its process group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        self._kill_strays()
        self.server.stop()
        if self.broker is not None:
            self.broker.stop()

    def kill(self, name: str) -> None:
        """SIGKILL process ``name`` and everything in its process group (a host lost); it is
        no longer one of the processes that must stay up (until :meth:`restart`)."""
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self._kill_strays(name)

    def _kill_strays(self, host: str | None = None) -> None:
        """SIGKILL what this deployment's components started in sessions of their own (Airflow
        3 runs each task in a new session: killing a Celery worker's group leaves its running
        tasks), found by the environment they inherit; of component ``host`` only, or all."""
        mark = f"ECHOMQ_DEPLOY_ID={self.id}".encode()
        own = f"ECHOMQ_DEPLOY_HOST={host}".encode() if host else None
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue
            if mark in environ and (own is None or own in environ):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry), signal.SIGKILL)

    def pause(self, name: str) -> None:
        """SIGSTOP component ``name``'s process group at a moment it holds no write lock on
        the SQLite metadata database: the stop is sent while this process holds the write lock
        itself (``BEGIN IMMEDIATE``; Airflow runs SQLite in WAL mode, where readers take no
        lock a writer waits on), so a component stopped in the middle of a write transaction
        cannot hold every other component's writes up. :meth:`resume` continues it."""
        proc = self.procs[name]
        if self.database is not None:
            os.killpg(proc.pid, signal.SIGSTOP)
            return
        with contextlib.closing(sqlite3.connect(self.home / "airflow.db", timeout=60)) as db:
            db.isolation_level = None  # the transaction is ours to begin and end
            db.execute("BEGIN IMMEDIATE")
            try:
                os.killpg(proc.pid, signal.SIGSTOP)
            finally:
                db.execute("ROLLBACK")

    def resume(self, name: str) -> None:
        """Continue a component :meth:`pause` stopped."""
        os.killpg(self.procs[name].pid, signal.SIGCONT)

    def restart(self, name: str) -> None:
        """Start process ``name`` again, as it was started (its log goes on)."""
        self._spawn(name, self._commands[name])

    def cleanup(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    def _spawn(self, name: str, command: list[str]) -> None:
        """Start ``command`` as process ``name``: its own log, its own process group, its name
        as its Airflow hostname (so the ``job`` table tells two triggerers apart: see
        :func:`hostname`) and, for a second replica, its own log server port."""
        self._commands[name] = command
        env = dict(self.env, ECHOMQ_DEPLOY_HOST=name, ECHOMQ_DEPLOY_ID=self.id)
        if name not in COMPONENTS:  # a replica or a Celery worker serves its logs elsewhere
            env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(free_port())
            env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"] = str(free_port())
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - the process owns it
        self.procs[name] = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def airflow(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise DeploymentError(f"airflow {' '.join(args)}: {done.stderr[-2000:]}")
        return done.stdout

    def logs(self) -> dict[Path, str]:
        """Every log: the components' and the tasks' (path -> text)."""
        files = sorted(self.home.glob("*.log")) + sorted((self.home / "logs").rglob("*.log"))
        return {path: path.read_text(errors="replace") for path in files}

    # -- waiting ----------------------------------------------------------------------------
    def wait_for(
        self, check: Callable[[], Any], timeout: float, what: str, every: float = 0.5
    ) -> Any:
        """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds
        (or at once if a component died)."""
        deadline = time.monotonic() + timeout
        while True:
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            if dead:
                tails = "".join(f"\n--- {n}.log, its end:\n{self._tail(n)}" for n in dead)
                raise DeploymentError(f"waiting for {what}: process(es) exited: {dead}{tails}")
            result = check()
            if result:
                return result
            if time.monotonic() >= deadline:
                raise DeploymentError(f"no {what} after {timeout} s")
            time.sleep(every)

    def _tail(self, name: str, lines: int = 40) -> str:
        """The last ``lines`` lines of process ``name``'s log (why it died)."""
        try:
            text = (self.home / f"{name}.log").read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def _healthy(self) -> bool:
        try:
            health = self.api("GET", "/api/v2/monitor/health")
        except (OSError, DeploymentError):
            return False
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        return all((health.get(p) or {}).get("status") == "healthy" for p in parts)

    # -- the REST API v2 ----------------------------------------------------------------
    def api(self, method: str, path: str, body: Any = None) -> Any:
        if self._token is None and not path.startswith("/api/v2/monitor"):
            self._token = self._request("GET", "/auth/token", None)["access_token"]
        return self._request(method, path, body)

    def _request(self, method: str, path: str, body: Any, tries: int = 5) -> Any:
        """One call; a 5xx "Database error" (SQLite is locked by another component: its
        transaction was rolled back) is retried, at most ``tries`` times in all."""
        for attempt in range(1, tries + 1):
            try:
                return self._request_once(method, path, body)
            except DeploymentError as exc:
                if attempt == tries or "Database error" not in str(exc):
                    raise
                time.sleep(0.5 * attempt)
        raise AssertionError("unreachable")

    def _request_once(self, method: str, path: str, body: Any) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise DeploymentError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from None
        return json.loads(raw) if raw else None

    def wait_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Until the dag-processor has parsed ``dag_id``."""

        def parsed() -> bool:
            try:
                return bool(self.api("GET", f"/api/v2/dags/{dag_id}"))
            except DeploymentError:
                return False

        self.wait_for(parsed, timeout, f"DAG {dag_id} parsed")

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a run; its run id."""
        self.wait_dag(dag_id)
        run = self.api(
            "POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}}
        )
        return str(run["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}")["state"])

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 180) -> str:
        """Until the run finished; its state (``success`` or ``failed``)."""

        def finished() -> str | None:
            state = self.run_state(dag_id, run_id)
            return state if state in ("success", "failed") else None

        return str(self.wait_for(finished, timeout, f"run {run_id} of {dag_id} finished"))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances")
        return {ti["task_id"]: ti["state"] for ti in tis["task_instances"]}

    def wait_task(
        self, dag_id: str, run_id: str, task_id: str, states: Sequence[str], timeout: float = 120
    ) -> str:
        def reached() -> str | None:
            state = self.task_states(dag_id, run_id).get(task_id)
            return state if state in states else None

        return str(self.wait_for(reached, timeout, f"{task_id} in {', '.join(states)}"))

    def xcom(
        self,
        dag_id: str,
        run_id: str,
        task_id: str,
        key: str = "return_value",
        map_index: int | None = None,
    ) -> Any:
        """A task's XCom value (of one mapped instance, ``map_index``)."""
        index = "" if map_index is None else f"&map_index={map_index}"
        entry = self.api(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances/{task_id}"
            f"/xcomEntries/{key}?deserialize=true{index}",
        )
        value = entry["value"]
        return json.loads(value) if isinstance(value, str) else value

    def asset_events(self, name: str, limit: int = 100) -> list[dict[str, Any]]:
        """The asset events of the asset ``name`` (the latest ``limit`` of all assets' events,
        filtered). Airflow 3.3 answers the listing with a 500 while an event's run has not
        started (its start_date is None): that is waited out, for up to a minute."""

        def listed() -> list[dict[str, Any]] | None:
            try:
                got = self.api("GET", f"/api/v2/assets/events?limit={limit}")["asset_events"]
            except DeploymentError as exc:
                if ": 500 " not in str(exc):
                    raise
                return None
            return list(got)

        found = self.wait_for(listed, 60, "the asset events listed")
        return [e for e in found if e["name"] == name]

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        """The task instance as the REST API has it (``id``, ``state``, ``try_number``, ...)."""
        ti = self.api(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances/{task_id}"
        )
        return dict(ti)

    def event_log(self, dag_id: str, run_id: str, task_id: str, event: str) -> list[str]:
        """The ``extra`` text of each entry of Airflow's audit log (the UI's Audit Log) for a
        task of a run whose event is ``event`` (e.g. ``state mismatch``: the scheduler failed
        the task from an executor report, without running its code)."""
        query = urlencode({"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "event": event})
        entries = self.api("GET", f"/api/v2/eventLogs?{query}")["event_logs"]
        return [str(e.get("extra") or "") for e in entries]

    def xcom_rows(self, dag_id: str, run_id: str) -> dict[tuple[str, str], int]:
        """Every row the metadata DB's ``xcom`` table holds for a run: ``(task id, key)`` ->
        bytes of its value, as stored (SQLite: read straight from the table)."""
        if self.database is not None:
            raise DeploymentError("xcom_rows reads the SQLite database only")
        with contextlib.closing(sqlite3.connect(self.home / "airflow.db", timeout=60)) as db:
            rows = db.execute(
                "SELECT task_id, key, length(CAST(value AS BLOB)) FROM xcom "
                "WHERE dag_id = ? AND run_id = ?",
                (dag_id, run_id),
            ).fetchall()
        return {(task_id, key): int(size or 0) for task_id, key, size in rows}

    def clear(self, dag_id: str, run_id: str, task_ids: Sequence[str]) -> None:
        """Clear ``task_ids`` of a run and everything downstream (the UI's Clear)."""
        self.api(
            "POST",
            f"/api/v2/dags/{dag_id}/clearTaskInstances",
            {
                "dry_run": False,
                "dag_run_id": run_id,
                "task_ids": list(task_ids),
                "include_downstream": True,
                "only_failed": False,
                "reset_dag_runs": True,
            },
        )

    def mark(self, dag_id: str, run_id: str, task_id: str, state: str) -> None:
        """Set a task instance's state (the UI's Mark failed / Mark success)."""
        self.api(
            "PATCH",
            f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}/taskInstances/{task_id}",
            {"new_state": state},
        )


def main() -> None:
    """Run the example DAG once in a fresh deployment; print its summary; stop everything."""
    # SIGTERM unwinds like Ctrl-C, so every process started is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    deployment = Deployment([EXAMPLE_DAGS / "echomq_fan_out.py"])
    with deployment:
        print(f"Airflow API and UI: {deployment.base} (AIRFLOW_HOME {deployment.home})")
        print(f"EchoMQ server: {deployment.echomq_url}, prefix {deployment.prefix}")
        run_id = deployment.trigger("echomq_fan_out")
        state = deployment.wait_run("echomq_fan_out", run_id)
        print(f"echomq_fan_out {run_id}: {state}")
        print("summary:", deployment.xcom("echomq_fan_out", run_id, "summarise"))
        if "--keep" in sys.argv:
            print("running; Ctrl-C stops everything")
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    deployment.cleanup()


if __name__ == "__main__":
    main()
