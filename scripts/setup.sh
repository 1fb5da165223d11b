#!/usr/bin/env bash
# `make setup`: idempotent. Creates .venv (python3.11) if missing, installs requirements-dev.txt
# (requirements.txt, what a deployment installs, plus Airflow and the test tools) at the versions
# of requirements-lock.txt, only when one of
# them changed since the last successful install (stamp in .venv), installs this project editable
# (--no-deps) when pyproject.toml changed, and fetches the Cassandra jars once.
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
LOG_TAG=setup
cd "$PROJECT_ROOT"

pip_quiet=()
[[ -n "${CI:-}" ]] && pip_quiet=(--progress-bar off)

if [[ ! -x "$PY" ]]; then
  command -v "$PYTHON_FOR_VENV" >/dev/null || die "$PYTHON_FOR_VENV not found (set PYTHON_FOR_VENV)"
  t=$(now)
  log "creating .venv with $("$PYTHON_FOR_VENV" --version)"
  "$PYTHON_FOR_VENV" -m venv "$VENV"
  "$PY" -m pip install -q "${pip_quiet[@]}" --disable-pip-version-check "pip==$PIP_VERSION"
  log "venv created in $(since "$t") s"
fi

req_stamp="$VENV/.requirements.sha256"
req_hash="$(cat requirements.txt requirements-dev.txt requirements-lock.txt | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$req_stamp" 2>/dev/null || true)" != "$req_hash" ]]; then
  t=$(now)
  log "pip install -r requirements-dev.txt -c requirements-lock.txt (first time: ~700 MB from PyPI)"
  "$PY" -m pip install -q "${pip_quiet[@]}" --disable-pip-version-check -r requirements-dev.txt \
    -c requirements-lock.txt
  printf '%s\n' "$req_hash" >"$req_stamp"
  log "requirements installed in $(since "$t") s"
else
  log "requirements.txt and requirements-dev.txt unchanged since the last install; skipping pip"
fi

proj_stamp="$VENV/.project.sha256"
proj_hash="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ "$(cat "$proj_stamp" 2>/dev/null || true)" != "$proj_hash" || ! -x "$VENV/bin/counterctl" ]]; then
  t=$(now)
  log "pip install --no-deps -e . (package 'counters' from include/)"
  "$PY" -m pip install -q "${pip_quiet[@]}" --disable-pip-version-check --no-deps -e .
  # the build leaves include/*.egg-info: with include/ on a PYTHONPATH it would be a second copy
  # of the distribution, and Airflow would find the plugin's entry point twice
  rm -rf include/*.egg-info
  printf '%s\n' "$proj_hash" >"$proj_stamp"
  log "project installed in $(since "$t") s"
fi

# Cassandra jars from Maven Central into .cache/ (no-op when present).
"$PY" "$NODE_SCRIPT" fetch

# The CSS/JS that GX Data Docs load from CDNs, from the npm registry into .cache/ (no-op when
# present), so the UI plugin serves Data Docs that render offline. Without npm: a warning.
"$PY" -m counters.airflow.ui.datadocs fetch || true
