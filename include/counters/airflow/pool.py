"""The pool the compaction tasks run in, created when it is missing, so no run stalls silently.

Airflow never starts a task whose pool does not exist: the scheduler only logs "Tasks using
non-existent pool", and every family falls behind. ``airflow_settings.yaml`` creates the pool for
``make run``, but a deployment (Astro, the Helm chart) does not apply that file. The plugin
(:mod:`counters.airflow.plugin`) registers :class:`PoolListener`: when an Airflow component
with metadata-DB access starts (the scheduler, the DAG processor, the triggerer), it creates the
pool with ``$COUNTERS_POOL_SLOTS`` slots (default 4) if it does not exist, and logs that it did.
An existing pool is left as it is (its size is the operator's).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

POOL_ENV = "COUNTERS_POOL"
DEFAULT_POOL = "cassandra_compaction"
SLOTS_ENV = "COUNTERS_POOL_SLOTS"
DEFAULT_SLOTS = 4
DESCRIPTION = "Concurrent compaction tasks against Cassandra (counters-compaction)"


def pool_name(env: dict[str, str] | None = None) -> str:
    """The pool of the ``run``, ``compact`` and ``cleanup`` tasks: ``$COUNTERS_POOL`` or
    ``cassandra_compaction``."""
    env = dict(os.environ) if env is None else env
    return env.get(POOL_ENV) or DEFAULT_POOL


def pool_slots(env: dict[str, str] | None = None) -> int:
    """The size of a pool this module creates: ``$COUNTERS_POOL_SLOTS`` (default 4)."""
    env = dict(os.environ) if env is None else env
    text = env.get(SLOTS_ENV) or str(DEFAULT_SLOTS)
    try:
        slots = int(text)
    except ValueError:
        slots = 0
    if slots < 1:
        raise ValueError(f"{SLOTS_ENV} must be a whole number of slots >= 1, got {text!r}")
    return slots


def create_command(name: str, slots: int) -> str:
    """The command that creates the pool by hand."""
    return f"airflow pools set {name} {slots} '{DESCRIPTION}'"


def ensure_pool() -> bool:
    """Create the pool when it does not exist (a component with metadata-DB access only);
    returns whether it was created."""
    from airflow.models.pool import Pool

    name, slots = pool_name(), pool_slots()
    if Pool.get_pool(name) is not None:
        return False
    try:
        Pool.create_or_update_pool(name, slots, DESCRIPTION, include_deferred=False)
    except Exception:  # another component created it at the same moment
        if Pool.get_pool(name) is None:
            raise
        return False
    log.warning(
        "counters: the pool %r did not exist; created it with %d slots (its size limits how "
        "many compaction tasks load Cassandra at once; resize with `airflow pools set`)",
        name,
        slots,
    )
    return True


class PoolListener:
    """Airflow listener: ensure the pool when a job (scheduler, DAG processor, triggerer)
    starts. Task processes also announce their start; they have no DB access and are skipped."""

    @hookimpl
    def on_starting(self, component: Any) -> None:
        if type(component).__module__ != "airflow.jobs.job":
            return
        name = pool_name()
        try:
            ensure_pool()
        except Exception:
            log.exception(
                "counters: could not check or create the pool %r; until it exists no compaction "
                "task starts. Create it with: %s",
                name,
                create_command(name, DEFAULT_SLOTS),
            )
