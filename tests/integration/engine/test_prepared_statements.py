"""A family's statements are prepared once per connection and set up (its consistency, its
serial consistency, its timestamp binding) before any thread can run them."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from cassandra import ConsistencyLevel
from counters.store import statements

pytestmark = pytest.mark.integration


def test_a_statement_asked_for_by_two_threads_at_once_runs_at_the_familys_consistency(
    make_family, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard's bucket threads ask for the same statement on first use. The one that found it
    new used to set it up after handing it to the connection's cache, where the other took it
    bare: its requests then ran at the execution profile's LOCAL_QUORUM and LOCAL_SERIAL, not
    the family's QUORUM and SERIAL (seen comparing a run's requests statement by statement).
    The setup is slowed down here so that the second thread always asks while it runs."""
    _family, store, _client = make_family(consistency="QUORUM")
    slow_once = threading.Event()
    real = statements.millis_timestamps

    def slow_setup(cqltype: Any) -> Any:
        if not slow_once.is_set():
            slow_once.set()
            time.sleep(0.5)
        return real(cqltype)

    monkeypatch.setattr(statements, "millis_timestamps", slow_setup)
    got: list[tuple[Any, int | None, int | None]] = []

    def ask() -> None:
        statement = store.statements.prepare(
            "test_conditional",
            "UPDATE {compact} SET {value} = ? WHERE {key_where} IF {value} = ?",
            serial=True,
        )
        # as the thread's first request would run it, right after it got the statement
        got.append((statement, statement.consistency_level, statement.serial_consistency_level))

    first = threading.Thread(target=ask)
    first.start()
    assert slow_once.wait(30)  # the first thread is setting the statement up
    second = threading.Thread(target=ask)
    second.start()
    first.join(30)
    second.join(30)

    assert len(got) == 2 and got[0][0] is got[1][0]
    for _statement, consistency, serial in got:
        assert (consistency, serial) == (ConsistencyLevel.QUORUM, ConsistencyLevel.SERIAL)
