"""Where a test family's sweeps fall: not at a phase from its random name (then whether a run
sweeps, which tests assert, would change from one test run to the next)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any


def sweep_offset_clear_of(moment: datetime, interval: timedelta) -> timedelta:
    """A ``sweep_offset`` that puts the sweeps half an ``interval`` after ``moment``, then every
    interval: runs within that half interval sweep on the family's first run only."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return (moment - datetime(1970, 1, 1) + interval / 2) % interval


def with_sweep_offset(entry: dict[str, Any], moment: datetime) -> dict[str, Any]:
    """``entry`` (a family's YAML fields) with a ``sweep_offset`` clear of ``moment``, unless it
    names one, and sweeping by interval only (not every run after a small sweep), unless it
    names ``sweep_every_run_below``."""
    from counters.config import Family

    entry = {"sweep_every_run_below": 0, **entry}
    if "sweep_offset" not in entry:
        interval = Family.model_validate(entry).sweep_interval
        offset = sweep_offset_clear_of(moment, interval)
        entry = {**entry, "sweep_offset": f"{int(offset.total_seconds())}s"}
    return entry
