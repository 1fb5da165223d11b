"""Airflow local settings: pay the task bodies' heavy imports once per worker, not per task.

Airflow imports ``airflow_local_settings`` at startup in every process (the plugins folder is
on ``sys.path``). In the process that forks the task processes (the scheduler, whose
LocalExecutor workers are forked from it; a Celery worker) this module imports what the
compaction tasks need: the engine and the Cassandra driver, pandas and Great Expectations
(about 3.5 CPU-seconds and 160 MB in all), and builds the GX suite in memory and validates once
(``checks.warm``), so a task only validates (about 0.1 CPU-s instead of 0.6 with a suite built,
stored and rendered per run). Every task process forked later inherits them instead of
importing them again. Nothing connects or leaves a thread running here (``warm`` checks), so
forking stays safe, and DAG parsing (the DAG processor) still imports none of it.

``COUNTERS_PRELOAD=0`` turns it off (e.g. to measure its effect: ``make bench-airflow``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

# The `counters` package lives in include/, next to this folder, as an Astro project lays it out
# (deployments install requirements.txt only, not the project itself): README "Deploy". Airflow
# imports this module first in every process, so the Celery settings module resolves too.
INCLUDE = str(Path(__file__).resolve().parents[1] / "include")
if INCLUDE not in sys.path:
    sys.path.insert(0, INCLUDE)

FORKING_COMMANDS = (("scheduler",), ("celery", "worker"))
"""``airflow <command>`` invocations whose children run tasks by ``fork``."""


def _forks_tasks(argv: list[str]) -> bool:
    if not argv or os.path.basename(argv[0]) != "airflow":
        return False
    return any(tuple(argv[1 : 1 + len(c)]) == c for c in FORKING_COMMANDS)


def _preload() -> None:
    started = time.process_time()
    try:
        import counters.airflow.checks

        counters.airflow.checks.quiet()  # GX logs INFO lines as it is imported
        import cassandra.cluster  # noqa: F401
        import counters.airflow.factory
        import counters.airflow.tasks
        import great_expectations  # noqa: F401
        import pandas  # noqa: F401
    except Exception:  # a task imports them itself and reports the real error there
        log.warning("counters: preloading the task modules failed", exc_info=True)
        return
    try:
        threads = counters.airflow.checks.warm()
    except Exception:  # a task builds the suite itself and reports the real error there
        log.warning("counters: warming the GX suite failed", exc_info=True)
        threads = []
    if threads:
        log.warning("counters: the GX warm-up left threads running (lost in forks): %s", threads)
    _warm_families()
    log.info("counters: task modules preloaded in %.1f CPU-s", time.process_time() - started)


def _warm_families() -> None:
    """The families YAML, parsed once here: every forked DAG-file parse reuses it (the memo
    is keyed on the file's path, mtime and size, so an edited file is parsed again)."""
    try:
        from counters.config import load_families_leniently

        load_families_leniently()
    except Exception:  # a parse reads it itself and reports the real error there
        log.warning("counters: preloading the families YAML failed", exc_info=True)


def _preload_parsing() -> None:
    """The DAG processor forks a child per DAG-file parse: the DAG factory imported and the
    YAML parsed here are inherited by each (no GX, pandas or driver: parsing needs none)."""
    started = time.process_time()
    try:
        import counters.airflow.factory  # noqa: F401
    except Exception:  # the parse imports it itself and reports the real error there
        log.warning("counters: preloading the DAG factory failed", exc_info=True)
        return
    _warm_families()
    log.info("counters: DAG factory preloaded in %.1f CPU-s", time.process_time() - started)


def _forks_parses(argv: list[str]) -> bool:
    return bool(argv) and os.path.basename(argv[0]) == "airflow" and argv[1:2] == ["dag-processor"]


if os.environ.get("COUNTERS_PRELOAD", "1") != "0":
    if _forks_tasks(sys.argv):
        _preload()
    elif _forks_parses(sys.argv):
        _preload_parsing()
