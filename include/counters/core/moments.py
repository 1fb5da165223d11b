"""Time as the tables hold it: naive UTC to the millisecond, epochs, write timestamps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


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
    try:
        moment = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise ValueError(f"not an ISO 8601 time: {text!r} (e.g. 2026-11-22T10:00:00)") from None
    return truncate_ms(utc_naive(moment if moment.tzinfo else moment.replace(tzinfo=UTC)))


def write_timestamp(moment: datetime) -> int:
    """A write timestamp in microseconds (what ``USING TIMESTAMP`` takes), from a time."""
    return to_millis(moment) * 1000
