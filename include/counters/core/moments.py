"""Time, in one module: the form the tables hold (naive UTC to the millisecond), epochs,
write timestamps, and every time written as text (``to_text``, the one format; file and folder
stamps; a chart's labels). No other module formats a time (``test_architecture_time.py``).

Inside the engine a time is naive UTC, as Cassandra returns it; a time handed in by a user's
code is refused when naive (``aware_utc``): ``datetime.now()`` is this host's local time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import overload

import pendulum

EARLIEST = datetime(1970, 1, 1)
"""The Unix epoch, naive UTC: the earliest time a table holds, and the zero of every ms and µs."""
EPOCH_UTC = EARLIEST.replace(tzinfo=UTC)
"""The Unix epoch, tz-aware: the zero a tz-aware time's ms are counted from (``aware_millis``)."""
_MILLI = timedelta(milliseconds=1)

TEXT_FORMAT_EXAMPLE = "2026-11-22T10:00:00.000Z"
STAMP_SECONDS = "%Y%m%dT%H%M%SZ"
STAMP_MICROS = "%Y%m%dT%H%M%S.%fZ"


def utc_naive(moment: datetime) -> datetime:
    """Cassandra timestamps come back naive UTC; compare everything in that form (a plain
    ``datetime``: pendulum's, Airflow's, subtract into intervals that ``//`` refuses)."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    if type(moment) is not datetime:
        moment = datetime(
            moment.year,
            moment.month,
            moment.day,
            moment.hour,
            moment.minute,
            moment.second,
            moment.microsecond,
        )
    return moment


def naive_refusal(moment: datetime, what: str) -> str | None:
    """Why ``moment`` may not be handed to the write API (``what`` names the family, the
    counter or the argument), or None: a naive time may be UTC or this host's local time
    (``datetime.now()``), and a wrong guess moves a row by hours."""
    if moment.tzinfo is not None and moment.utcoffset() is not None:
        return None
    return (
        f"{what}: {moment!r} is a naive datetime (no tzinfo), which may be UTC or this "
        "host's local time; pass a tz-aware time, e.g. pendulum.datetime(2026, 11, 25, 14, 30, "
        "tz='UTC'), datetime(2026, 11, 25, 14, 30, tzinfo=UTC), datetime.now(UTC) or "
        "pendulum.now('UTC')"
    )


def checked_aware(moment: object, what: str) -> datetime:
    """``moment``, a time handed to the write API (``what`` names the family and the argument),
    when it is a tz-aware datetime; ``TypeError`` when it is no datetime, ``ValueError``
    (``naive_refusal``) when it is naive."""
    if not isinstance(moment, datetime):
        raise TypeError(f"{what}: expected a datetime, got {moment!r}")
    refusal = naive_refusal(moment, what)
    if refusal:
        raise ValueError(refusal)
    return moment


def aware_utc(moment: datetime, what: str) -> pendulum.DateTime:
    """A time handed to the write API (``what`` names the family and the argument), as a
    tz-aware UTC time; a naive one is refused (``checked_aware``)."""
    moment = checked_aware(moment, what)
    # the instant its own utcoffset() says (as ``utc_naive`` reads it), made UTC before pendulum
    # sees it: ``pendulum.instance`` re-reads the wall time in the zone's name, an hour off for
    # a pytz-localised time in the autumn's repeated hour or a zoneinfo time in the spring gap
    return pendulum.instance(moment.astimezone(UTC)).in_timezone("UTC")


def aware_millis(moment: datetime) -> int:
    """A tz-aware time (``naive_refusal`` said None) in ms since the Unix epoch, floored: the
    instant its own ``utcoffset()`` says, as the driver stores it. One subtraction, on the write
    API's hot path (no pendulum, no naive copy): ``datetime.__sub__`` also serves pendulum's
    and Airflow's times, whose own ``-`` gives an interval that ``//`` refuses."""
    return datetime.__sub__(moment, EPOCH_UTC) // _MILLI


def utc_aware(moment: datetime) -> datetime:
    """``utc_naive``'s inverse: a time as the tables and the engine hold it (naive UTC: an epoch,
    a test's virtual clock) as the tz-aware UTC time the write API takes."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def to_millis(moment: datetime) -> int:
    return (utc_naive(moment) - EARLIEST) // timedelta(milliseconds=1)


def from_millis(millis: int) -> datetime:
    return EARLIEST + timedelta(milliseconds=millis)


def to_micros(moment: datetime) -> int:
    """A time in µs since the Unix epoch, in integer arithmetic; naive is UTC, the tables'
    form, never this host's local time (as ``datetime.timestamp()`` would read it)."""
    return (utc_naive(moment) - EARLIEST) // timedelta(microseconds=1)


def from_micros(micros: int) -> datetime:
    """``to_micros``'s inverse, naive UTC."""
    return EARLIEST + timedelta(microseconds=micros)


def table_time(moment: datetime) -> datetime:
    """A time as a table holds it: naive UTC to the millisecond (Cassandra's ``timestamp``).
    The one normalisation of an epoch, a reset point or a row's time: the run's plan, a
    shard's fold and the client all take their times through here."""
    return from_millis(to_millis(moment))


def epoch_for(scheduled: datetime, lag: timedelta) -> datetime:
    """The epoch of a run: its scheduled time truncated to the minute, minus the family's lag.

    Rows with ``time <= epoch`` are folded in (inclusive, as in the seed's DELETE).
    """
    if lag <= timedelta(0):
        raise ValueError(f"lag must be positive, got {lag}")
    minute = utc_naive(scheduled).replace(second=0, microsecond=0)
    return table_time(minute - lag)


def minute_ms(moment: datetime) -> int:
    """The start of ``moment``'s minute, in epoch ms (what an index mark records of a row)."""
    return to_millis(moment) // 60_000 * 60_000


def parse_epoch(text: str) -> datetime:
    """An epoch given by a person (``--epoch``, the DAG's ``epoch`` param): ISO 8601, UTC when
    it has no offset, millisecond precision. ``ValueError`` names the text."""
    return table_time(from_text(text))


def parse_moment(text: str) -> pendulum.DateTime:
    """A time given by a person (``--at``, ``--since``): ISO 8601, UTC when it has no offset,
    to the millisecond, as a tz-aware UTC time (what the write API takes)."""
    return pendulum.instance(parse_epoch(text), tz="UTC")


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
    """A time as text, the one format every output uses (XCom, JSON, exports, the UI, audit
    rows, messages): ISO 8601 in UTC to the millisecond, with ``Z``
    (``2026-11-22T10:00:00.000Z``); the tables hold milliseconds, so nothing a reader compares
    is lost. A naive time is UTC (the tables' form). ``from_text`` reads it back."""
    if moment is None:
        return None
    return utc_naive(moment).isoformat(timespec="milliseconds") + "Z"


@overload
def from_text(text: str) -> datetime: ...
@overload
def from_text(text: None) -> None: ...
def from_text(text: str | None) -> datetime | None:
    """``to_text``'s inverse, naive UTC, and tolerant: any ISO 8601 time is read (no offset
    means UTC), so the forms earlier versions stored (``isoformat()``: no milliseconds, no
    ``Z``, or ``+00:00``; a space for the ``T``) and ``stamp``'s basic form still read.
    ``ValueError`` names the text."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise ValueError(f"not an ISO 8601 time: {text!r} (e.g. {TEXT_FORMAT_EXAMPLE})") from None
    return utc_naive(moment if moment.tzinfo else moment.replace(tzinfo=UTC))


def legacy_text(moment: datetime) -> str:
    """A time as versions before ``to_text`` wrote it into ids (``isoformat()`` of naive UTC:
    no ``Z``, and no fraction when it is zero): only to recognise what they stored."""
    return utc_naive(moment).isoformat()


def stamp(moment: datetime, *, micros: bool = False) -> str:
    """A time as a file or folder name, or a run id's part: ISO 8601's basic form in UTC
    (``20261122T100000Z``; with ``micros``, ``20261122T100000.123456Z``), no ``:`` (which
    some file systems refuse) and sorting as time does. ``from_text`` reads both back."""
    return utc_naive(moment).strftime(STAMP_MICROS if micros else STAMP_SECONDS)


def day_text(day: date | datetime) -> str:
    """A day as text (``2026-11-22``: day folders, date key values); a time's day is its UTC
    day."""
    if isinstance(day, datetime):
        day = utc_naive(day).date()
    return day.isoformat()


def clock_label(moment: datetime, with_day: bool) -> str:
    """A chart axis's label of a time: ``10:05``, or ``11-22 10:05`` with its day (UTC)."""
    return utc_naive(moment).strftime("%m-%d %H:%M" if with_day else "%H:%M")


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
