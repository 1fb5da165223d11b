"""Exact at every moment and for every caller (issue #37), each against the real node."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytestmark = pytest.mark.integration


def test_a_retried_increment_with_its_identity_and_time_is_one_row(make_family, t0):
    _family, _store, client = make_family()
    at = t0 + timedelta(seconds=3)
    client.increment("r", 500, at=at, identity=("P1", 2))
    client.increment("r", 500, at=at, identity=("P1", 2))  # the caller retries the call
    assert client.read("r") == 500


def test_an_identity_without_the_events_time_is_refused_and_writes_nothing(make_family):
    _family, _store, client = make_family()
    with pytest.raises(ValueError, match=r"identity \('P1', 2\) needs its event's time"):
        client.increment("r", 500, identity=("P1", 2))
    with pytest.raises(ValueError, match=r"needs its event's time too \(at=\.\.\.\)"):
        client.increment("r", 500, actor="P1", version=2)
    assert client.read("r") == 0


def test_actor_without_version_is_refused_so_two_events_never_merge(make_family, t0):
    _family, _store, client = make_family()
    at = t0 + timedelta(seconds=1)
    with pytest.raises(ValueError, match="pass actor= and version= together"):
        client.increment("r", 5, at=at, actor="alice")
    with pytest.raises(ValueError, match="pass actor= and version= together"):
        client.increment("r", 5, at=at, version=3)
    client.increment("r", 5, at=at, actor="alice", version=1)
    client.increment("r", 7, at=at, actor="alice", version=2)
    assert client.read("r") == 12
