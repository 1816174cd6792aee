#!/usr/bin/env bash
# The demo, on a fresh machine: installs EchoMQ into .venv, starts an embedded Valkey server,
# fans a flow out to 1,000 children across two queues, fans it back in, prints the reads.
# Extra arguments go to `echomq demo` (e.g. `bash scripts/demo.sh --children 10000 --json`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${ECHOMQ_VENV:-.venv}
exec "$VENV/bin/echomq" demo "$@"
