"""Time as the tables hold it: naive UTC to the millisecond, epochs, write timestamps."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import overload


def utc_naive(moment: datetime) -> datetime:
    """Cassandra timestamps come back naive UTC; compare everything in that form."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def to_millis(moment: datetime) -> int:
    moment = utc_naive(moment)
    return int((moment - datetime(1970, 1, 1)) // timedelta(milliseconds=1))


def from_millis(millis: int) -> datetime:
    return datetime(1970, 1, 1) + timedelta(milliseconds=millis)


def truncate_ms(moment: datetime) -> datetime:
    """Cassandra ``timestamp`` has millisecond precision; so do epochs."""
    return from_millis(to_millis(moment))


def epoch_for(scheduled: datetime, lag: timedelta) -> datetime:
    """The epoch of a run: its scheduled time truncated to the minute, minus the family's lag.

    Rows with ``time <= epoch`` are folded in (inclusive, as in the seed's DELETE).
    """
    if lag <= timedelta(0):
        raise ValueError(f"lag must be positive, got {lag}")
    minute = utc_naive(scheduled).replace(second=0, microsecond=0)
    return truncate_ms(minute - lag)


def minute_ms(moment: datetime) -> int:
    """The start of ``moment``'s minute, in epoch ms (what an index mark records of a row)."""
    return to_millis(moment) // 60_000 * 60_000


def parse_epoch(text: str) -> datetime:
    """An epoch given by a person (``--epoch``, the DAG's ``epoch`` param): ISO 8601, UTC when
    it has no offset, millisecond precision. ``ValueError`` names the text."""
    return truncate_ms(from_text(text))


def run_epoch(scheduled: datetime, lag: timedelta, override: str | None = None) -> datetime:
    """The epoch a run folds up to: ``override`` (a person's ``--epoch`` or the DAG's ``epoch``
    param, ``parse_epoch``) when given, else ``epoch_for(scheduled, lag)``. The DAG, the CLI
    and the bench all take a run's epoch from here, so they cannot disagree on it."""
    return parse_epoch(override) if override else epoch_for(scheduled, lag)


@overload
def to_text(moment: datetime) -> str: ...
@overload
def to_text(moment: None) -> None: ...
def to_text(moment: datetime | None) -> str | None:
    """A time as text, the one format every output uses (XCom, JSON, exports, the UI, messages):
    ISO 8601 in UTC to the millisecond, with ``Z`` (``2026-11-22T10:00:00.000Z``); the tables
    hold milliseconds, so nothing a reader compares is lost. ``from_text`` reads it back."""
    if moment is None:
        return None
    return utc_naive(moment).isoformat(timespec="milliseconds") + "Z"


@overload
def from_text(text: str) -> datetime: ...
@overload
def from_text(text: None) -> None: ...
def from_text(text: str | None) -> datetime | None:
    """``to_text``'s inverse: naive UTC (any ISO 8601 text is read; no offset means UTC).
    ``ValueError`` names the text."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise ValueError(f"not an ISO 8601 time: {text!r} (e.g. 2026-11-22T10:00:00)") from None
    return utc_naive(moment if moment.tzinfo else moment.replace(tzinfo=UTC))


def write_timestamp(moment: datetime) -> int:
    """A write timestamp in microseconds (what ``USING TIMESTAMP`` takes), from a time."""
    return to_millis(moment) * 1000


CLOCK_SHARE = 4
"""A host whose clock is off the cluster's by more than ``lag / CLOCK_SHARE`` is refused for
compaction (``clock_refusal``). The lag is the writers' skew budget; the compacting host takes
its times from the cluster's clock (its own, corrected by the measured offset), so its skew
spends none of that budget; a host off by a quarter of it has lost NTP, and its clock may be
stepped while it runs."""


@dataclass(frozen=True)
class ClockOffset:
    """How far this host's clock is from the cluster's, as one read of the coordinator's time
    measured it: ``offset_us`` = host - cluster (positive: the host is ahead), known to within
    ``uncertainty_us`` (half the read's round trip, and the server's millisecond), ``source``
    the coordinator that answered."""

    offset_us: int
    uncertainty_us: int
    source: str

    @property
    def seconds(self) -> float:
        return self.offset_us / 1e6

    def describe(self) -> str:
        """``+3600.012 s ahead of`` the cluster's clock, with its uncertainty and source."""
        side = "ahead of" if self.offset_us > 0 else "behind"
        return (
            f"{abs(self.offset_us) / 1e6:.3f} s {side} the cluster's (coordinator "
            f"{self.source}, +/- {self.uncertainty_us / 1e6:.3f} s)"
        )


def clock_tolerance(lag: timedelta) -> timedelta:
    """How far a compacting host's clock may be off the cluster's: ``lag / CLOCK_SHARE``."""
    return lag / CLOCK_SHARE


def clock_refusal(family: str, lag: timedelta, offset: ClockOffset) -> str | None:
    """Why a host with this clock offset may not compact ``family`` (None: it may): off by
    more than ``clock_tolerance(lag)`` beyond the measurement's uncertainty."""
    tolerance = clock_tolerance(lag)
    surely = abs(offset.offset_us) - offset.uncertainty_us
    if surely <= tolerance // timedelta(microseconds=1):
        return None
    return (
        f"family {family!r}: this host's clock is {offset.describe()}: more than a quarter of "
        f"the family's lag ({tolerance.total_seconds():g} s of {lag.total_seconds():g} s). "
        "Refused before the step's next write or delete (a step refused at its start wrote and "
        "deleted nothing): its epochs, tombstones and versions would carry its clock. Sync the "
        "host's clock (NTP) or run from another host"
    )
