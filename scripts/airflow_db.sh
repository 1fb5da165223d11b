#!/usr/bin/env bash
# `make airflow-db`: migrate the local Airflow DB (var/airflow, or the AIRFLOW_HOME given as $1)
# and apply airflow_settings.yaml (connections, pools, variables). `make run` does the same.
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
LOG_TAG=airflow-db
cd "$PROJECT_ROOT"
[[ -x "$PY" ]] || "$PROJECT_ROOT/scripts/setup.sh"
airflow_env "${1:-$PROJECT_ROOT/var/airflow}"
airflow_db_migrate ${FORCE_MIGRATE:+--force}
"$PY" "$PROJECT_ROOT/scripts/airflow_settings.py"
