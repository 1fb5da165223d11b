"""A GX suite that fails: the real rules plus one no run passes, for tests of what a run does
when its GX suite fails while the engine's own checks pass."""

from __future__ import annotations

from typing import Any

import pytest

FAILING_CHECK = "sum_folded_is_negative"


def add_failing_rule(monkeypatch: pytest.MonkeyPatch) -> str:
    """Make ``counters.gx.checks.rules`` the real rules plus a critical expectation that every
    bucket folded a negative sum (a suite is built per family and process on first use: call
    this before the family's first validation). Returns the failing check's name as the audit
    row shows it (``gx:<check>``)."""
    from counters.gx import checks

    real = checks.rules

    def with_a_failing_rule() -> list[Any]:
        import great_expectations.expectations as gxe

        the_rules = real()
        forced = gxe.ExpectColumnValuesToBeBetween(column="sum_folded", max_value=-1)
        forced.meta = {"check": FAILING_CHECK, "critical": True, "rule": len(the_rules)}
        forced.description = "every bucket folded a negative sum (no run passes this)"
        forced.severity = "critical"
        return [*the_rules, checks.Rule(FAILING_CHECK, forced.description, forced)]

    monkeypatch.setattr(checks, "rules", with_a_failing_rule)
    return f"gx:{FAILING_CHECK}"
