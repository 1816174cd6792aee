"""The READMEs' Airflow examples, deployed as the READMEs say (issue 48, item 4).

Each example's three pieces are taken from its README as written: the DAG file
(``dags/<name>.py``), the handlers module (``my_handlers.py``) and the shell lines (the
``echomq_default`` connection and the ``echomq worker`` command). They run in a real deployment
(``examples/airflow/deployment.py``: api-server, scheduler, dag-processor, triggerer, an EchoMQ
server, the worker and a Pump as processes); the one change is the server's address, the
deployment's own. The run is triggered through the REST API as a user would, and
``summarise`` must return what the README says it returns.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from ..test_docs_blocks import ROOT, blocks

HERE = Path(__file__).resolve().parent
EXAMPLES = ROOT / "examples" / "airflow"
sys.path.insert(0, str(EXAMPLES))

from deployment import Deployment  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.deployment,
    pytest.mark.onlystandalone,
    pytest.mark.timeout(900),
]

#: The READMEs with an Airflow example: the main one and the provider's.
PAGES = ["README.md", "airflow_provider/README.md"]


def shell_lines(text: str) -> list[str]:
    """The lines of the page's shell block that follows its handlers module."""
    after = text[text.index('```python title="my_handlers.py"') :]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    assert block is not None
    return [line for line in block[1].splitlines() if line.strip()]


class ReadmeDeployment(Deployment):
    """The deployment with the README's connection: its value as written, the address the
    deployment's server's."""

    def __init__(self, connection: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.documented = connection

    def _connection_uri(self) -> str:
        where = self.echomq_url.split("//", 1)[1].rsplit("/", 1)[0]
        return self.documented.replace("localhost:6379", where)


@pytest.mark.parametrize("page", PAGES)
def test_the_readme_dag_runs_as_written(page: str, tmp_path: Path) -> None:
    text = (ROOT / page).read_text()
    files = {b.file: b.code for b in blocks(page) if b.file is not None}
    (dag_file,) = [f for f in files if f.startswith("dags/")]
    assert set(files) == {dag_file, "my_handlers.py"}
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "my_handlers.py").write_text(files["my_handlers.py"])
    dag = tmp_path / Path(dag_file).name
    dag.write_text(files[dag_file])
    dag_id = re.search(r"@dag\(.*\)\ndef (\w+)\(", files[dag_file])
    assert dag_id is not None

    export, worker = shell_lines(text)
    name, value = export.removeprefix("export ").split("=", 1)
    assert name == "AIRFLOW_CONN_ECHOMQ_DEFAULT"
    connection = shlex.split(value)[0]
    command = shlex.split(worker)
    assert command[:2] == ["echomq", "worker"]
    app = command[command.index("--app") + 1]
    queues = command[2 : command.index("--app")]
    url = command[command.index("--url") + 1]
    # the worker's server is the connection's (the prefix too: neither names one)
    assert connection.replace("echomq://", "redis://") == url

    said = re.search(r"`summarise` returns (\d+)", text)
    assert said is not None
    deployment = ReadmeDeployment(
        connection,
        dags=[dag],
        worker_app=app,
        worker_queues=queues,
        pythonpath=[app_dir],
        prefix="emq",  # the default, which the README's connection and worker use
    )
    try:
        deployment.start()
        run_id = deployment.trigger(dag_id[1])
        assert deployment.wait_run(dag_id[1], run_id, timeout=300) == "success"
        assert deployment.xcom(dag_id[1], run_id, "summarise") == int(said[1])
    finally:
        deployment.stop()
        deployment.cleanup()


def test_a_task_without_its_connection_fails_fast_saying_how_to_define_it(
    tmp_path: Path,
) -> None:
    """The first try a new user makes: the connection is not defined (here the DAG names one
    that is not). The task fails on its first read of the connection, not after retries or
    timeouts, its log says how to define it, and no failure callback claims a flow."""
    dag = tmp_path / "echomq_no_connection.py"
    dag.write_text(
        "from airflow.sdk import dag, task\n\n\n"
        "@dag(schedule=None)\n"
        "def echomq_no_connection():\n"
        "    @task.echo_flow(parent_queue='reports', child_queue='work',"
        " wait_for_completion=True, echomq_conn_id='echomq_first')\n"
        "    def fan_out() -> list[dict]:\n"
        "        return [{'payload': n} for n in range(3)]\n\n"
        "    fan_out()\n\n\n"
        "echomq_no_connection()\n"
    )
    deployment = Deployment(dags=[dag], prefix="emq")
    try:
        deployment.start()
        run_id = deployment.trigger("echomq_no_connection")
        assert deployment.wait_run("echomq_no_connection", run_id, timeout=300) == "failed"
        ti = deployment.task_instance("echomq_no_connection", run_id, "fan_out")
        assert ti["try_number"] == 1, ti
        seconds = float(ti["duration"])
        log = task_log_text(deployment)
        assert "ConnectionNotDefined" in log and "AIRFLOW_CONN_ECHOMQ_FIRST=" in log, log[-3000:]
        assert "left to it" not in log
        assert seconds < 30, seconds
        print(f"the task failed after {seconds:.2f} s of its own")
    finally:
        deployment.stop()
        deployment.cleanup()


def task_log_text(deployment: Deployment) -> str:
    """Every log file of the deployment (components and tasks), joined."""
    return "\n".join(deployment.logs().values())
