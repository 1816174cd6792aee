#!/usr/bin/env bash
# A venv with Dagster and EchoMQ and nothing of Airflow's, as a Dagster deployment has, for
# `python -m bench.orchestrators --only dagster --dagster-python VENV/bin/python`.
#
# Why: the suite's venv (scripts/setup.sh all) holds Airflow too, which brings the
# OpenTelemetry SDK; redis-py imports that SDK when it is installed (redis.observability), so
# a Dagster step process there pays about 0.05 s more for its first EchoMQ client than one of
# a Dagster-only deployment. Every package both venvs have gets the version of the suite's
# venv (a pip constraint), so the two differ only by what Airflow adds.
#
#   bash bench/dagster_only_venv.sh [VENV]      (default .venv-w7-dagster; ~1-2 minutes)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${1:-$ROOT/.venv-w7-dagster}
MAIN=${ECHOMQ_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
"$PY" -m venv "$VENV"
# the suite's versions, less the editable installs (this repository's three packages)
"$MAIN/bin/pip" freeze --exclude-editable | grep -v '^#' > "$VENV/constraints.txt"
"$VENV/bin/pip" install -q -c "$VENV/constraints.txt" "$ROOT" "$ROOT/dagster_integration"
if "$VENV/bin/python" -c "import opentelemetry.sdk" 2>/dev/null; then
  echo "note: $VENV has the OpenTelemetry SDK (a dependency of a package here)" >&2
fi
echo "$VENV/bin/python"
