#!/usr/bin/env bash
# `make bench [ARGS=...]`: setup, the same Cassandra as `make test` (local `test` instance on
# 127.0.0.1:9142 unless CASSANDRA_HOSTS is set), then `python -m $BENCH_MODULE ARGS`
# (default: the top-level `bench` package). Results go where that module writes them
# (var/bench/ by convention, git-ignored).
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
LOG_TAG=bench
cd "$PROJECT_ROOT"

"$PROJECT_ROOT/scripts/setup.sh"
BENCH_MODULE="${BENCH_MODULE:-bench}"
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$BENCH_MODULE') is None)"; then
  die "no benchmark module '$BENCH_MODULE'"
fi

test_cassandra_scope
airflow_env "$PROJECT_ROOT/var/airflow-test"
mkdir -p "$PROJECT_ROOT/var/bench"
log "python -m $BENCH_MODULE $* (Cassandra ${CASSANDRA_HOSTS}:${CASSANDRA_PORT:-9042})"
"$PY" -m "$BENCH_MODULE" "$@"
