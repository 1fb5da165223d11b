"""Concluding a run: advance the family's epoch, decide its outcome and write its audit row."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..config import Family
from ..core import (
    CheckOutcome,
    Tally,
    to_text,
    utc_naive,
)
from ..errors import ArchiveError
from ..store import Store
from .common import (
    Phases,
)
from .outcome import RunOutcome
from .plan import RunPlan

log = logging.getLogger(__name__)

AuditHook = Callable[[RunOutcome], None]
"""Called with how the run ended, once its audit row is written (the run's metrics)."""


def prune_archive(family: Family, now: datetime | None = None) -> int:
    """Delete the family's archive day folders older than its ``archive_retention`` (each run
    does, when it finishes); how many. A store that cannot be pruned now is logged, not a
    failed run: the rows are archived and deleted, and the next run prunes."""
    if family.archive is None or family.archive_retention is None:
        return 0
    from ..archive.storage import prune

    try:
        removed = prune(family, now or datetime.now(UTC))
    except ArchiveError as exc:
        log.warning("%s", exc)
        return 0
    if removed:
        log.info(
            "family %s: %d archive day folder(s) past its retention removed", family.name, removed
        )
    return removed


def epoch_advanced(plan: RunPlan, family_epoch: datetime | None) -> CheckOutcome:
    """The family's compacted epoch, read back after ``finish_run``, is at least the run's."""
    advanced = family_epoch is not None and utc_naive(family_epoch) >= plan.epoch
    return CheckOutcome(
        "family_epoch_advanced",
        advanced,
        True,
        f"compacted epoch {to_text(plan.epoch_before)} -> {to_text(family_epoch)} "
        f"(run epoch {to_text(plan.epoch)})"
        if advanced
        else f"the compacted epoch is {to_text(family_epoch)} after finishing, expected at least "
        f"{to_text(plan.epoch)}",
    )


@dataclass(frozen=True)
class Conclusion:
    """How a run that got past its cleanup ends: its outcome, the message its audit row and
    its alert carry, and, when it did not succeed, the checks and counters to name."""

    outcome: str
    message: str
    checks: list[CheckOutcome]
    failed: list[str] = field(default_factory=list)
    counters: list[str] = field(default_factory=list)


def conclusion(
    family: str, plan: RunPlan, tally: Tally, checks: Sequence[CheckOutcome]
) -> Conclusion:
    """The one rule that ends a run, for ``counterctl compact`` and the DAG alike (``checks``
    ends with ``epoch_advanced``): a failed critical check fails it, a quarantined counter
    makes it ``partial`` (the rest of the family was compacted), else ``success``."""
    checks = list(checks)
    failed = [o for o in checks if o.critical and not o.success]
    if failed:
        message = f"family {family!r} run {plan.run_id!r}: " + " | ".join(
            f"{o.name}: {o.detail}" for o in failed
        )
        return Conclusion(
            "failed",
            message,
            checks,
            [o.name for o in failed],
            list(dict.fromkeys(c for o in failed for c in o.counters)),
        )
    if tally.counters_quarantined:
        named = next((o.counters for o in checks if o.name == "no_counter_quarantined"), ())
        return Conclusion(
            "partial",
            quarantine_message(family, plan.run_id, tally, checks),
            checks,
            ["no_counter_quarantined"],
            list(named or tally.quarantined),
        )
    return Conclusion("success", "", checks)


def conclude_run(
    store: Store, plan: RunPlan, tally: Tally, checks: Sequence[CheckOutcome]
) -> Conclusion:
    """Advance the family's compacted epoch, read it back, and decide how the run ends."""
    finish_run(store, plan, tally)
    moved = epoch_advanced(plan, store.state.family_epoch())
    return conclusion(store.family.name, plan, tally, [*checks, moved])


def dry_run_message(tally: Tally) -> str:
    return (
        f"dry run: {tally.counters_committed} counter(s) would fold {tally.rows_folded} "
        f"row(s) (sum {tally.sum_folded}); nothing written, verified or deleted"
    )


def quarantine_message(
    family: str, run_id: str, tally: Tally, checks: Sequence[CheckOutcome]
) -> str:
    detail = next((o for o in checks if o.name == "no_counter_quarantined"), None)
    named = "; ".join((detail.counters if detail else ())[:5]) or ", ".join(tally.quarantined)
    left = (
        f", {tally.rows_left} row(s) at or below the epoch left unfolded" if tally.rows_left else ""
    )
    return (
        f"family {family!r} run {run_id!r}: {tally.counters_quarantined} counter(s) quarantined "
        f"(kept out of compaction, none of their rows deleted{left}; the rest of the family was "
        f"compacted): {named}. Inspect with `counterctl quarantine --family {family}`, release "
        "with --release once fixed"
    )


def finish_run(store: Store, plan: RunPlan, tally: Tally | None = None) -> None:
    """The run succeeded: the family's compacted epoch becomes the run's epoch (and a sweep
    run records when it started and how much it read: ``tally``'s rows and counters)."""
    size = None if tally is None else min(tally.rows_read + tally.counters_seen, 2**31 - 1)
    store.state.advance_family_epoch(
        plan.epoch,
        plan.run_id,
        plan.started_at if plan.sweep else None,
        size if plan.sweep else None,
    )


def write_audit(
    store: Store,
    plan: RunPlan,
    outcome: str,
    *,
    started_at: datetime,
    tally: Tally,
    phases: Phases,
    checks: Sequence[CheckOutcome] = (),
    message: str = "",
    gx: Mapping[str, Any] | None = None,
    on_audit: AuditHook | None = None,
) -> RunOutcome:
    """Build how the run ended (``RunOutcome``, once) and write its audit row (who started it:
    the plan's provenance); ``gx``: the GX suite's fingerprint and where its result is stored,
    when the suite validated the run. ``on_audit`` gets the same value (metrics)."""
    ended = RunOutcome(
        plan,
        outcome,
        started_at,
        store.family.kind.value,
        tally,
        dict(phases.seconds),
        tuple(checks),
        message,
        gx_suite=(gx or {}).get("gx_suite"),
        gx_result=(gx or {}).get("gx_result"),
    )
    store.audit.provenance = plan.provenance
    store.audit.write(ended.audit_row())
    log.info(
        "audit row written: family %s run %s outcome %s", store.family.name, plan.run_id, outcome
    )
    if on_audit is not None:
        on_audit(ended)
    return ended
