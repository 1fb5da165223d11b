#!/usr/bin/env bash
# `make test [ARGS=...]`: setup, a real Cassandra (local `test` instance on 127.0.0.1:9142 unless
# CASSANDRA_HOSTS points elsewhere), a migrated Airflow DB in var/airflow-test, then pytest.
# Arguments go to pytest; with none, the whole suite runs as two sessions side by side
# (tests/lanes.py). Exit code: pytest's; 5 (no tests collected) is a failure: a selection
# that matches nothing proves nothing.
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
LOG_TAG=test
cd "$PROJECT_ROOT"
started_at=$(now)

"$PROJECT_ROOT/scripts/setup.sh"

# The browser test drives Debian's chromium (tests/integration/airflow/test_ui_browser.py).
# Installed here when missing on Debian, as root or with passwordless sudo, so CI's fresh
# machine runs that test too (about a minute, once). Where it is still missing the test is
# skipped and says why, except under CI (CI=true, which .ci/run sets), where it fails.
as_root=()
[[ "$(id -u)" != 0 ]] && sudo -n true 2>/dev/null && as_root=(sudo -n)
if [[ ! -x /usr/bin/chromium && -f /etc/debian_version ]] && [[ "$(id -u)" == 0 || ${#as_root[@]} -gt 0 ]]; then
  t=$(now)
  log "installing Debian's chromium for the browser test (apt-get)"
  if "${as_root[@]}" apt-get update -qq &&
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; then
    log "chromium installed in $(since "$t") s: $(/usr/bin/chromium --version 2>/dev/null)"
  else
    log "WARNING: apt-get could not install chromium; the browser test will be skipped (failed under CI)"
  fi
elif [[ ! -x /usr/bin/chromium ]]; then
  log "WARNING: Debian's chromium is missing and cannot be installed here (not Debian, or neither root nor passwordless sudo); the browser test will be skipped (failed under CI)"
fi

test_cassandra_scope
airflow_env "$PROJECT_ROOT/var/airflow-test"
airflow_db_migrate

set +e
if [[ $# -eq 0 ]]; then
  # the whole suite: two pytest sessions side by side, split by what their tests share
  # (tests/lanes.py); with arguments, one session runs what they select
  log "pytest in two lanes, tests/lanes.py (Cassandra ${CASSANDRA_HOSTS}:${CASSANDRA_PORT:-9042}, AIRFLOW_HOME=var/airflow-test)"
  "$PY" -m tests.lanes
  rc=$?
else
  log "pytest $* (Cassandra ${CASSANDRA_HOSTS}:${CASSANDRA_PORT:-9042}, AIRFLOW_HOME=var/airflow-test)"
  "$PY" -m pytest "$@"
  rc=$?
fi
set -e
if [[ $rc -eq 5 ]]; then
  log "ERROR: pytest collected no tests (exit 5): check the selection ($*)"
fi
# pytest's own share, each tier's and the slowest tests are in its "time budget" section above
log "make test took $(since "$started_at") s in all (setup, Cassandra, Airflow DB and pytest)"
exit "$rc"
