"""The cyclic collector's pause around a shard's step (``compaction.collector_paused``)."""

from __future__ import annotations

import gc
import threading

import pytest
from counters.compaction import collector_paused

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def collector_on():
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_off_inside_and_on_again_after_nested_pauses():
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer step still runs
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off():
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_the_collector_is_back_after_an_error_and_after_steps_in_threads():
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a step failed")
    assert gc.isenabled()
    inside = threading.Barrier(4)
    seen: list[bool] = []

    def step() -> None:
        with collector_paused():
            inside.wait()  # all four steps overlap here
            seen.append(gc.isenabled())

    threads = [threading.Thread(target=step) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [False] * 4
    assert gc.isenabled()
