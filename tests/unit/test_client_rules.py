"""The write API's rules for events given whole (``CounterClient.record``), pure."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from counters.client import Increment, event_problem

pytestmark = pytest.mark.unit

NAMES = ["actor", "version"]
AT = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)


def test_an_event_with_its_time_and_whole_identity_is_fit():
    assert event_problem(Increment(("r",), 5, AT, ("P1", 2)), NAMES) is None


@pytest.mark.parametrize(
    ("time", "identity", "said"),
    [
        (None, ("P1", 2), "time must be the event's own datetime, got None"),
        ("2026-11-25", ("P1", 2), "time must be the event's own datetime, got '2026-11-25'"),
        (AT.replace(tzinfo=None), ("P1", 2), "is a naive datetime (no tzinfo)"),
        (AT, ("P1",), "identity needs 2 value(s) for ['actor', 'version']"),
        (AT, ("P1", None), "has no value for ['version']"),
        (AT, (None, 2), "has no value for ['actor']"),
    ],
)
def test_an_event_without_its_time_or_with_a_missing_identity_part_is_refused(time, identity, said):
    problem = event_problem(Increment(("r",), 5, time, identity), NAMES)
    assert problem is not None and said in problem and "('r',)" in problem


def test_a_naive_event_time_is_refused_saying_what_to_pass():
    """A naive ``Increment.time`` may be this host's local time: refused as ``increment(at=)``
    refuses one, naming the counter and the value and showing a tz-aware form to pass."""
    naive = AT.replace(tzinfo=None)
    problem = event_problem(Increment(("r",), 5, naive, ("P1", 2)), NAMES)
    assert problem is not None
    assert "counter ('r',): time" in problem and repr(naive) in problem
    assert "pass a tz-aware time" in problem and "tzinfo=UTC" in problem and "tz='UTC'" in problem
