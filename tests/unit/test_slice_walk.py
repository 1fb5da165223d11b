"""``core.SliceWalk``: a counter's rows read past any number of tombstones, against a model
of the node (a slice that meets more tombstones than the threshold is refused)."""

from __future__ import annotations

import random

import pytest
from counters.core import FIRST_SLICE_MS, SliceWalk

pytestmark = pytest.mark.unit

THRESHOLD = 1_000
NOW_MS = 1_795_000_000_000


class Refused(Exception):
    pass


def node(live: set[int], tombstones: list[int]):
    """A partition: a read of ``(start, top]`` returns its live times, or is refused when it
    meets more than ``THRESHOLD`` tombstones; every read is recorded."""
    reads: list[tuple[int | None, int, bool]] = []

    def read(start: int | None, top: int) -> list[int]:
        inside = lambda t: (start is None or t > start) and t <= top  # noqa: E731
        met = sum(1 for t in tombstones if inside(t))
        reads.append((start, top, met > THRESHOLD))
        if met > THRESHOLD:
            raise Refused
        return sorted(t for t in live if inside(t))

    return read, reads


def walk(low: int | None, high: int, read) -> list[int]:
    step: SliceWalk | None = SliceWalk(low, high)
    found: list[int] = []
    while step is not None:
        try:
            found += read(step.start, step.top)
        except Refused:
            step = step.refused()
            continue
        step = step.read()
    return sorted(found)


def test_a_partition_under_the_threshold_is_read_in_one_request():
    read, reads = node({NOW_MS - 5, NOW_MS - 10**9}, [NOW_MS - i for i in range(100, 900)])
    assert walk(None, NOW_MS, read) == [NOW_MS - 10**9, NOW_MS - 5]
    assert reads == [(None, NOW_MS, False)]


def test_every_live_row_among_many_tombstones_is_read_and_no_read_meets_too_many():
    """Ten times the threshold of tombstones over two minutes below the top, live rows among
    them, above them, and a day and a year below them: all found, in a few dozen reads (the
    walk down to 1970 included), only some refused."""
    rng = random.Random(7)
    tombstones = sorted(rng.randrange(NOW_MS - 120_000, NOW_MS - 1_000) for _ in range(10_000))
    live = {NOW_MS, NOW_MS - 500, NOW_MS - 60_000, NOW_MS - 86_400_000, NOW_MS - 3 * 10**10}
    live |= {rng.randrange(NOW_MS - 120_000, NOW_MS) for _ in range(50)}
    read, reads = node(live, tombstones)
    assert walk(None, NOW_MS, read) == sorted(live)
    assert len(reads) < 60
    refused = [r for r in reads if r[2]]
    assert 1 <= len(refused) <= 15
    assert reads[-1][0] is None  # the last slice is open below 1970


def test_a_floor_bounds_the_walk_and_every_slice_stays_above_it():
    tombstones = [NOW_MS - 10_000 - i for i in range(3 * THRESHOLD)]
    low = NOW_MS - 3_600_000
    live = {low + 1, NOW_MS - 10_000 - 1_500, NOW_MS}
    read, reads = node(live | {low, low - 1}, tombstones)
    assert walk(low, NOW_MS, read) == sorted(live)
    assert all(start is not None and start >= low for start, _top, _r in reads)
    assert reads[-1][0] == low


def test_the_walk_halves_a_refused_slice_down_to_one_millisecond_then_gives_up():
    step = SliceWalk(None, NOW_MS).refused()
    assert step.width == FIRST_SLICE_MS and step.start == NOW_MS - FIRST_SLICE_MS
    assert SliceWalk(NOW_MS - 10, NOW_MS).refused().width == 5
    with pytest.raises(ValueError, match=r"more tombstones than the node reads in one request"):
        SliceWalk(NOW_MS - 1, NOW_MS).refused()
    one = SliceWalk(None, NOW_MS, 1)
    with pytest.raises(ValueError):
        one.refused()
    assert SliceWalk(None, NOW_MS, 4).read() == SliceWalk(None, NOW_MS - 4, 8)
