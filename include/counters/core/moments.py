"""Time as the tables hold it: naive UTC to the millisecond, epochs, write timestamps."""

from __future__ import annotations

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
