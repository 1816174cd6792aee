"""The README's Airflow example, deployed as the README says (issue 48, item 4).

Its three pieces are taken from the README as written: the DAG file (``dags/reports.py``), the
handlers module (``my_handlers.py``) and the shell lines (the ``echomq_default`` connection and
the ``echomq worker`` command). They run in a real deployment (``examples/airflow/deployment.py``:
api-server, scheduler, dag-processor, triggerer, an EchoMQ server, the worker and a Pump as
processes); the one change is the server's address, the deployment's own. The run is
triggered through the REST API as a user would, and ``summarise`` must return what the README
says it returns.
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

README = (ROOT / "README.md").read_text()


def shell_lines() -> list[str]:
    """The lines of the README's shell block that follows its handlers module."""
    after = README[README.index('```python title="my_handlers.py"') :]
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


def test_the_readme_dag_runs_as_written(tmp_path: Path) -> None:
    files = {b.file: b.code for b in blocks("README.md") if b.file is not None}
    assert set(files) == {"dags/reports.py", "my_handlers.py"}
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "my_handlers.py").write_text(files["my_handlers.py"])
    dag = tmp_path / "reports.py"
    dag.write_text(files["dags/reports.py"])

    export, worker = shell_lines()
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

    said = re.search(r"`summarise` returns (\d+)", README)
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
        run_id = deployment.trigger("reports")
        assert deployment.wait_run("reports", run_id, timeout=300) == "success"
        assert deployment.xcom("reports", run_id, "summarise") == int(said[1])
    finally:
        deployment.stop()
        deployment.cleanup()
