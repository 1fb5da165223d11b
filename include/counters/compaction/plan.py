"""Planning a run: its epoch, its shards, and whether it sweeps, is idle or has nothing to do."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from ..audit import Provenance
from ..config import Discovery, Family
from ..core import (
    EARLIEST,
    table_time,
    to_millis,
    to_text,
    utc_naive,
)
from ..core.codec import CodecError, versioned
from ..errors import EpochInFuture
from ..identity import check_family
from ..store import Store
from .common import (
    SMALL_RUN_COUNTERS,
    cluster_clock,
)

log = logging.getLogger(__name__)


# --- plan --------------------------------------------------------------------------------


PLAN_VERSION = 2
"""The version of ``RunPlan``'s encoded layout (``core.codec``). Version 1 was written as
``{"format": 1, ...}`` (``as_dict``, before the codec): the same fields, still read."""


def _plan_upgrade(version: int, payload: dict[str, Any]) -> dict[str, Any]:
    """A plan a previous release pushed to XCom (``"format": 1``, no ``v``) as the current
    layout; no other form was ever stored."""
    if version == 0 and payload.get("format") == 1:
        return {k: v for k, v in payload.items() if k != "format"}
    raise CodecError(
        f"RunPlan: field 'v' is {version!r} (format {payload.get('format')!r}), "
        f"expected {PLAN_VERSION}"
    )


@versioned(PLAN_VERSION, _plan_upgrade)
@dataclass(frozen=True)
class RunPlan:
    """What a run does, decided once by ``plan_run``; every later step (a shard in a worker
    process, a DAG task after XCom) works from this one value. ``core.codec`` is its only
    encoding (plain JSON, times as ``core.to_text``)."""

    family: str
    run_id: str
    epoch: datetime
    epoch_before: datetime | None
    shards: tuple[int, ...]
    sweep: bool = False
    noop_reason: str | None = None
    started_at: datetime | None = None
    idle: bool = False
    """Nothing was touched since the last run, no counter is quarantined and no sweep is due:
    the run only advances the family's epoch (``idle`` audit row), one cheap step."""
    small: bool = False
    """Few counters touched and no sweep: one task (one process) can do every shard."""
    dry_run: bool = False
    """Compact without writing: the run stops after the shards with a ``dry-run`` audit row."""
    scheduled: datetime | None = None
    """The DAG run's scheduled time (its logical date, or when a manual run was triggered)."""
    provenance: Provenance = field(default_factory=Provenance)
    """Who started the run, carried to every audit row it writes."""

    @property
    def shard_groups(self) -> list[tuple[int, ...]]:
        """How the shards are spread over tasks: all in one for a small run, else one each."""
        return [self.shards] if self.small else [(s,) for s in self.shards]

    @property
    def noop(self) -> bool:
        return self.noop_reason is not None

    @property
    def epoch_ms(self) -> int:
        return to_millis(self.epoch)


def decide_plan(
    family: Family,
    run_id: str,
    epoch: datetime,
    epoch_before: datetime | None,
    *,
    now: datetime | None = None,
    last_sweep: datetime | None = None,
    anything_touched: bool = True,
    touched: int | None = None,
    last_sweep_size: int | None = None,
) -> RunPlan:
    """Pure: whether a run at ``epoch`` has anything to do, and whether it sweeps.

    An epoch later than ``now - lag`` is refused: writers are still writing rows at those
    times, and every one of them would become a late write. A run sweeps (scans the whole raw
    table, finding rows of every writer) with ``discovery: scan``, or when the family's last
    sweep is older than its ``sweep_interval``.
    """
    epoch = table_time(epoch)
    now = utc_naive(now or datetime.now(UTC))
    if epoch > now - family.lag:
        raise EpochInFuture(
            f"family {family.name!r}: epoch {to_text(epoch)} is later than now - lag "
            f"({to_text(now - family.lag)}); refusing to fold rows that "
            "writers may still be writing"
        )
    reason = None
    if epoch_before is not None and epoch <= utc_naive(epoch_before):
        reason = (
            f"epoch {to_text(epoch)} is not newer than the compacted epoch "
            f"{to_text(epoch_before)}: nothing to do"
        )
    sweep = family.discovery is Discovery.SCAN or sweep_due(
        family, now, last_sweep, last_sweep_size
    )
    idle = reason is None and not sweep and not anything_touched
    small = (
        (not sweep or cheap_sweep(family, last_sweep_size))
        and touched is not None
        and touched < SMALL_RUN_COUNTERS
    )
    return RunPlan(
        family.name,
        run_id,
        epoch,
        epoch_before,
        tuple(range(family.shards)),
        sweep=sweep,
        noop_reason=reason,
        started_at=now,
        idle=idle,
        small=small,
    )


def sweep_due(
    family: Family, now: datetime, last_sweep: datetime | None, last_size: int | None = None
) -> bool:
    """Whether a run at ``now`` sweeps: on the family's first run; on every run while its last
    sweep was small (``cheap_sweep``: rows of any writer are then folded within a run); else
    once per ``sweep_interval`` at the family's own phase (the first run after each point
    ``k * sweep_interval + family.sweep_phase``). Two sweeps are never more than an interval (and a
    run) apart, so rows of writers outside the API are folded within the bound; and families
    deployed together do not all sweep in the same minute (50 of them did: a burst of 400
    task instances every 15 minutes that the machine could not absorb)."""
    if last_sweep is None or cheap_sweep(family, last_size):
        return True
    interval = family.sweep_interval
    since_point = (utc_naive(now) - EARLIEST - family.sweep_phase) % interval
    return utc_naive(last_sweep) < utc_naive(now) - since_point


def cheap_sweep(family: Family, last_size: int | None) -> bool:
    """Whether the family's last sweep was small enough to sweep every run."""
    return last_size is not None and last_size < family.sweep_every_run_below


def foreign_rows_bound(family: Family, last_size: int | None) -> timedelta:
    """How long after it is written a row of a writer outside the write API (plain CQL, no
    mark) is folded at the latest: a run (its schedule's period and the lag) when the family
    sweeps every run, else ``sweep_interval`` more."""
    from croniter import croniter

    ticks = croniter(family.schedule, datetime(2001, 1, 1))
    first = ticks.get_next(datetime)
    period = ticks.get_next(datetime) - first
    if family.discovery is Discovery.SCAN or cheap_sweep(family, last_size):
        return family.lag + period
    return family.lag + period + family.sweep_interval


def plan_run(
    store: Store,
    run_id: str,
    epoch: datetime,
    now: datetime | None = None,
    *,
    dry_run: bool = False,
    scheduled: datetime | None = None,
    provenance: Provenance | None = None,
) -> RunPlan:
    """Decide the run (it writes nothing: an idle run's epoch is recorded by ``plan_step``,
    with the run's conclusion). ``dry_run``, ``scheduled`` and ``provenance`` (default:
    the store's) ride in the plan to every later step. ``now`` defaults to the cluster's time
    (``cluster_clock``: a host whose clock is off is refused here, before anything is written):
    an epoch later than it less the lag is refused, whatever the host's clock says."""
    clock = cluster_clock(store)
    now = now or clock.now()
    check_family(store, record=False, run_id=run_id, once_per_run=True)
    state = store.state.family_state()
    touched = store.index.touched_count(SMALL_RUN_COUNTERS)
    plan = decide_plan(
        store.family,
        run_id,
        epoch,
        state.epoch,
        now=now,
        last_sweep=state.last_sweep,
        anything_touched=touched > 0 or store.quarantine.anything_quarantined(),
        touched=touched,
        last_sweep_size=state.last_sweep_size,
    )
    plan = replace(
        plan,
        dry_run=dry_run,
        scheduled=scheduled,
        provenance=provenance or store.audit.provenance or Provenance(),
    )
    return plan


# --- finish ------------------------------------------------------------------------------
