"""The Dagster integration's README example, run as the README says (issue 48, item 4).

Its pieces are taken from the README as written: ``definitions.py``, the handlers module
``my_handlers.py`` and the shell lines (``ECHOMQ_URL``, the ``echomq worker`` command, the
``dagster asset materialize`` command). The worker and Dagster run as the commands given (the
worker from the folder of its module; Dagster's default multiprocess executor, a step process
per asset); the one change is the server's address, the suite's own. ``total`` must be what
the README says it is.
"""

from __future__ import annotations

import pickle
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_docs_blocks import ROOT, blocks

PAGE = "dagster_integration/README.md"
DAGSTER = str(Path(sys.executable).with_name("dagster"))

pytestmark = pytest.mark.onlystandalone


def shell_lines(text: str) -> list[list[str]]:
    """The commands of the page's shell block that follows its handlers module."""
    after = text[text.index('```python title="my_handlers.py"') :]
    block = re.search(r"```bash\n(.*?)```", after, re.S)
    assert block is not None
    return [shlex.split(line, comments=True) for line in block[1].splitlines() if line.strip()]


def test_the_readme_assets_materialize_as_written(
    standalone_server: Any, proc_env: dict[str, str], tmp_path: Path
) -> None:
    text = (ROOT / PAGE).read_text()
    files = {b.file: b.code for b in blocks(PAGE) if b.file is not None}
    assert set(files) == {"definitions.py", "my_handlers.py"}
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    export, worker, materialize = shell_lines(text)
    name, documented = export[1].split("=", 1)
    assert (export[0], name) == ("export", "ECHOMQ_URL")
    url = standalone_server.url  # the documented server's place
    assert documented == "redis://localhost:6379/0"
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {**proc_env, "ECHOMQ_URL": url, "DAGSTER_HOME": str(home)}
    env.pop("ECHOMQ_PREFIX", None)  # the README names none: the default, for both
    assert worker[:2] == ["echomq", "worker"]
    # the worker starts from the folder of my_handlers.py (`--app` imports from there)
    proc = subprocess.Popen([sys.executable, "-m", "echomq_core.cli", *worker[1:]],
                            cwd=tmp_path, env=env)  # fmt: skip
    try:
        assert materialize[:3] == ["dagster", "asset", "materialize"]
        run = subprocess.run(
            [DAGSTER, *materialize[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "RUN_SUCCESS" in run.stderr
    said = re.search(r"`total` is (\d+)", text)
    assert said is not None
    with open(home / "storage" / "total", "rb") as fh:
        assert pickle.load(fh) == int(said[1])
