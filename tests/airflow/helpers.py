"""Helpers for driving real DAG runs (``dag.test()``) and reading what they left behind.

Imported by test modules only after the conftest has pointed Airflow at its temp home; nothing
here imports ``airflow`` at module level.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunResult:
    dag_id: str
    run_id: str
    state: str
    seconds: float
    tasks: dict[str, Any]  # task id -> scheduler TaskInstance (state, try_number, duration)

    def state_of(self, task_id: str) -> str:
        return str(self.tasks[task_id].state)

    def xcom(self, task_id: str, key: str = "return_value") -> Any:
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        with create_session() as session:
            row = session.scalars(
                XComModel.get_many(
                    run_id=self.run_id, dag_ids=self.dag_id, task_ids=task_id, key=key
                )
            ).first()
            return None if row is None else XComModel.deserialize_value(row)

    def mapped_xcoms(self, task_id: str) -> list[Any]:
        """The return values of a mapped task's instances, by map index."""
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        with create_session() as session:
            rows = session.scalars(
                XComModel.get_many(
                    run_id=self.run_id, dag_ids=self.dag_id, task_ids=task_id, map_indexes=None
                )
            ).all()
            rows = sorted(rows, key=lambda row: row.map_index)
            return [XComModel.deserialize_value(row) for row in rows]

    def xcom_bytes(self) -> dict[str, int]:
        """Bytes of XCom stored per task of this run (the metadata DB's value column)."""
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            rows = session.execute(
                select(XComModel.task_id, XComModel.value).where(
                    XComModel.run_id == self.run_id, XComModel.dag_id == self.dag_id
                )
            ).all()
        out: dict[str, int] = {}
        for task_id, value in rows:
            raw = value if isinstance(value, bytes | str) else json.dumps(value)
            out[task_id] = out.get(task_id, 0) + len(raw)
        return out


def load_dag(dags: Path, dag_id: str) -> Any:
    """The DAG object, parsed from its file in the session's DAGs folder (as Airflow does)."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef]

    bag = DagBag(dag_folder=str(dags / f"{dag_id}.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag(dag_id)


def run_dag(
    dags: Path,
    dag_id: str,
    tweak: Callable[[Any], None] | None = None,
    conf: dict[str, Any] | None = None,
) -> RunResult:
    """Run ``dag_id`` once with ``dag.test()`` (tasks in process, triggers inline)."""
    dag = load_dag(dags, dag_id)
    if tweak is not None:
        tweak(dag)
    started = time.monotonic()
    dr = dag.test(run_conf=conf)
    seconds = time.monotonic() - started
    tasks = {ti.task_id: ti for ti in dr.get_task_instances()}
    return RunResult(dr.dag_id, dr.run_id, str(dr.state), seconds, tasks)


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def airflow_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``airflow ARGS`` in a child process with this session's AIRFLOW_HOME."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "airflow", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def cli_json(*args: str) -> Any:
    """``airflow ARGS -o json``, parsed; fails the test on a non-zero exit."""
    result = airflow_cli(*args, "-o", "json")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    return json.loads(out[out.index("[") :])


#: The states of a deferred task: ``dag.test()`` shows it ``queued`` while its trigger runs.
DEFERRED = ("deferred", "queued")


class OpenWhen(threading.Thread):
    """Touch ``marker`` once a task instance of ``dag_id``/``task_id`` is in one of
    ``states`` (read from the metadata DB, every 50 ms, at most ``timeout`` s): the gate a
    test's children wait on (``wait_for``, or the worker's ``ECHOMQ_TEST_GATE``), so that they
    settle only after the waiting task reached that state, however loaded the machine.

    Only task instances that have run (they have a pid) of runs still running count, so a
    finished run of the same DAG does not open it. ``dag.test()`` shows a deferred task as
    ``queued`` while it runs its trigger in line (it sets it so, to resume it after): there
    ``queued`` with a pid means deferred - :data:`DEFERRED`. Use as a context manager around
    ``run_dag``; :attr:`opened_in` says in which state it opened (None: it never did; its repr
    says what it saw)."""

    def __init__(
        self, marker: Path, dag_id: str, task_id: str, states: tuple[str, ...], timeout: float = 120
    ) -> None:
        super().__init__(daemon=True)
        self.marker, self.dag_id, self.task_id = marker, dag_id, task_id
        self.states, self.timeout = states, timeout
        self.opened_in: str | None = None
        self.seen: set[str] = set()  # every state read, and the errors met: why it did not open
        self.errors: list[str] = []
        self._stop_event = threading.Event()
        self._query: Any = None

    def __enter__(self) -> OpenWhen:
        self._query = self._build_query()  # here: importing models in the thread deadlocks
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_event.set()
        self.join(10)

    def __repr__(self) -> str:
        return (
            f"OpenWhen({self.task_id} in {self.states}: saw {self.seen}, errors {self.errors[-3:]})"
        )

    def _build_query(self) -> Any:
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from sqlalchemy import select
        from sqlalchemy.orm import configure_mappers

        configure_mappers()
        same_run = (DagRun.dag_id == TaskInstance.dag_id) & (DagRun.run_id == TaskInstance.run_id)
        return (
            select(TaskInstance.state)
            .join(DagRun, same_run)
            .where(
                TaskInstance.dag_id == self.dag_id,
                TaskInstance.task_id == self.task_id,
                TaskInstance.pid.is_not(None),  # it has run (see the class doc)
                DagRun.state == "running",
            )
        )

    def run(self) -> None:
        from airflow.utils.session import create_session
        from sqlalchemy.exc import OperationalError

        deadline, query = time.monotonic() + self.timeout, self._query
        while not self._stop_event.is_set() and time.monotonic() < deadline:
            try:
                with create_session() as session:
                    states = {str(state) for state in session.scalars(query)}
                self.seen |= states
            except OperationalError:  # SQLite busy with the run's own writes: read again
                states = set()
            except Exception as exc:  # said by the test's assertion on opened_in
                self.errors.append(f"{type(exc).__name__}: {exc}")
                states = set()
            found = next((state for state in self.states if state in states), None)
            if found is not None:
                self.opened_in = found
                self.marker.touch()
                return
            self._stop_event.wait(0.05)
