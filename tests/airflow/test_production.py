"""The stack users run in production: Airflow on PostgreSQL with CeleryExecutor, two Celery
workers, two schedulers and two triggerers, every component its own process; EchoMQ's server,
worker and Pump beside them; the Celery broker a Redis-protocol server of its own.

Stories: the example DAGs run, their tasks in the Celery workers, with both schedulers
scheduling them (no flow added twice, no child run twice); then the Celery worker running an
``EchoFlowOperator`` that waits for its flow is killed (SIGKILL), and the one running an
``@task.echo_flow`` that waits: each retry, in the worker alive, converges on the flow its
first try added (one flow per task, every child run once); then a dozen runs each defer a
sensor, spread over both triggerers, the triggerer holding the most is killed (SIGKILL), the
flows are released, and the other triggerer takes its triggers over: every sensor succeeds,
each flow read and closed once; then, both triggerers up, the asset watcher's trigger fires one
asset event per flow released from outside, and when the triggerer running it is killed the
other takes it over: the flows released meanwhile fire once each, none twice. What the test
measured is printed (release to sensor success, the takeover) and reported in docs/airflow.md.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from echomq_provider.flow_specs import parent_id_for

from echomq_core import Child, EchoMQ
from echomq_core.wire.calls import Call

from .postgres import Postgres

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLES = ROOT / "examples" / "airflow"
sys.path.insert(0, str(EXAMPLES))

from deployment import EXAMPLE_DAGS, Deployment  # noqa: E402

# the suite's 300 s per test is too short for a whole stack and its stories (about 4 min on
# a loaded machine; more with ECHOMQ_PROD_SENSORS=100)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.onlystandalone,
    pytest.mark.production,
    pytest.mark.timeout(1800),
]

#: Deferred sensors at once: 100, as the issue asks (about 4 minutes more than 12 on 2 cores;
#: ECHOMQ_PROD_SENSORS=12 for a quicker local run).
RUNS = int(os.environ.get("ECHOMQ_PROD_SENSORS", "100"))


def group_cpu(pid: int) -> float:
    """CPU seconds (user + system) of every live process in ``pid``'s process group."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pid:  # pgrp
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def runs_of(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["id"] for line in path.read_text().splitlines() if line)


def spread(values: list[float]) -> dict[str, float] | None:
    """Median, p90 (nearest rank) and max, in seconds."""
    if not values:
        return None
    ordered = sorted(values)
    p90 = ordered[max(0, -(-9 * len(ordered) // 10) - 1)]
    return {
        "median": round(statistics.median(ordered), 2),
        "p90": round(p90, 2),
        "max": round(ordered[-1], 2),
    }


def triggers_by_host(pg: Postgres, run_ids: list[str]) -> dict[str, set[str]]:
    """Which triggerer (its ``job`` row's hostname: the component's name) runs the trigger of
    each run's deferred sensor, from the metadata database."""
    import psycopg2

    with psycopg2.connect(pg.dsn) as db, db.cursor() as cur:
        cur.execute(
            "SELECT ti.run_id, j.hostname FROM task_instance ti "
            "JOIN trigger t ON ti.trigger_id = t.id JOIN job j ON t.triggerer_id = j.id "
            "WHERE ti.dag_id = 'echomq_prod_deferred' AND ti.task_id = 'wait'"
        )
        rows = cur.fetchall()
    held: dict[str, set[str]] = {}
    for run_id, host in rows:
        if run_id in run_ids:
            held.setdefault(str(host), set()).add(str(run_id))
    return held


def test_production_stack(tmp_path: Path) -> None:
    runs, markers = tmp_path / "runs.jsonl", tmp_path / "markers"
    markers.mkdir()
    with Postgres() as pg:
        deployment = Deployment(
            [
                EXAMPLE_DAGS / "echomq_fan_out.py",
                HERE / "dags" / "echomq_prod_deferred.py",
                HERE / "dags" / "echomq_watch.py",
                HERE / "dags" / "echomq_prod_killed.py",
            ],
            worker_app="worker_proc:HANDLERS",
            pythonpath=[HERE, EXAMPLES, ROOT],
            prefix="prod",
            database=pg.url,
            executor="CeleryExecutor",
            celery_workers=2,
            replicas={"scheduler": 2, "triggerer": 2},
            env={
                "ECHOMQ_TEST_RUNS": str(runs),
                "ECHOMQ_TEST_MARKERS": str(markers),
                "AIRFLOW__CORE__PARALLELISM": "32",
                # a task whose Celery worker was killed is found (its heartbeat gone) within
                # about 40 s, not the default 300 s, so that its retry runs in this test
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
            },
        )
        try:
            deployment.start()
            with EchoMQ(deployment.echomq_url, prefix="prod") as mq:
                examples_on_celery(deployment, mq, runs)
                celery_workers_killed_mid_wait(deployment, mq, markers, runs)
                victim = triggerer_takeover(deployment, pg, mq, markers, runs)
                watcher_across_triggerers(deployment, pg, mq, victim)
        finally:
            deployment.stop()
            deployment.cleanup()


def examples_on_celery(deployment: Deployment, mq: EchoMQ, runs: Path) -> None:
    """The example DAG, its tasks in the Celery workers, two schedulers at it."""
    run_id = deployment.trigger("echomq_fan_out")
    assert deployment.wait_run("echomq_fan_out", run_id, timeout=300) == "success"
    summary = deployment.xcom("echomq_fan_out", run_id, "summarise")
    assert summary["by_item"] == {str(n): n * n if n % 2 else n**3 for n in range(1, 9)}
    parent = parent_id_for("echomq_fan_out", run_id, "fan_out")
    assert mq.snapshot("example.reports", parent).parent_state == "closed"
    ran = runs_of(runs)
    assert ran and set(ran.values()) == {1}, ran  # no child ran twice
    celery = "\n".join(
        (deployment.home / f"celery-worker-{n}.log").read_text(errors="replace") for n in (1, 2)
    )
    assert "echomq_fan_out" in celery  # the tasks ran in the Celery workers


def celery_workers_killed_mid_wait(
    deployment: Deployment, mq: EchoMQ, markers: Path, runs: Path
) -> None:
    """The Celery worker running ``EchoFlowOperator(wait_for_completion=True)`` is killed
    (SIGKILL, the whole worker) while the task waits for its flow, and then the one running
    ``@task.echo_flow`` (the same worker or the other): each task's retry, in a worker that is
    alive, converges on the flow its first try added - one flow per task, every child run once,
    the values read and the flow closed."""
    dag_id = "echomq_prod_killed"
    run_id = deployment.trigger(dag_id)
    parents = {t: parent_id_for(dag_id, run_id, t) for t in ("op", "tf")}
    queue = "example.reports"

    def waiting(task_id: str) -> dict[str, Any] | None:
        """The task instance while its try waits on a flow that holds its 3 children."""
        ti = deployment.task_instance(dag_id, run_id, task_id)
        snap = mq.snapshot(queue, parents[task_id])
        if ti["state"] == "running" and snap.parent_state == "held" and snap.total == 3:
            return ti
        return None

    def retried(task_id: str, try_number: int, victim: str) -> bool:
        ti = deployment.task_instance(dag_id, run_id, task_id)
        return bool(
            ti["try_number"] > try_number and ti["state"] == "running" and ti["hostname"] != victim
        )

    killed: list[str] = []
    for task_id in ("op", "tf"):
        ti = deployment.wait_for(functools.partial(waiting, task_id), 300, f"{task_id} waits")
        if ti["try_number"] > 1:
            continue  # its first try died with the worker killed for the other task
        victim = str(ti["hostname"])
        assert victim.startswith("celery-worker-"), ti
        deployment.kill(victim)
        killed.append(victim)
        # the scheduler finds the heartbeat gone and the retry starts in the other worker
        deployment.wait_for(
            functools.partial(retried, task_id, ti["try_number"], victim),
            300,
            f"{task_id}'s retry running in the worker that is alive",
            every=2,
        )
        deployment.restart(victim)
    assert killed, "no worker was killed"
    (markers / "go-killed").touch()
    assert deployment.wait_run(dag_id, run_id, timeout=300) == "success"
    tries = {t: deployment.task_instance(dag_id, run_id, t)["try_number"] for t in parents}
    assert min(tries.values()) >= 2, tries
    for task_id, parent in parents.items():
        snap = mq.snapshot(queue, parent)
        assert (snap.parent_state, snap.total, snap.processed) == ("closed", 3, 3), (task_id, snap)
    assert deployment.xcom(dag_id, run_id, "summarise") == {
        "op": {"0": 1, "1": 4, "2": 9},
        "tf": {"0": 1, "1": 8, "2": 27},
    }
    ran = runs_of(runs)
    for parent in parents.values():  # each child ran once: the retries added nothing again
        mine = {k: v for k, v in ran.items() if k.startswith(parent)}
        assert len(mine) == 3 and set(mine.values()) == {1}, mine
    print(json.dumps({"killed_celery_workers": killed, "tries": tries}))


def triggerer_takeover(
    deployment: Deployment, pg: Postgres, mq: EchoMQ, markers: Path, runs: Path
) -> str:
    """The triggerer holding most deferred sensors is killed; the other takes them over. Its
    name, for the next story to start it again."""
    run_ids = [deployment.trigger("echomq_prod_deferred") for _ in range(RUNS)]

    def all_deferred() -> bool:
        return all(
            deployment.task_states("echomq_prod_deferred", r).get("wait") == "deferred"
            for r in run_ids
        )

    deployment.wait_for(all_deferred, 600, f"{RUNS} sensors deferred", every=2)
    held = deployment.wait_for(
        lambda: (h := triggers_by_host(pg, run_ids)) and sum(map(len, h.values())) == RUNS and h,
        120,
        "every trigger assigned to a triggerer",
    )
    victim = max(held, key=lambda name: len(held[name]))
    survivor = ({"triggerer", "triggerer-2"} - {victim}).pop()
    survivor_pid = deployment.procs[survivor].pid
    cpu_before = group_cpu(survivor_pid)
    killed = time.monotonic()
    deployment.kill(victim)
    (markers / "go").touch()  # every flow can be released now
    released: dict[str, float] = {}
    done: dict[str, float] = {}

    def finished() -> bool:
        for r in run_ids:
            parent = parent_id_for("echomq_prod_deferred", r, "fan_out")
            if r not in released and mq.snapshot("example.reports", parent).released:
                released[r] = time.monotonic()
            if r not in done and deployment.run_state("echomq_prod_deferred", r) in (
                "success",
                "failed",
            ):
                done[r] = time.monotonic()
        return len(done) == RUNS

    deployment.wait_for(finished, 600, "every run finished", every=1)
    survivor_cpu = group_cpu(survivor_pid) - cpu_before
    took = time.monotonic() - killed
    states = {r: deployment.run_state("echomq_prod_deferred", r) for r in run_ids}
    assert set(states.values()) == {"success"}, states
    for r in run_ids:
        parent = parent_id_for("echomq_prod_deferred", r, "fan_out")
        snap = mq.snapshot("example.reports", parent)
        assert (snap.parent_state, snap.processed) == ("closed", 3)
        assert deployment.xcom("echomq_prod_deferred", r, "summarise") == {"0": 1, "1": 8, "2": 9}
    ran = runs_of(runs)
    assert set(ran.values()) == {1}, {k: v for k, v in ran.items() if v != 1}
    moved = [done[r] - killed for r in held[victim]]
    stayed = [done[r] - released.get(r, killed) for r in run_ids if r not in held[victim]]
    print(
        json.dumps(
            {
                "runs": RUNS,
                "held_by_killed_triggerer": len(held[victim]),
                "held_by_survivor": len(held.get(survivor, ())),
                "moved_run_done_after_kill_s": spread(moved),
                "stayed_release_to_run_done_s": spread(stayed),
                "survivor_triggerer_cpu_s": round(survivor_cpu, 1),
                "survivor_triggerer_cpu_share": round(survivor_cpu / took, 3),
            }
        )
    )
    return victim


def watcher_holder(pg: Postgres) -> str | None:
    """The triggerer (its ``job`` row's hostname) running the asset watcher's trigger."""
    import psycopg2

    with psycopg2.connect(pg.dsn) as db, db.cursor() as cur:
        cur.execute(
            "SELECT j.hostname FROM trigger t JOIN job j ON t.triggerer_id = j.id "
            "WHERE t.classpath LIKE '%EchoFlowReleasedTrigger' AND j.state = 'running'"
        )
        rows = cur.fetchall()
    return str(rows[0][0]) if len(rows) == 1 else None


def watcher_across_triggerers(
    deployment: Deployment, pg: Postgres, mq: EchoMQ, stopped: str
) -> None:
    """Event-driven scheduling with two triggerers: the asset watcher's trigger runs on one
    of them; flows released from outside fire one asset event each; the triggerer running the
    watcher is killed, more flows are released, the other triggerer takes the watcher over:
    those fire once each too, and none of the first fires again (the cursor is on the
    server, not in the triggerer)."""
    deployment.restart(stopped)  # both triggerers up again
    queue = "example.outside"
    cursor = mq.keys.watch(queue, "outside-to-dwh")
    deployment.wait_for(
        lambda: mq.connection.execute([Call.cmd("EXISTS", cursor)])[0] == 1,
        180,
        "the watcher's trigger polled",
    )

    def add(names: list[str]) -> list[str]:
        children = [Child({"n": n}, queue="example.square") for n in (1, 2)]
        return [
            mq.add_flow(queue, children, parent_id=f"JOB-outside/{name}", barrier=True).parent_id
            for name in names
        ]

    def events() -> Counter[str]:
        """How many asset events each flow fired."""
        return Counter(
            e["extra"]["payload"]["parent_id"] for e in deployment.asset_events("outside-released")
        )

    first = add(["p1", "p2", "p3"])
    deployment.wait_for(lambda: set(first) <= set(events()), 180, "events of the first flows")
    holder = deployment.wait_for(lambda: watcher_holder(pg), 120, "the watcher's triggerer")
    deployment.kill(holder)
    later = add(["p4", "p5"])
    deployment.wait_for(
        lambda: set(later) <= set(events()), 300, "events of the flows released after the kill"
    )
    # the killed triggerer's job row says 'running' until its heartbeat is found stale
    deployment.wait_for(
        lambda: (h := watcher_holder(pg)) is not None and h != holder, 300, "the watcher moved"
    )
    assert events() == Counter({pid: 1 for pid in first + later})
    assert {mq.snapshot(queue, pid).parent_state for pid in first + later} == {"closed"}
