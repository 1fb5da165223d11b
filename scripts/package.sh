#!/usr/bin/env bash
# `make mwaa` / `make helm`: build what each platform takes into dist/<platform>/ (docs/deploy.md).
# Neither output was deployed from this machine (no AWS account, no Kubernetes or Docker here).
#   both: constraints.txt, Airflow's constraints file for the version and Python with the
#         project's overrides (scripts/airflow_constraints.py overlay). Airflow's file is
#         $AIRFLOW_CONSTRAINTS (a path or URL) if set, else fetched from Airflow's GitHub, else
#         (unreachable) the deploy test's stand-in for it, which the file's header then says.
#   mwaa: the package's wheel inside plugins.zip; dags/constraints-counters-<py>.txt (MWAA's way
#         to override its constraints: a file in the DAGs folder); requirements.txt naming it,
#         then requirements.txt's ranges, then the wheel; startup.sh (the environment's
#         variables); requirements-private-webserver.txt and README.txt (what a private web
#         server needs: every wheel in plugins.zip, no index).
#   helm: the wheel, an image recipe (Dockerfile FROM the official image, installing with
#         apache-airflow==<version> on the pip line under constraints.txt) and values.yaml (a
#         snippet for the apache-airflow/airflow chart: airflowVersion, image, dags.gitSync, env,
#         config.metrics, the statsd mapping of docs/monitoring/statsd_exporter.yml).
#   wheel: the wheel alone (dist/wheel/). WHEEL=path gives mwaa and helm a wheel built already
#         instead of building one (a test session builds it once for its checks).
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
LOG_TAG=package
cd "$PROJECT_ROOT"

target="${1:?usage: scripts/package.sh mwaa|helm|wheel}"
case "$target" in mwaa | helm | wheel) ;; *) die "unknown target '$target' (mwaa, helm or wheel)" ;; esac
airflow_version="$(sed -n 's/^apache-airflow==//p' requirements-dev.txt)"
python_version="${PLATFORM_PYTHON:-3.12}"   # MWAA's and the image's Python (the Dockerfile's)
airflow_constraints="https://raw.githubusercontent.com/apache/airflow/constraints-${airflow_version}/constraints-${python_version}.txt"
stand_in="tests/integration/deploy/airflow-constraints/constraints-${airflow_version}/constraints-${python_version}.txt"
# the cluster the asset URIs name (docs/airflow.md "Assets"): required outside local development
asset_cluster="${COUNTERS_ASSET_CLUSTER:-CASSANDRA_HOST:9042}"
out="dist/$target"
rm -rf "$out"
mkdir -p "$out"

# Airflow's constraints file, then the project's overrides on it (not for the wheel alone)
if [[ $target != wheel ]]; then
source_file="$out/.airflow-constraints.txt"
origin="${AIRFLOW_CONSTRAINTS:-$airflow_constraints}"
if [[ -f "$origin" ]]; then
  cp "$origin" "$source_file"
elif "$PY" - "$origin" "$source_file" <<'PYTHON' 2>/dev/null; then
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=20) as answer:
    open(sys.argv[2], "wb").write(answer.read())
PYTHON
  :
elif [[ -z "${AIRFLOW_CONSTRAINTS:-}" && -f "$stand_in" ]]; then
  log "WARNING: $origin is unreachable: using the deploy test's stand-in, $stand_in (say AIRFLOW_CONSTRAINTS=<file or URL> for Airflow's own)"
  origin="$stand_in (a stand-in: Airflow's own file was unreachable)"
  cp "$stand_in" "$source_file"
else
  die "cannot read Airflow's constraints file $origin (AIRFLOW_CONSTRAINTS names another)"
fi
{
  echo "# Airflow ${airflow_version}'s constraints for Python ${python_version}, from ${origin},"
  echo "# with counters-compaction's overrides (scripts/airflow_constraints.py overlay)."
  "$PY" scripts/airflow_constraints.py overlay "$source_file" "$python_version"
} >"$out/constraints.txt"
rm "$source_file"
fi

# the wheel: the package with its UI assets, its dependencies' ranges and its plugin entry point
if [[ -n "${WHEEL:-}" ]]; then
  [[ -f "$WHEEL" ]] || die "WHEEL=$WHEEL: no such file"
  cp "$WHEEL" "$out/"
else
  # built from a copy: setuptools writes include/*.egg-info while it builds, which a process
  # reading the installed package's metadata meanwhile (a test in the other lane) takes for it
  src="$(mktemp -d)"
  tar -c --exclude=./.venv --exclude=./.cache --exclude=./var --exclude=./dist --exclude=./.git \
    --exclude=./build . | tar -x -C "$src"
  target_dir="$(pwd)/$out"
  (cd "$src" && "$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$target_dir" .)
  rm -rf "$src"
fi
wheel="$(cd "$out" && ls counters_compaction-*.whl)"
ranges="$(grep -v '^#' requirements.txt | grep -v '^$')"

case "$target" in
wheel)
  log "$out/$wheel"
  ;;
mwaa)
  (cd "$out" && "$PY" -m zipfile -c plugins.zip "$wheel")
  # MWAA's documented override: a constraints file of one's own in the DAGs folder
  constraints_name="constraints-counters-${python_version}.txt"
  mkdir -p "$out/dags"
  mv "$out/constraints.txt" "$out/dags/$constraints_name"
  {
    echo "--constraint \"/usr/local/airflow/dags/$constraints_name\""
    echo "$ranges"
    echo "/usr/local/airflow/plugins/$wheel"
  } >"$out/requirements.txt"
  {
    echo "--find-links /usr/local/airflow/plugins"
    echo "--no-index"
    cat "$out/requirements.txt"
  } >"$out/requirements-private-webserver.txt"
  cat >"$out/startup.sh" <<STARTUP
#!/bin/sh
# MWAA startup script (the environment's "startup script" in S3): the variables every Airflow
# component needs (README "Deploy"). Replace CASSANDRA_HOST and BUCKET.
export COUNTERS_ASSET_CLUSTER="${asset_cluster}"
export COUNTERS_GX_RESULTS="s3://BUCKET/counters/gx-results"
export GX_ANALYTICS_ENABLED=false
STARTUP
  cat >"$out/README.txt" <<README
counters-compaction for Amazon MWAA (Airflow ${airflow_version}, Python ${python_version}); built by
\`make mwaa\`, not deployed from the machine that built it. docs/deploy.md has the whole recipe.

Upload to the environment's S3 bucket:
  plugins.zip                 the package's wheel (/usr/local/airflow/plugins/${wheel})
  requirements.txt            --constraint naming the file below, the ranges, then the wheel
  dags/${constraints_name}
                              Airflow's constraints file with the project's overrides, in the
                              DAGs folder, as MWAA documents for overriding its constraints
  dags/*.py and your counter_families.yaml, into the DAGs folder
  startup.sh                  as the startup script: COUNTERS_ASSET_CLUSTER (required), and
                              COUNTERS_GX_RESULTS; replace CASSANDRA_HOST and BUCKET
and the Airflow connection cassandra_default (a secrets backend, or the Airflow UI).

Private web server (no internet access from the environment): pip cannot reach PyPI, so
plugins.zip must hold every wheel requirements.txt needs, for MWAA's platform, and
requirements.txt must install from it only. Build the wheels where PyPI is reachable:
  pip download -r requirements.txt --constraint dags/${constraints_name} \\
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \\
    --python-version ${python_version} --only-binary=:all: -d plugins/
  (drop the last line of requirements.txt, the wheel's MWAA path, for that command), add
  ${wheel} to plugins/, zip plugins/ as plugins.zip, and upload
  requirements-private-webserver.txt as requirements.txt (--find-links
  /usr/local/airflow/plugins --no-index, then the same lines).
README
  rm "$out/$wheel"
  log "$out: plugins.zip, requirements.txt, dags/$constraints_name, startup.sh (README.txt says where each goes)"
  ;;
helm)
  cp requirements.txt "$out/requirements.txt"
  cat >"$out/Dockerfile" <<DOCKERFILE
# The image the apache-airflow/airflow chart runs (values.yaml: images.airflow). Build in
# $out: docker build -t REGISTRY/counters-airflow:TAG .
# apache-airflow==${airflow_version} on the pip line, as Airflow's docker-stack docs say, so pip
# keeps the image's Airflow; constraints.txt is Airflow's with the project's overrides.
FROM apache/airflow:${airflow_version}-python${python_version}
COPY requirements.txt constraints.txt $wheel /tmp/counters/
RUN pip install --no-cache-dir "apache-airflow==${airflow_version}" -r /tmp/counters/requirements.txt \\
      --constraint /tmp/counters/constraints.txt \\
 && pip install --no-cache-dir --no-deps /tmp/counters/$wheel
ENV GX_ANALYTICS_ENABLED=false
DOCKERFILE
  "$PY" - "$out/values.yaml" "$airflow_version" "$asset_cluster" <<'PYTHON'
import sys

import yaml

out, airflow_version, asset_cluster = sys.argv[1:4]
mapping = yaml.safe_load(open("docs/monitoring/statsd_exporter.yml"))["mappings"]
# git-sync checks the repository out under /opt/airflow/dags/repo; the DAG folder is its subPath
sub_path = "dags"
values = {
    "airflowVersion": airflow_version,
    "images": {"airflow": {"repository": "REGISTRY/counters-airflow", "tag": "TAG"}},
    "dags": {
        "gitSync": {
            "enabled": True,
            "repo": "GIT_REPO_URL",
            "branch": "main",
            "subPath": sub_path,
        }
    },
    "env": [
        {"name": "GX_ANALYTICS_ENABLED", "value": "false"},
        # the families YAML ships with the DAG files, in the git-synced DAG folder
        {
            "name": "COUNTERS_CONFIG",
            "value": f"/opt/airflow/dags/repo/{sub_path}/counter_families.yaml",
        },
        # the cluster in the families' asset URIs: required outside local development
        {"name": "COUNTERS_ASSET_CLUSTER", "value": asset_cluster},
        {"name": "COUNTERS_GX_RESULTS", "value": "s3://BUCKET/counters/gx-results"},
    ],
    "secret": [
        {"envName": "AIRFLOW_CONN_CASSANDRA_DEFAULT", "secretName": "counters-cassandra",
         "secretKey": "connection"},
    ],
    "config": {
        "metrics": {
            "statsd_on": True,
            "statsd_port": 9125,
            "statsd_prefix": "airflow",
            # tags (family, outcome) in a format the exporter parses into labels
            "statsd_influxdb_enabled": True,
        }
    },
    "statsd": {"enabled": True, "extraMappings": mapping},
}
header = (
    "# values.yaml snippet for the apache-airflow/airflow Helm chart (docs/deploy.md); not\n"
    "# deployed from the machine that built it. Replace REGISTRY, TAG, GIT_REPO_URL,\n"
    "# CASSANDRA_HOST, BUCKET and the secret.\n"
)
with open(out, "w") as file:
    file.write(header + yaml.safe_dump(values, sort_keys=False))
PYTHON
  log "$out/Dockerfile (+ the wheel, requirements.txt, constraints.txt) and $out/values.yaml"
  ;;
esac
