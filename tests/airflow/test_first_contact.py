"""What a new user meets first in Airflow: a connection not defined yet, and what the failure
callback then says about a flow that was never added (issue 48, item 4)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from echomq_provider.errors import ConnectionNotDefined
from echomq_provider.hooks.echomq import EchoMQHook
from echomq_provider.operators.echo_flow import EchoFlowOperator
from echomq_provider.settle import left_to_task

from echomq_core import Child, EchoMQ, EchoMQError

pytestmark = pytest.mark.onlystandalone


def test_a_missing_connection_says_how_to_define_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The error names the conn id and both ways to define it, at once, sync and async; it is
    still Airflow's not-found error (code that caught that keeps working) and EchoMQ's."""
    from echomq_provider._compat import AirflowNotFoundException

    monkeypatch.delenv("AIRFLOW_CONN_ECHOMQ_FIRST", raising=False)
    started = time.monotonic()
    with pytest.raises(ConnectionNotDefined) as sync:
        EchoMQHook("echomq_first").settings()
    with pytest.raises(ConnectionNotDefined) as not_sync:
        asyncio.run(EchoMQHook("echomq_first").asettings())
    assert time.monotonic() - started < 5
    for exc in (sync.value, not_sync.value):
        assert isinstance(exc, AirflowNotFoundException) and isinstance(exc, EchoMQError)
        assert exc.conn_id == "echomq_first"
        text = str(exc)
        assert "'echomq_first' is not defined" in text
        assert "AIRFLOW_CONN_ECHOMQ_FIRST='echomq://HOST:6379/0'" in text
        assert "airflow connections add echomq_first --conn-uri 'echomq://HOST:6379/0'" in text


def test_the_documented_ways_define_a_working_connection(
    monkeypatch: pytest.MonkeyPatch, standalone_server: Any
) -> None:
    """What the message tells the user to write works as written (HOST replaced)."""
    hook = EchoMQHook("echomq_first")
    with pytest.raises(ConnectionNotDefined) as exc:
        hook.settings()
    env = str(exc.value).split("variable, ", 1)[1].split(" (add", 1)[0]
    name, value = env.split("=", 1)
    host = standalone_server.url.split("//", 1)[1].rsplit("/", 1)[0]  # host:port
    monkeypatch.setenv(name, value.strip("'").replace("HOST:6379", host))
    try:
        assert isinstance(hook.get_conn().queues(), list)
    finally:
        hook.close()


def test_a_callback_says_left_to_it_only_for_a_flow_an_earlier_try_added(
    echomq_conn: str, standalone_server: Any, prefix: str
) -> None:
    """A task running again is told its flow is left to it only when the server holds that
    flow; a first try that failed before adding says there is none; a connection not defined
    is said as such, and the callback still does not raise."""
    task = EchoFlowOperator(task_id="fan_out", parent_queue="first", children=[1])
    parent_id = "JOB-first-contact"
    said = left_to_task(task, "running", "first", parent_id)
    assert "left to it" not in said, said
    assert f"no flow {parent_id} in queue 'first'" in said
    with EchoMQ(standalone_server.url, prefix=prefix) as mq:
        mq.add_flow("first", [Child(1, queue="first")], parent_id=parent_id, barrier=True)
    said = left_to_task(task, "running", "first", parent_id)
    assert said == f"Task fan_out is running again: flow {parent_id} left to it (waiting)"
    lost = EchoFlowOperator(
        task_id="fan_out", parent_queue="first", children=[1], echomq_conn_id="echomq_none"
    )
    said = left_to_task(lost, "running", "first", parent_id)
    assert "left to it" not in said and "ConnectionNotDefined" in said, said


def test_a_dag_without_its_connection_fails_fast_and_names_no_flow(
    airflow_db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The README's first try, before the connection is defined: under ``dag.test()`` the task
    fails on the connection, with how to define it, and the callback does not claim a flow."""
    import os
    import subprocess
    import sys

    dag = airflow_db / "echomq_first_contact.py"
    dag.write_text(
        "from airflow.sdk import dag, task\n"
        "@dag(schedule=None)\n"
        "def echomq_first_contact():\n"
        "    @task.echo_flow(parent_queue='reports', child_queue='work',"
        " wait_for_completion=True)\n"
        "    def fan_out() -> list[dict]:\n"
        "        return [{'payload': n} for n in range(3)]\n"
        "    fan_out()\n"
        "echomq_first_contact()\n"
    )
    code = (
        "try:\n"
        "    from airflow.dag_processing.dagbag import DagBag\n"
        "except ImportError:  # Airflow 3.1\n"
        "    from airflow.models.dagbag import DagBag\n"
        f"DagBag(dag_folder={str(dag)!r}).get_dag('echomq_first_contact').test()\n"
    )
    monkeypatch.delenv("AIRFLOW_CONN_ECHOMQ_DEFAULT", raising=False)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
        timeout=300, cwd=tmp_path,
    )  # fmt: skip
    seconds = time.monotonic() - started
    out = done.stdout + done.stderr
    assert "ConnectionNotDefined" in out and "AIRFLOW_CONN_ECHOMQ_DEFAULT=" in out, out[-3000:]
    assert "left to it" not in out, out[-3000:]
    assert seconds < 60, seconds
