#!/usr/bin/env bash
# `make bench-airflow [ARGS=...]`: what minute runs cost in Airflow. Setup, the same Cassandra as
# `make test` (local `test` instance unless CASSANDRA_HOSTS is set), a migrated Airflow DB in
# var/airflow-bench, then `python -m bench.orchestration ARGS` (it starts and stops
# `airflow standalone` itself). Results: a new var/bench/<start>-<commit>-airflow.json (never
# written over).
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
LOG_TAG=bench-airflow
cd "$PROJECT_ROOT"

"$PROJECT_ROOT/scripts/setup.sh"
test_cassandra_scope
airflow_env "$PROJECT_ROOT/var/airflow-bench"
# a fresh deployment's metadata DB, as the keyspace is (its size after the run is reported)
rm -f "$AIRFLOW_HOME/airflow.db" "$AIRFLOW_HOME/.db-migrated"
airflow_db_migrate
mkdir -p "$PROJECT_ROOT/var/bench"
log "python -m bench.orchestration $* (Cassandra ${CASSANDRA_HOSTS}:${CASSANDRA_PORT:-9042})"
"$PY" -m bench.orchestration "$@"
