"""What crosses between the trigger, the warm pool and a worker: a family-run for the pool
(:class:`PoolRun`, pickled into a pool process) and how it ended there (:class:`PoolOutcome`,
pickled back, and the event a worker resumes the task with: ``core.codec``).

Light on purpose: the plugin (every Airflow process) imports the trigger, which imports these
types; the Cassandra driver is imported only where a run is done.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from ..audit import Provenance
from ..config import Family
from ..core.codec import versioned

if TYPE_CHECKING:
    from ..connection import ConnectionSettings

Outcome = Literal["success", "stopped", "dry-run", "failed", "large", "error", "timeout"]
"""How a run in the pool ended: ``success`` (committed, audited); ``stopped`` (noop or idle,
audited by the plan) and ``dry-run`` (audited after verify): the task ends skipped;
``failed`` (a check failed or counters were quarantined, audited: the worker fails the task
as the step would have); ``large`` (a sweep or many counters: nothing done, the worker does
the run); ``error`` (anything else, not audited: the worker does the run, with the task's
retries) and ``timeout`` (the pool did not answer in time: the same)."""

HANDED_BACK: frozenset[Outcome] = frozenset({"failed", "large", "error", "timeout"})
"""The outcomes the trigger hands to a worker (the task's ``next_method``)."""


@dataclass(frozen=True)
class PoolRun:
    """One family-run for the pool: what the ``run`` task would read from its context."""

    family: Family
    run_id: str
    scheduled: datetime
    epoch: str | None
    dry_run: bool
    provenance: Provenance
    settings: ConnectionSettings


@versioned(1)
@dataclass(frozen=True)
class PoolOutcome:
    """What a run in the pool did. ``summary``: the run's XCom ``summary`` and ``asset``: its
    asset event's ``extra`` (a success: ``RunOutcome.summary``, ``RunOutcome.asset_extra``;
    no asset when it committed nothing); ``message``, ``checks``, ``counters``: why it stopped,
    failed or went back; ``log``: the run's log lines; ``cpu_s``: the pool process's
    CPU-seconds for the run. Crosses to a worker as ``core.codec`` writes it."""

    outcome: Outcome
    message: str = ""
    summary: Mapping[str, Any] | None = None
    asset: Mapping[str, Any] | None = None
    checks: tuple[str, ...] = ()
    counters: tuple[str, ...] = ()
    error: str | None = None
    """The type of the error that ended it (``error``)."""
    log: tuple[str, ...] = ()
    cpu_s: float = 0.0
    pid: int = 0

    @property
    def handed_back(self) -> bool:
        return self.outcome in HANDED_BACK
