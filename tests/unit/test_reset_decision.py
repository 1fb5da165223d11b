"""A reset's decisions (pure): the one function ``reset_counter`` and its dry run both take."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest
from counters.config import Family
from counters.core import Checkpoint, to_millis
from counters.errors import EngineError
from counters.maintenance import RESET_REPEAT_WINDOW, ResetPoint, decide_reset, latest_resets
from counters.store.keys import parse_epoch

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 26, 12, 30, 17, 123000)
FAMILY = Family.model_validate(
    {"name": "trades", "keyspace": "k", "raw_table": "t_raw", "compact_table": "t_c", "lag": "1m"}
)
X = ("IBM",)
EMPTY = Checkpoint()


def decide(
    base: Checkpoint = EMPTY,
    at: datetime | None = None,
    reset_id: str | None = None,
    done_at_ms: int | None = None,
) -> ResetPoint:
    return decide_reset(
        FAMILY, X, at=at, reset_id=reset_id, current=NOW, base=base, done_at_ms=done_at_ms
    )


def test_without_a_point_it_is_now_less_the_lag_truncated_to_the_minute() -> None:
    point = decide()
    assert point == ResetPoint(
        "reset:IBM@2026-11-26T12:29:00.000Z", datetime(2026, 11, 26, 12, 29), False
    )


def test_a_given_id_found_applied_decides_alone() -> None:
    done = to_millis(datetime(2026, 11, 20, 8, 0))
    later_reset = Checkpoint(origin_ms=to_millis(NOW - timedelta(minutes=5)), run_id="other")
    point = decide(later_reset, at=NOW, reset_id="ticket-7", done_at_ms=done)
    assert point == ResetPoint("ticket-7", datetime(2026, 11, 20, 8, 0), already_done=True)


def test_a_given_id_not_found_resets_at_its_point_even_within_the_repeat_window() -> None:
    recent = Checkpoint(origin_ms=to_millis(NOW - timedelta(minutes=5)))
    point = decide(recent, reset_id="ticket-8")
    assert point == ResetPoint("ticket-8", datetime(2026, 11, 26, 12, 29), already_done=False)


def test_no_point_no_id_within_the_window_repeats_the_last_reset() -> None:
    last = NOW - RESET_REPEAT_WINDOW + timedelta(seconds=1)
    point = decide(Checkpoint(origin_ms=to_millis(last)))
    assert point.already_done and point.at == last.replace(microsecond=123000)
    outside = decide(Checkpoint(origin_ms=to_millis(NOW - RESET_REPEAT_WINDOW)))
    assert not outside.already_done and outside.at == datetime(2026, 11, 26, 12, 29)


def test_a_given_point_within_the_window_is_a_new_reset_not_a_repeat() -> None:
    """The repeat window is for a reset without a point (a retried command): one that names its
    point resets there, however recent the counter's last reset."""
    recent = Checkpoint(origin_ms=to_millis(NOW - timedelta(minutes=5)))
    at = datetime(2026, 11, 26, 12, 28)
    assert decide(recent, at=at) == ResetPoint(
        "reset:IBM@2026-11-26T12:28:00.000Z", at, already_done=False
    )


def test_a_base_that_starts_at_the_point_is_done() -> None:
    at = datetime(2026, 11, 26, 12, 0)
    assert decide(Checkpoint(origin_ms=to_millis(at)), at=at).already_done
    assert decide(Checkpoint(run_id="ticket-9"), at=at, reset_id="ticket-9").already_done
    # a given id decides by itself: the same point reached by another reset is not this one
    assert not decide(Checkpoint(origin_ms=to_millis(at)), at=at, reset_id="ticket-9").already_done


def test_a_point_before_the_compacted_epoch_is_refused_naming_the_counter() -> None:
    base = Checkpoint(value=5, epoch_ms=to_millis(datetime(2026, 11, 26, 12, 10)))
    with pytest.raises(EngineError, match=r"'trades' counter IBM: reset point 2026-11-26T12:05"):
        decide(base, at=datetime(2026, 11, 26, 12, 5))
    assert not decide(base, at=datetime(2026, 11, 26, 12, 10)).already_done


def test_a_reset_an_earlier_version_made_is_found_done_by_its_old_id() -> None:
    """Reset ids carry their point as ``to_text`` writes it; a counter whose last commit is a
    reset an earlier version made (its id with ``isoformat()``'s point, and no ``origin_ms``:
    before ``counterctl init`` recovers it) is found done by a repeat, not reset again."""
    at = datetime(2026, 11, 26, 12, 0)
    old = Checkpoint(value=0, epoch_ms=to_millis(at), run_id="reset:IBM@2026-11-26T12:00:00")
    assert decide(old, at=at) == ResetPoint("reset:IBM@2026-11-26T12:00:00.000Z", at, True)
    assert not decide(old, at=at, reset_id="ticket-10").already_done  # a given id: its own
    other = Checkpoint(value=0, epoch_ms=to_millis(at), run_id="reset:IBM@2026-11-26T11:59:00")
    assert not decide(other, at=at).already_done


def test_an_earlier_versions_resets_are_taken_latest_per_key_whatever_its_text():
    """Earlier versions wrote a timestamp key in more than one text form: two resets of one
    counter, the older without an offset and the latest with one, are the one counter, and
    its point is the latest (the older would count the rows between them again). Mutation:
    grouping by the text gives the older point."""

    def parse(parts: Sequence[str]) -> tuple[datetime]:
        return (parse_epoch(parts[0]),)

    older, latest = datetime(2026, 11, 1, 0, 0), datetime(2026, 11, 20, 0, 0)
    found = latest_resets(
        "f",
        [("2026-11-25 09:00:00", older), ("2026-11-25 10:00:00+01:00", latest)],
        parse,
    )
    assert found == {(datetime(2026, 11, 25, 9, 0),): latest}
    with pytest.raises(EngineError, match=r"family 'f': a reset in counters_audit names"):
        latest_resets("f", [("not a time", older)], parse)
