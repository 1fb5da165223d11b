"""Task failures that must not be retried; the alert reads ``checks`` and ``counters`` off them."""

from __future__ import annotations

from collections.abc import Sequence

from airflow.sdk.exceptions import AirflowFailException


class RunFailed(AirflowFailException):
    """The run cannot succeed by retrying: it fails now, and the alert says why.

    :param message: one paragraph naming the family, the run, the check and the amounts.
    :param checks: names of the failed checks (``compact_value_equals_before_plus_folded``,
        ``freshness``, ...).
    :param counters: the counters affected, each with its amounts where known.
    :param audited: the raising task already wrote the run's audit row (else the failure
        callback writes it).
    """

    def __init__(
        self,
        message: str,
        *,
        checks: Sequence[str],
        counters: Sequence[str] = (),
        audited: bool = False,
    ):
        super().__init__(message)
        self.checks = tuple(checks)
        self.counters = tuple(counters)
        self.audited = audited
        """True when the task wrote the run's ``failed`` audit row before raising."""


class CheckFailed(RunFailed):
    """A conservation check failed: nothing was deleted, the run is not retried."""


class RunRefused(RunFailed):
    """The engine refused the run (NULL increments, an epoch in the future, a bad schema)."""


class FamilyStale(RunFailed):
    """A family's compacted epoch is further behind ``now - lag`` than its freshness allows."""
