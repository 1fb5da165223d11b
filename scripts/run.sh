#!/usr/bin/env bash
# `make run`: everything for a local demo, in the foreground until Ctrl-C.
#   setup -> dev Cassandra (127.0.0.1:9042, unless CASSANDRA_HOSTS) -> counterctl init --with-demo-tables
#   (on another cluster, init needs its replication: COUNTERS_REPLICATION="{'class': ...}")
#   -> Airflow DB + airflow_settings.yaml -> counterctl demo-writer (background)
#   -> airflow standalone (own process group) -> wait for /api/v2/monitor/health -> print login.
# On Ctrl-C / TERM / exit it stops Airflow (whole process group), the demo writer, and the dev
# Cassandra if this script started it, and waits for them to exit, whatever became of stdout
# (`make run | tee run.log` + Ctrl-C kills tee too: tests/integration/airflow/test_run_script.py).
# Environment: CASSANDRA_INSTANCE (dev) and CASSANDRA_PORT/_STORAGE_PORT/_JMX_PORT for the local
# node, CASSANDRA_HOSTS for an external one, AIRFLOW_PORT (8080), COUNTERS_RUN_DIR (var: the
# Airflow home var/airflow and the writer's log).
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
LOG_TAG=run
cd "$PROJECT_ROOT"

DEV_INSTANCE="${CASSANDRA_INSTANCE:-dev}"
# Where the run's Airflow home and the demo writer's log live (a test moves it to a tmp dir).
RUN_DIR="${COUNTERS_RUN_DIR:-$PROJECT_ROOT/var}"
WRITER_LOG="$RUN_DIR/demo-writer.log"
AIRFLOW_PORT="${AIRFLOW_PORT:-8080}"
AIRFLOW_START_TIMEOUT="${AIRFLOW_START_TIMEOUT:-180}"
STOP_TIMEOUT=60
WRITER_PID=""
AIRFLOW_PID=""
SLEEP_PID=""

# Alive and not a zombie.
proc_alive() {
  local stat
  stat="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  [[ -n "$stat" && "$stat" != Z* ]]
}
# Any live (non-zombie) process left in process group $1?
group_alive() {
  ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

stop_airflow() {
  [[ -n "$AIRFLOW_PID" ]] || return 0
  local pgid="$AIRFLOW_PID" i
  if group_alive "$pgid"; then
    log "stopping Airflow (SIGTERM to process group $pgid)"
    kill -TERM -- "-$pgid" 2>/dev/null || true
    for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
      group_alive "$pgid" || break
      sleep 0.2
    done
    if group_alive "$pgid"; then
      log "Airflow did not stop within ${STOP_TIMEOUT} s; SIGKILL to process group $pgid"
      kill -KILL -- "-$pgid" 2>/dev/null || true
      sleep 1
    fi
  fi
  wait "$AIRFLOW_PID" 2>/dev/null || true
  rm -f "$AIRFLOW_HOME/standalone.pid"
  AIRFLOW_PID=""
}

stop_writer() {
  [[ -n "$WRITER_PID" ]] || return 0
  local i
  if proc_alive "$WRITER_PID"; then
    log "stopping the demo writer (SIGTERM to pid $WRITER_PID)"
    kill -TERM "$WRITER_PID" 2>/dev/null || true
    for ((i = 0; i < 30 * 5; i++)); do
      proc_alive "$WRITER_PID" || break
      sleep 0.2
    done
    proc_alive "$WRITER_PID" && kill -KILL "$WRITER_PID" 2>/dev/null || true
  fi
  wait "$WRITER_PID" 2>/dev/null || true
  WRITER_PID=""
}

cleanup() {
  local rc=$?
  trap - EXIT
  trap '' INT TERM HUP   # finish the shutdown even if Ctrl-C is pressed again
  # stdout may be a pipe whose reader died with the same Ctrl-C: a failed log line must not
  # stop the shutdown (SIGPIPE is ignored above, so such a write just fails)
  set +e
  [[ -n "$SLEEP_PID" ]] && kill "$SLEEP_PID" 2>/dev/null
  stop_airflow
  stop_writer
  if [[ "$CASSANDRA_STARTED_BY_US" == 1 ]]; then
    # a Python script that prints to a dead pipe dies of it: try again with nowhere to print
    "$PY" "$NODE_SCRIPT" down --instance "$DEV_INSTANCE" \
      || "$PY" "$NODE_SCRIPT" down --instance "$DEV_INSTANCE" >/dev/null 2>&1 || rc=1
    CASSANDRA_STARTED_BY_US=0
  fi
  log "stopped"
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM
trap 'exit 129' HUP   # the terminal or the parent shell went away: still stop everything
# `make run | tee run.log` + Ctrl-C kills the pipe's reader first: a write to the dead pipe must
# not kill this script before its cleanup has stopped Airflow and Cassandra (EPIPE, not SIGPIPE).
trap '' PIPE

"$PROJECT_ROOT/scripts/setup.sh"

# --- Cassandra -------------------------------------------------------------------------------
if [[ -z "${CASSANDRA_HOSTS:-}" ]]; then
  cassandra_start "$DEV_INSTANCE"
  CASSANDRA_DESC="127.0.0.1:$(cassandra_port "$DEV_INSTANCE") (local instance '$DEV_INSTANCE')"
else
  log "CASSANDRA_HOSTS=$CASSANDRA_HOSTS is set: using that cluster, not starting a local one"
  CASSANDRA_DESC="$CASSANDRA_HOSTS:${CASSANDRA_PORT:-9042} (external)"
fi

HAVE_COUNTERCTL=0
if [[ -x "$VENV/bin/counterctl" ]] && "$VENV/bin/counterctl" --help >/dev/null 2>&1; then
  HAVE_COUNTERCTL=1
  log "counterctl init (keyspaces and tables for $(basename "$COUNTERS_CONFIG"))"
  "$VENV/bin/counterctl" init --with-demo-tables
else
  log "WARNING: counterctl is not available yet (include/counters/cli/); skipping init and the demo writer"
fi

# --- Airflow DB and settings ------------------------------------------------------------------
airflow_env "$RUN_DIR/airflow"
if [[ "$AIRFLOW_PORT" != 8080 ]]; then
  export AIRFLOW__API__PORT="$AIRFLOW_PORT"
  export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://localhost:$AIRFLOW_PORT/execution/"
fi
if ! "$PY" -c "import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', int(sys.argv[1])))" "$AIRFLOW_PORT" 2>/dev/null; then
  hint=""
  old="$(cat "$AIRFLOW_HOME/standalone.pid" 2>/dev/null || true)"
  if [[ -n "$old" ]] && group_alive "$old"; then
    hint=" A previous \`make run\` left Airflow running: stop it with \`kill -TERM -- -$old\`."
  fi
  die "port $AIRFLOW_PORT is already in use (another Airflow?).$hint Or set AIRFLOW_PORT."
fi
airflow_db_migrate
"$PY" "$PROJECT_ROOT/scripts/airflow_settings.py"

# --- Demo writer ---------------------------------------------------------------------------
if [[ "$HAVE_COUNTERCTL" == 1 ]]; then
  mkdir -p "$RUN_DIR"
  "$VENV/bin/counterctl" demo-writer >>"$WRITER_LOG" 2>&1 &
  WRITER_PID=$!
  log "demo writer started (pid $WRITER_PID, log ${WRITER_LOG#"$PROJECT_ROOT"/})"
fi

# --- Airflow standalone ------------------------------------------------------------------------
STANDALONE_LOG="$AIRFLOW_HOME/standalone.log"
log "starting airflow standalone (log ${STANDALONE_LOG#"$PROJECT_ROOT"/})"
# No job control in a script, so the child is not a group leader and setsid execs in place:
# $! is then airflow's pid, session id and process group id.
setsid "$VENV/bin/airflow" standalone >>"$STANDALONE_LOG" 2>&1 </dev/null &
AIRFLOW_PID=$!
printf '%s\n' "$AIRFLOW_PID" >"$AIRFLOW_HOME/standalone.pid"
sleep 0.5
if [[ "$(ps -o pgid= -p "$AIRFLOW_PID" 2>/dev/null | tr -d ' ')" != "$AIRFLOW_PID" ]] && proc_alive "$AIRFLOW_PID"; then
  log "WARNING: airflow (pid $AIRFLOW_PID) is not its own process group leader"
fi

HEALTH_URL="http://localhost:$AIRFLOW_PORT/api/v2/monitor/health"
t=$(now)
deadline=$((SECONDS + AIRFLOW_START_TIMEOUT))
health=""
while :; do
  if ! proc_alive "$AIRFLOW_PID"; then
    tail -n 30 "$STANDALONE_LOG" >&2 || true
    die "airflow standalone exited during startup (log above: $STANDALONE_LOG)"
  fi
  if health="$(curl -fsS -m 3 "$HEALTH_URL" 2>/dev/null)" &&
     "$PY" -c '
import json, sys
h = json.loads(sys.argv[1])
parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
sys.exit(0 if all((h.get(p) or {}).get("status") == "healthy" for p in parts) else 1)
' "$health" 2>/dev/null; then
    break
  fi
  if ((SECONDS >= deadline)); then
    tail -n 30 "$STANDALONE_LOG" >&2 || true
    die "Airflow not healthy after ${AIRFLOW_START_TIMEOUT} s (last health: ${health:-no answer}); log: $STANDALONE_LOG"
  fi
  sleep 1
done
log "Airflow healthy after $(since "$t") s"

writer_desc="not running (no counterctl)"
[[ -n "$WRITER_PID" ]] && writer_desc="pid $WRITER_PID, log ${WRITER_LOG#"$PROJECT_ROOT"/}"
PASSWORD_FILE="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
password="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("admin", "?"))' "$PASSWORD_FILE" 2>/dev/null || echo "(see $PASSWORD_FILE)")"

cat <<BANNER

================================================================================
 Airflow UI   http://localhost:$AIRFLOW_PORT
 Login        user admin   password $password
              (from ${PASSWORD_FILE#"$PROJECT_ROOT"/})
 Families     http://localhost:$AIRFLOW_PORT/plugin/counter-families (Browse > Counter families)
 Cassandra    $CASSANDRA_DESC
              .venv/bin/python scripts/cassandra_node.py cql "SELECT ..."
 Demo writer  $writer_desc
 Logs         ${STANDALONE_LOG#"$PROJECT_ROOT"/}, var/cassandra/$DEV_INSTANCE/logs/
 Stop         Ctrl-C (stops Airflow, the writer and the Cassandra this started)
================================================================================

BANNER

# Stay in the foreground; `wait` on a short sleep so traps run promptly.
while :; do
  if ! proc_alive "$AIRFLOW_PID"; then
    tail -n 30 "$STANDALONE_LOG" >&2 || true
    die "airflow standalone exited unexpectedly (log: $STANDALONE_LOG)"
  fi
  if [[ -n "$WRITER_PID" ]] && ! proc_alive "$WRITER_PID"; then
    wait "$WRITER_PID" 2>/dev/null && wrc=0 || wrc=$?
    log "WARNING: the demo writer exited (code $wrc); see ${WRITER_LOG#"$PROJECT_ROOT"/}"
    WRITER_PID=""
  fi
  sleep 5 &
  SLEEP_PID=$!
  wait "$SLEEP_PID" || true
done
