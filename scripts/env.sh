# shellcheck shell=bash
# Shared environment for scripts/setup.sh, run.sh, test.sh and bench.sh (sourced, not executed).
# One place for paths and the Airflow/Cassandra variables, so `make run`, `make test` and
# `make bench` agree.

PROJECT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$PROJECT_ROOT/.venv"
PY="$VENV/bin/python"
PYTHON_FOR_VENV="${PYTHON_FOR_VENV:-python3.11}"
NODE_SCRIPT="$PROJECT_ROOT/scripts/cassandra_node.py"
PIP_VERSION="26.3"   # pip used to resolve requirements-dev.txt (pinned for reproducibility)

export PATH="$VENV/bin:$PATH"
# pip's cache in the project: `make setup` fills what the deploy test's clean venv installs from
# (tests/integration/deploy), so a fresh machine downloads Airflow once, not twice.
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$PROJECT_ROOT/.cache/pip}"
# The families the DAGs and counterctl use: the demo families (a deployment keeps its own in
# the DAG folder, or names them in COUNTERS_CONFIG).
export COUNTERS_CONFIG="${COUNTERS_CONFIG:-$PROJECT_ROOT/include/examples/counter_families.yaml}"
# The local dev setup: a local-folder archive (the demo's var/archive) is expected here.
export COUNTERS_LOCAL_DEV=1
# Great Expectations: never phone home (it does not today, but keep it explicit).
export GX_ANALYTICS_ENABLED=false

# Airflow settings shared by run (var/airflow), test (var/airflow-test) and bench.
# Usage: airflow_env <AIRFLOW_HOME>
airflow_env() {
  export AIRFLOW_HOME="$1"
  export AIRFLOW__CORE__DAGS_FOLDER="$PROJECT_ROOT/dags"
  export AIRFLOW__CORE__PLUGINS_FOLDER="$PROJECT_ROOT/plugins"
  export AIRFLOW__CORE__LOAD_EXAMPLES=False
  export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False
  export AIRFLOW__CORE__PARALLELISM=8
  # Minute DAGs at scale (docs/airflow.md "Settings for minute DAGs" says why each):
  export AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL="${AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL:-30}"
  export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="${AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL:-120}"
  export AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES="${AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES:-1}"
  export AIRFLOW__CORE__MP_START_METHOD="${AIRFLOW__CORE__MP_START_METHOD:-fork}"
  mkdir -p "$AIRFLOW_HOME"
}

# Run the airflow CLI quietly (its graphviz UserWarning goes to stdout otherwise).
airflow_cli() {
  PYTHONWARNINGS=ignore "$VENV/bin/airflow" "$@"
}

# `airflow db migrate`, skipped when this AIRFLOW_HOME's DB was already migrated by this
# Airflow version (stamp file next to the DB). Usage: airflow_db_migrate [--force]
airflow_db_migrate() {
  local stamp="$AIRFLOW_HOME/.db-migrated" want
  want="$("$PY" -c 'import importlib.metadata as m; print(m.version("apache-airflow-core"))')"
  if [[ "${1:-}" != "--force" && -f "$AIRFLOW_HOME/airflow.db" && -f "$stamp" \
        && "$(cat "$stamp")" == "$want" ]]; then
    log "Airflow DB in ${AIRFLOW_HOME#"$PROJECT_ROOT"/} is migrated (airflow $want); skipping db migrate"
    return 0
  fi
  log "airflow db migrate (AIRFLOW_HOME=${AIRFLOW_HOME#"$PROJECT_ROOT"/})"
  local out
  if ! out="$(airflow_cli db migrate 2>&1)"; then
    printf '%s\n' "$out" | tail -30 >&2
    die "airflow db migrate failed"
  fi
  printf '%s\n' "$want" >"$stamp"
}

cassandra_node() {
  "$PY" "$NODE_SCRIPT" "$@"
}

# Start a local Cassandra instance unless it already runs. Sets CASSANDRA_STARTED_BY_US=1 when
# this call started it (then the caller stops it on exit). Usage: cassandra_start INSTANCE [args]
CASSANDRA_STARTED_BY_US=0
cassandra_start() {
  local instance="$1"; shift
  if cassandra_node status --instance "$instance" >/dev/null 2>&1; then
    cassandra_node up --instance "$instance" "$@"   # prints "already running"
  else
    CASSANDRA_STARTED_BY_US=1
    cassandra_node up --instance "$instance" "$@"
  fi
}

# Native port of a running local instance. Usage: cassandra_port INSTANCE
cassandra_port() {
  cassandra_node status --instance "$1" --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["native_port"])'
}

# The local Cassandra for tests and benchmarks: unless CASSANDRA_HOSTS names an external cluster,
# start the `test` instance (127.0.0.1:9142; CASSANDRA_TEST_PORT overrides) if it is not running,
# and export CASSANDRA_HOSTS/CASSANDRA_PORT/CASSANDRA_LOCAL_INSTANCE for the code under test.
# Pair with test_cassandra_end in an EXIT trap (test_cassandra_scope does both): it stops the node
# only if this script started it.
TEST_INSTANCE="${CASSANDRA_TEST_INSTANCE:-test}"
test_cassandra_begin() {
  if [[ -n "${CASSANDRA_HOSTS:-}" ]]; then
    log "CASSANDRA_HOSTS=$CASSANDRA_HOSTS is set: using that cluster (port ${CASSANDRA_PORT:-9042})"
    return 0
  fi
  # 2 GiB of heap: a test session creates a few hundred tables (six per family), and each costs
  # the node heap until the session drops its keyspaces (1 GiB ran out of old generation)
  local up_args=(--heap "${CASSANDRA_TEST_HEAP:-2G}" --allow-big-heap)
  [[ -n "${CASSANDRA_TEST_PORT:-}" ]] && up_args+=(--port "$CASSANDRA_TEST_PORT")
  # An exported CASSANDRA_PORT means the dev node's port; the test instance has its own.
  CASSANDRA_PORT='' cassandra_start "$TEST_INSTANCE" "${up_args[@]}"
  CASSANDRA_PORT="$(cassandra_port "$TEST_INSTANCE")"
  export CASSANDRA_HOSTS=127.0.0.1 CASSANDRA_PORT CASSANDRA_LOCAL_INSTANCE="$TEST_INSTANCE"
}
test_cassandra_end() {
  if [[ "$CASSANDRA_STARTED_BY_US" == 1 ]]; then
    CASSANDRA_STARTED_BY_US=0
    env -u CASSANDRA_HOSTS "$PY" "$NODE_SCRIPT" down --instance "$TEST_INSTANCE"
  fi
}
# test_cassandra_begin plus the traps that pair it with test_cassandra_end: on exit (also on
# Ctrl-C or SIGTERM) the node this script started is stopped, and the exit code is kept (made 1
# if stopping failed).
test_cassandra_scope() {
  trap _test_cassandra_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  test_cassandra_begin
}
_test_cassandra_exit() {
  local rc=$?
  trap - EXIT
  trap '' INT TERM
  test_cassandra_end || rc=1
  exit "$rc"
}

log() { printf '[%s] %s\n' "${LOG_TAG:-make}" "$*"; }
die() { printf '[%s] ERROR: %s\n' "${LOG_TAG:-make}" "$*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v s="$1" -v n="$(now)" 'BEGIN{printf "%.1f", n-s}'; }
