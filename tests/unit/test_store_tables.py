"""The store composed by table: a table moved out of ``Store``'s mixins is reached only through
its attribute, and holds the statements core rather than inheriting it (issue #42)."""

from __future__ import annotations

import pytest
from counters.store import RunLogTable, Store, StoreBase

pytestmark = pytest.mark.unit


def test_the_run_log_is_only_reached_as_store_runs() -> None:
    methods = sorted(name for name in vars(RunLogTable) if not name.startswith("_"))
    assert "read_run_commits" in methods and "mark_verified" in methods
    assert not issubclass(RunLogTable, StoreBase), "RunLogTable holds the core, not inherits it"
    on_store = [name for name in methods if hasattr(Store, name)]
    assert not on_store, f"run-log methods still on Store itself: {on_store}"
