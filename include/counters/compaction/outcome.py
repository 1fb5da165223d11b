"""How a run ended, as one value: ``RunOutcome``, built once by the step that ends the run
(committed, stopped, failed or refused), and the one source of every view of it: the audit row,
the metrics (from the audit row), ``counterctl compact``'s JSON, the DAG's ``summary`` XCom and
the asset event's ``extra``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NewType

from ..audit import MESSAGE_MAX
from ..core import CheckOutcome, Tally, to_text
from ..core.codec import versioned
from .plan import RunPlan

RunSummaryJson = NewType("RunSummaryJson", dict[str, Any])
"""``RunOutcome.summary()``: the run as JSON (``counterctl compact --json``, the DAG's XCom)."""

ADVANCING = ("success", "partial", "reset", "idle")
"""The outcomes after which the family's compacted epoch is the run's (its ``epoch_after``)."""


@versioned(1)
@dataclass(frozen=True)
class RunOutcome:
    """A finished run: its plan, how it ended, its figures and checks. ``started_at`` keys its
    audit row; ``kind`` is the family's kind; ``seconds`` the time of each phase; ``gx_suite``
    and ``gx_result`` the GX suite's fingerprint and where its result is stored (None: GX did
    not validate the run); ``requests`` and ``peak_rss_mib`` what working it cost (the
    summary's, not the audit row's)."""

    plan: RunPlan
    outcome: str
    started_at: datetime
    kind: str
    tally: Tally
    seconds: Mapping[str, float] = field(default_factory=dict)
    checks: tuple[CheckOutcome, ...] = ()
    message: str = ""
    gx_suite: str | None = None
    gx_result: str | None = None
    requests: Mapping[str, int] = field(default_factory=dict)
    peak_rss_mib: float = 0.0

    @property
    def family(self) -> str:
        return self.plan.family

    @property
    def committed(self) -> bool:
        """Whether the run committed anything (a counter's compact value changed)."""
        return self.tally.counters_committed > 0

    @property
    def epoch_after(self) -> datetime | None:
        """The family's compacted epoch after the run."""
        advanced = self.outcome in ADVANCING and not self.plan.dry_run
        return self.plan.epoch if advanced else self.plan.epoch_before

    def audit_row(self) -> dict[str, Any]:
        """The run's audit row, column by column (``store.audit.write`` adds who ran it, the
        code version and the configuration hash); ``metrics.run_metrics`` reads it too. The
        tally's figures without a column of their own are notes in its message."""
        tally = self.tally
        notes = (self.message, _gone_note(tally), _capped_note(tally))
        return {
            "family": self.family,
            "started_at": self.started_at,
            "run_id": self.plan.run_id,
            "kind": self.kind,
            "outcome": self.outcome,
            "dry_run": self.plan.dry_run,
            "sweep": self.plan.sweep,
            "gx_suite": self.gx_suite,
            "gx_result": self.gx_result,
            "epoch_before": self.plan.epoch_before,
            "epoch_after": self.epoch_after,
            "counters": tally.counters_committed,
            "rows_folded": tally.rows_folded,
            "sum_folded": tally.sum_folded,
            "late_rows": tally.late_rows,
            "late_sum": tally.late_sum,
            "max_lateness_ms": tally.max_lateness_ms,
            "conflicts": tally.conflicts,
            "rows_deleted": tally.rows_deleted,
            "checks": {o.name: ("pass" if o.success else f"FAIL: {o.detail}") for o in self.checks},
            "durations": {k: round(v, 3) for k, v in self.seconds.items()},
            "message": "; ".join(m for m in notes if m)[:MESSAGE_MAX],
        }

    def summary(self) -> RunSummaryJson:
        """The run as JSON for people and their scripts: ``counterctl compact --json`` prints
        it and the DAG pushes it as XCom (``summary``; a larger run's ``record_audit`` returns
        it). Times as ``core.to_text``."""
        return RunSummaryJson(
            {
                "peak_rss_mib": round(self.peak_rss_mib, 1),
                "family": self.family,
                "run_id": self.plan.run_id,
                "outcome": self.outcome,
                "epoch_before": to_text(self.plan.epoch_before),
                "epoch": to_text(self.plan.epoch),
                "sweep": self.plan.sweep,
                "message": self.message,
                **self.tally.as_dict(),
                "checks": {o.name: o.success for o in self.checks},
                "durations_s": {k: round(v, 3) for k, v in self.seconds.items()},
                "requests": dict(self.requests),
                "gx_result": self.gx_result,
            }
        )

    def asset_extra(self) -> dict[str, Any]:
        """The compact table's asset event ``extra``: which run, up to which epoch, how much
        it folded."""
        return {
            "family": self.family,
            "run_id": self.plan.run_id,
            "epoch_before": to_text(self.plan.epoch_before),
            "epoch": to_text(self.plan.epoch),
            "counters": self.tally.counters_committed,
            "rows_folded": self.tally.rows_folded,
            "sum_folded": self.tally.sum_folded,
            "rows_deleted": self.tally.rows_deleted,
        }


def _gone_note(tally: Tally) -> str:
    """A rows family's deletions found by the sweep (the audit row has no column for them)."""
    if not tally.rows_gone:
        return ""
    return (
        f"{tally.rows_gone} counted business row(s) found deleted (rows_gone): their counters' "
        "values lowered to the rows that exist"
    )


def _capped_note(tally: Tally) -> str:
    """Counters with more rows than one commit carries (the audit row has no column for them)."""
    if not tally.capped_counters:
        return ""
    return (
        f"{tally.capped_counters} counter(s) had more rows than one commit carries: their oldest "
        "rows folded, the rest left for the next runs"
    )
