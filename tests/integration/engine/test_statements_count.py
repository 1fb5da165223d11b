"""Statements counts every request a table sends, in the phase of the thread that sends it; a
phase is a block, and a thread's requests after it count in the phase it was in before. The
requests are seen by the driver itself (its request listener on the real session)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

pytestmark = pytest.mark.integration


def test_every_request_is_counted_in_its_threads_phase(make_family, t0):
    _family, store, _client = make_family()
    epoch = t0 + timedelta(minutes=1)
    store.owners.table_owners()  # the layout and the keyspace's metadata, read once
    store.statements.requests.clear()
    sent: list[Any] = []
    session = store.statements.session
    session.add_request_init_listener(sent.append)
    try:
        with store.statements.phase("lease"):
            assert store.lease.acquire_lease(0, "run-a", 60) is None  # 1: taken
            assert store.lease.renew_lease(0, "run-a", 60)  # 1
            with store.statements.phase("state"):
                store.state.advance_family_epoch(epoch, "run-a", epoch, 1)  # 2: epoch, sweep
                assert store.state.family_epoch() == epoch  # 1
                with ThreadPoolExecutor(1) as pool:  # another thread: not in this phase
                    assert pool.submit(store.state.family_state).result().shards == 2
            assert store.statements.current_phase == "lease"
            store.lease.release_lease(0, "run-a")  # 1
            assert store.quarantine.count_quarantined() == 0  # 1 a shard: 2
        assert store.statements.current_phase == "other"
        store.quarantine.read_quarantine_anywhere(0)  # state, owners, 1 a shard count: 3
    finally:
        session.remove_request_init_listener(sent.append)
    assert dict(store.statements.requests) == {"lease": 5, "state": 3, "other": 4}
    assert len(sent) == sum(store.statements.requests.values())
