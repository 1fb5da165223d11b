#!/usr/bin/env bash
# `make test [ARGS=...]`: setup, a real Cassandra (local `test` instance on 127.0.0.1:9142 unless
# CASSANDRA_HOSTS points elsewhere), a migrated Airflow DB in var/airflow-test, then pytest.
# Arguments go to pytest. Exit code: pytest's, except 5 (no tests collected) which counts as success.
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
LOG_TAG=test
cd "$PROJECT_ROOT"

"$PROJECT_ROOT/scripts/setup.sh"

test_cassandra_scope
airflow_env "$PROJECT_ROOT/var/airflow-test"
airflow_db_migrate

log "pytest $* (Cassandra ${CASSANDRA_HOSTS}:${CASSANDRA_PORT:-9042}, AIRFLOW_HOME=var/airflow-test)"
set +e
"$PY" -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  log "pytest collected no tests (exit 5); treating that as success"
  rc=0
fi
exit "$rc"
