"""Errors of a shard worker process reach the run that started it (``portable_error``)."""

import pickle
import threading

import pytest
from counters.compaction.pool import portable_error
from counters.core import CheckOutcome
from counters.errors import ChecksFailed, EngineError, LeaseHeld

pytestmark = pytest.mark.unit


class HoldsALock(Exception):
    """Like a driver error that keeps a reference to its connection."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.RLock()


def test_an_unpicklable_error_is_named_not_lost() -> None:
    error = portable_error(HoldsALock("write timed out"), "family 'f' shard 3 compact")
    assert type(error) is EngineError
    assert str(error) == "family 'f' shard 3 compact: HoldsALock: write timed out"
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


def test_an_error_not_rebuilt_from_its_message_is_named() -> None:
    checks = ChecksFailed("totals differ", [CheckOutcome("conservation", False, True, "off by 1")])
    error = portable_error(checks, "shard 0 compact")
    assert type(error) is EngineError and "ChecksFailed: totals differ" in str(error)


def test_a_portable_error_is_kept_as_it_is() -> None:
    held = LeaseHeld("family 'f' shard 1 is held by run 'r'")
    assert portable_error(held, "shard 1 compact") is held
