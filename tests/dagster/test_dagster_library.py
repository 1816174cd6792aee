"""``dagster_echomq`` as a Dagster library: its ``__version__`` is echomq's (one version
source), and importing it registers it in Dagster's library registry, which a code server
reports to the webserver beside Dagster's own libraries - without a version-mismatch warning
(Dagster checks only its own packages' versions against its own).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dagster_support import ROOT
from deploy_support import free_port, signal_group

DEFINITIONS = """
import dagster as dg
import dagster_echomq

@dg.asset
def one() -> int:
    return 1

defs = dg.Definitions(assets=[one])
"""


def _env() -> dict[str, str]:
    paths = [str(ROOT / "dagster_integration"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, paths)))


def test_version_is_echomqs() -> None:
    import dagster_echomq

    import echomq_core

    assert dagster_echomq.__version__ == echomq_core.__version__
    assert dagster_echomq.__version__ == importlib.metadata.version("dagster-echomq")


def test_import_registers_the_library_without_a_warning() -> None:
    code = (
        "import json, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import dagster_echomq\n"
        "from dagster._core.libraries import DagsterLibraryRegistry\n"
        "print(json.dumps({'libraries': DagsterLibraryRegistry.get(),\n"
        "    'warnings': [str(w.message) for w in caught]}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    import echomq_core

    assert seen["libraries"]["dagster-echomq"] == echomq_core.__version__
    ours = [w for w in seen["warnings"] if "echomq" in w.lower()]
    assert ours == [], ours


def test_a_code_server_reports_the_library(tmp_path: Path) -> None:
    """What the webserver shows under a code location's libraries: the gRPC server's
    ``list_repositories`` answer."""
    from dagster._api.list_repositories import sync_list_repositories_grpc
    from dagster._grpc.client import DagsterGrpcClient

    import echomq_core

    defs = tmp_path / "defs.py"
    defs.write_text(DEFINITIONS)
    port = free_port()
    log = tmp_path / "grpc.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "dagster", "api", "grpc", "--python-file", str(defs),
             "--host", "127.0.0.1", "--port", str(port)],
            env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        client = DagsterGrpcClient(port=port, host="127.0.0.1")
        # a bounded retry of a real answer: on a loaded 2-core machine the server's start and
        # its first answer (it loads the code location) may each take a minute
        deadline = time.monotonic() + 300
        while True:
            try:
                client.ping("x")
                libraries = sync_list_repositories_grpc(client).dagster_library_versions
                break
            except Exception:
                assert server.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        assert libraries is not None and libraries["dagster-echomq"] == echomq_core.__version__
    finally:
        signal_group(server, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a loaded machine: its shutdown is not under test
            signal_group(server, signal.SIGKILL)
            server.wait(timeout=60)
