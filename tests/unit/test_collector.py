"""Python's cyclic collector around a shard's step (``compaction.collector_relaxed``)."""

from __future__ import annotations

import gc
import threading

import pytest
from counters.compaction.common import STEP_GC_THRESHOLD, collector_relaxed

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def default_thresholds():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_the_step_threshold_holds_inside_nested_steps_and_the_old_one_after():
    with collector_relaxed():
        assert gc.get_threshold() == (STEP_GC_THRESHOLD, 10, 10)
        with collector_relaxed():
            assert gc.get_threshold()[0] == STEP_GC_THRESHOLD
        assert gc.get_threshold()[0] == STEP_GC_THRESHOLD  # the outer step still runs
    assert gc.get_threshold() == (700, 10, 10)


def test_a_callers_own_thresholds_come_back_and_a_disabled_collector_stays_off():
    gc.set_threshold(5000, 20, 30)
    gc.disable()
    try:
        with collector_relaxed():
            assert gc.get_threshold() == (STEP_GC_THRESHOLD, 20, 30)
        assert gc.get_threshold() == (5000, 20, 30) and not gc.isenabled()
    finally:
        gc.enable()


def test_the_old_threshold_is_back_after_an_error_and_after_steps_in_threads():
    with pytest.raises(RuntimeError), collector_relaxed():
        raise RuntimeError("a step failed")
    assert gc.get_threshold() == (700, 10, 10)
    inside = threading.Barrier(4)
    seen: list[int] = []

    def step() -> None:
        with collector_relaxed():
            inside.wait()  # all four steps overlap here
            seen.append(gc.get_threshold()[0])

    threads = [threading.Thread(target=step) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [STEP_GC_THRESHOLD] * 4
    assert gc.get_threshold() == (700, 10, 10)
