"""The heavy imports paid once per Airflow component, not per task or per DAG-file parse.

Airflow calls a listener's ``on_starting`` when a job is built (``airflow.jobs.job.Job``:
the scheduler, the DAG processor and the triggerer, before their job runs, so before they fork
anything) and again in every task process (with a marker that is not a job: skipped). The
plugin (:mod:`counters.airflow.plugin`) registers :class:`PreloadListener`, which then imports
what the process's children need, so every child forked later inherits it:

- the scheduler (whose LocalExecutor workers fork the task processes): the engine, the
  Cassandra driver, pandas and Great Expectations (about 3.5 CPU-seconds and 160 MB), with the
  GX suite built in memory and validated once, and each configured family's suite built
  (``checks.warm``), so a task only validates; and Jinja's extensions, which every task
  process's template environment loads (the task runner and the DAG bag it parses with come
  with the scheduler's own imports);
- the DAG processor (a fork per DAG-file parse): the DAG factory and the families YAML only.

Nothing connects or leaves a thread running here (``warm`` checks), so forking stays safe. A
Celery worker builds no job, so no listener runs there: :func:`preload_for_process` is what its
settings call (``counters.airflow.celery_local`` does; docs/airflow.md). ``COUNTERS_PRELOAD=0``
turns it off (e.g. to measure its effect: ``make bench-airflow``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

PRELOAD_ENV = "COUNTERS_PRELOAD"
FORKING_COMMANDS = (("scheduler",), ("celery", "worker"))
"""``airflow <command>`` invocations whose children run tasks by ``fork``."""
PARSING_COMMANDS = (("dag-processor",),)
"""``airflow <command>`` invocations whose children parse DAG files by ``fork``."""

_ran: set[str] = set()
"""The preloads this process ran: a Celery scheduler reaches the preload twice (its Celery
settings, then its job's listener)."""


def _runs(argv: list[str], commands: tuple[tuple[str, ...], ...]) -> bool:
    if not argv or os.path.basename(argv[0]) != "airflow":
        return False
    return any(tuple(argv[1 : 1 + len(c)]) == c for c in commands)


def forks_tasks(argv: list[str]) -> bool:
    """Whether ``argv`` is an Airflow process that forks task processes. Pure."""
    return _runs(argv, FORKING_COMMANDS)


def forks_parses(argv: list[str]) -> bool:
    """Whether ``argv`` is an Airflow process that forks DAG-file parses. Pure."""
    return _runs(argv, PARSING_COMMANDS)


def preload_tasks() -> None:
    """The task bodies' imports and the warmed GX suite (a failure is logged: the task imports
    them itself and reports the real error there)."""
    started = time.process_time()
    try:
        from counters.gx import checks

        checks.quiet()  # GX logs INFO lines as it is imported
        import cassandra.cluster  # noqa: F401
        import great_expectations  # noqa: F401
        import jinja2.ext  # noqa: F401  (each task's template environment: ``jinja2.ext.do``)
        import pandas  # noqa: F401

        import counters.airflow.factory
        import counters.airflow.tasks  # noqa: F401
    except Exception:
        log.warning("counters: preloading the task modules failed", exc_info=True)
        return
    families = warm_families()
    warm_code_version()
    try:
        threads = checks.warm(families)
    except Exception:  # a task builds the suite itself and reports the real error there
        log.warning("counters: warming the GX suite failed", exc_info=True)
        threads = []
    if threads:
        log.warning("counters: the GX warm-up left threads running (lost in forks): %s", threads)
    log.info("counters: task modules preloaded in %.1f CPU-s", time.process_time() - started)


def warm_families() -> list[str]:
    """The families YAML, parsed once here: every forked parse reuses it (the memo is keyed on
    the file's stamp, so an edited file is parsed again). Returns the families' names (none
    when the YAML does not load: a task builds what it needs itself)."""
    try:
        from counters.config import load_families_leniently

        good, _errors = load_families_leniently()
    except Exception:  # a parse reads it itself and reports the real error there
        log.warning("counters: preloading the families YAML failed", exc_info=True)
        return []
    return [family.name for family in good]


def warm_code_version() -> None:
    """The code version every audit row records (``audit.code_version``: ``git describe`` in a
    subprocess, cached per process), computed here once: each forked task ran ``git`` again
    (about 0.015 CPU-s a run). The tasks run the code this process imported, so its version is
    theirs."""
    try:
        from counters import audit

        audit.code_version()
    except Exception:  # a task computes it itself
        log.warning("counters: preloading the code version failed", exc_info=True)


def preload_parsing() -> None:
    """The DAG factory and the YAML (no GX, pandas or driver: parsing needs none)."""
    started = time.process_time()
    try:
        import counters.airflow.factory  # noqa: F401
    except Exception:  # the parse imports it itself and reports the real error there
        log.warning("counters: preloading the DAG factory failed", exc_info=True)
        return
    warm_families()
    log.info("counters: DAG factory preloaded in %.1f CPU-s", time.process_time() - started)


def preload_for_process(argv: list[str] | None = None) -> str | None:
    """Preload what this process's forked children need; returns which preload ran
    (``"tasks"``, ``"parsing"`` or None)."""
    argv = sys.argv if argv is None else argv
    if os.environ.get(PRELOAD_ENV, "1") == "0":
        return None
    kind = "tasks" if forks_tasks(argv) else "parsing" if forks_parses(argv) else None
    if kind is not None and kind not in _ran:
        _ran.add(kind)
        if kind == "tasks":
            preload_tasks()
        else:
            preload_parsing()
    return kind


class PreloadListener:
    """Airflow listener: preload when a job (scheduler, DAG processor, triggerer) starts."""

    @hookimpl
    def on_starting(self, component: Any) -> None:
        if type(component).__module__ == "airflow.jobs.job":
            preload_for_process()
