#!/usr/bin/env bash
# `make mwaa` / `make helm`: build what each platform takes into dist/<platform>/ (docs/deploy.md).
# Neither output was deployed from this machine (no AWS account, no Kubernetes or Docker here).
#   mwaa: the package's wheel inside plugins.zip, and a requirements.txt that starts with the
#         constraints line MWAA documents, then requirements.txt's ranges, then the wheel.
#   helm: the wheel, an image recipe (Dockerfile FROM the official image) and values.yaml (a
#         snippet for the apache-airflow/airflow chart: image, env, config.metrics, the statsd
#         mapping of docs/monitoring/statsd_exporter.yml).
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
LOG_TAG=package
cd "$PROJECT_ROOT"

target="${1:?usage: scripts/package.sh mwaa|helm}"
airflow_version="$(sed -n 's/^apache-airflow==//p' requirements-dev.txt)"
python_version="${PLATFORM_PYTHON:-3.12}"   # MWAA's and the image's Python (the Dockerfile's)
constraints="https://raw.githubusercontent.com/apache/airflow/constraints-${airflow_version}/constraints-${python_version}.txt"
out="dist/$target"
rm -rf "$out"
mkdir -p "$out"

# the wheel: the package with its UI assets, its dependencies' ranges and its plugin entry point
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$out" .
rm -rf build include/*.egg-info
wheel="$(cd "$out" && ls counters_compaction-*.whl)"

case "$target" in
mwaa)
  (cd "$out" && "$PY" -m zipfile -c plugins.zip "$wheel")
  {
    echo "--constraint \"$constraints\""
    grep -v '^#' requirements.txt | grep -v '^$'
    echo "/usr/local/airflow/plugins/$wheel"
  } >"$out/requirements.txt"
  rm "$out/$wheel"
  log "$out/plugins.zip and $out/requirements.txt (upload both; dags/*.py and the families YAML to the DAGs folder)"
  ;;
helm)
  cp requirements.txt "$out/requirements.txt"
  cat >"$out/Dockerfile" <<DOCKERFILE
# The image the apache-airflow/airflow chart runs (values.yaml: images.airflow). Build in
# $out: docker build -t REGISTRY/counters-airflow:TAG .
FROM apache/airflow:${airflow_version}-python${python_version}
COPY requirements.txt $wheel /tmp/counters/
RUN pip install --no-cache-dir -r /tmp/counters/requirements.txt --constraint "$constraints" \\
 && pip install --no-cache-dir --no-deps /tmp/counters/$wheel
ENV GX_ANALYTICS_ENABLED=false
DOCKERFILE
  "$PY" - "$out/values.yaml" <<'PYTHON'
import sys

import yaml

mapping = yaml.safe_load(open("docs/monitoring/statsd_exporter.yml"))["mappings"]
values = {
    "images": {"airflow": {"repository": "REGISTRY/counters-airflow", "tag": "TAG"}},
    "env": [
        {"name": "GX_ANALYTICS_ENABLED", "value": "false"},
        # the families YAML ships with the DAG files (git-sync or the image's dags folder)
        {"name": "COUNTERS_CONFIG", "value": "/opt/airflow/dags/repo/dags/counter_families.yaml"},
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
    "# deployed from the machine that built it. Replace REGISTRY, TAG, BUCKET and the secret.\n"
)
with open(sys.argv[1], "w") as out:
    out.write(header + yaml.safe_dump(values, sort_keys=False))
PYTHON
  log "$out/Dockerfile (+ the wheel, requirements.txt) and $out/values.yaml"
  ;;
*)
  die "unknown target '$target' (mwaa or helm)"
  ;;
esac
