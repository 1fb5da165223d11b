# Entry points. The work is done by scripts/*.sh (shared environment: scripts/env.sh).
#   make run            local Cassandra + Airflow + demo writer, until Ctrl-C
#   make test           pytest against a real Cassandra (instance `test`, port 9142)
#   make test ARGS="tests/integration -k status"
SHELL := /bin/bash
PY := .venv/bin/python
NODE := $(PY) scripts/cassandra_node.py
INSTANCE ?= $(or $(CASSANDRA_INSTANCE),dev)
ARGS ?=

.PHONY: help setup run test bench bench-airflow lint format docs mwaa helm clean distclean cassandra-up cassandra-down \
        cassandra-status cql airflow-db cluster-up cluster-down cluster-status

help:
	@echo "make run | test [ARGS=...] | bench [ARGS=...] | bench-airflow [ARGS=...] | setup | lint | format | docs | clean | distclean"
	@echo "make cassandra-up | cassandra-down | cassandra-status [INSTANCE=dev|test]"
	@echo "make cql Q='SELECT ...' | cql F=file.cql [INSTANCE=...]"
	@echo "make cluster-up | cluster-down | cluster-status [CLUSTER=cluster] [ARGS=...]"
	@echo "make airflow-db   (migrate var/airflow and apply airflow_settings.yaml)"
	@echo "make mwaa | helm  (dist/mwaa: plugins.zip + requirements.txt; dist/helm: image recipe + values.yaml)"

setup:
	@scripts/setup.sh

run:
	@scripts/run.sh

test:
	@scripts/test.sh $(ARGS)

bench:
	@scripts/bench.sh $(ARGS)

bench-airflow:
	@scripts/bench_airflow.sh $(ARGS)

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

format: setup
	.venv/bin/ruff format .

docs: setup
	$(PY) scripts/cli_reference.py
	$(PY) -m bench.results

# What MWAA and the Helm chart take (docs/deploy.md; not deployed from this machine)
mwaa: setup
	@scripts/package.sh mwaa

helm: setup
	@scripts/package.sh helm

cassandra-up: setup
	@$(NODE) up --instance $(INSTANCE)

cassandra-down:
	@$(NODE) down --instance $(INSTANCE)

cassandra-status:
	@$(NODE) status --instance $(INSTANCE)

cql:
	@$(NODE) cql --instance $(INSTANCE) $(if $(F),-f "$(F)",$(if $(Q),"$(Q)",--help))

# A local cluster (nodes on 127.0.0.1..3): docs/cluster.md. ARGS e.g. "--auth --node 2 --kill".
CLUSTER ?= cluster
cluster-up: setup
	@$(NODE) up --cluster $(CLUSTER) $(ARGS)

cluster-down:
	@$(NODE) down --cluster $(CLUSTER) $(ARGS)

cluster-status:
	@$(NODE) status --cluster $(CLUSTER) $(ARGS)

airflow-db: setup
	@FORCE_MIGRATE=1 scripts/airflow_db.sh

# Stops local Cassandra instances first, then removes runtime state (Cassandra data, Airflow
# homes, logs) and tool caches. Keeps .venv and .cache (slow to rebuild): see distclean.
clean:
	@pid=$$(cat var/airflow/standalone.pid 2>/dev/null); \
	if [[ -n "$$pid" ]] && kill -0 -- "-$$pid" 2>/dev/null; then \
	  echo "Airflow from \`make run\` is still running (process group $$pid); stop it first"; exit 1; \
	fi
	@if [[ -x $(PY) && -d var/cassandra ]]; then \
	  for d in var/cassandra/*/; do \
	    [[ -d "$$d" ]] && env -u CASSANDRA_HOSTS $(NODE) down --instance "$$(basename "$$d")"; \
	  done; \
	fi; true
	rm -rf var .pytest_cache .ruff_cache .hypothesis build dist
	find . -path ./.venv -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path ./.venv -prune -o -name '*.egg-info' -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf .venv .cache
