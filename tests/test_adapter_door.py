"""The adapters go through the public face: no Airflow or Dagster module drives an operation,
reaches for a client's connection or builds a raw command. What they need is a method of
``EchoMQ`` / ``AsyncEchoMQ`` or a name of ``echomq_core`` (which modules they may import is
import-linter's forbidden contract in pyproject.toml)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = [
    ROOT / "airflow_provider" / "echomq_provider",
    ROOT / "dagster_integration" / "dagster_echomq",
]
#: What only the core may do: drive an operation, use a connection, build a command.
RAW = re.compile(r"\.perform\(|\.connection\.|Call\.cmd")


def test_no_adapter_sends_a_raw_command() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for folder in ADAPTERS
        for path in sorted(folder.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if RAW.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_check_sees_each_raw_form() -> None:
    for line in ("mq.perform(op)", "client.connection.execute([])", 'Call.cmd("GET", k)'):
        assert RAW.search(line), line
    assert not RAW.search("mq.verdict(wait)")
