"""The store composed by table (issue #42): ``Store`` is a container with no base class,
holding the statements core (``store.statements``), the keys (``store.keys``) and one object
per table over them, each reached only through its attribute; no class under ``store/``
inherits another of the project's, and no object there reaches into another's private names."""

from __future__ import annotations

import pytest
from counters.store import (
    ControlTable,
    IndexTable,
    LedgerTable,
    RawTable,
    Reader,
    RunLogTable,
    Store,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("table", "some"),
    [
        (RawTable, {"insert_raw", "read_rows", "delete_rows", "recount"}),
        (IndexTable, {"mark_touched", "touched", "forget_touched"}),
        (LedgerTable, {"commit_bucket", "read_ledger", "read_copies", "fence_bucket"}),
        (Reader, {"read_values", "read_epochs"}),
        (RunLogTable, {"read_run_commits", "mark_verified"}),
        (ControlTable, {"acquire_lease", "read_quarantine", "family_state"}),
    ],
)
def test_a_composed_table_is_only_reached_through_its_attribute(
    table: type, some: set[str]
) -> None:
    methods = sorted(name for name in vars(table) if not name.startswith("_"))
    assert some <= set(methods)
    assert table.__mro__ == (table, object), f"{table.__name__} holds the core, not inherits it"
    on_store = [name for name in methods if hasattr(Store, name)]
    assert not on_store, f"{table.__name__}'s methods still on Store itself: {on_store}"
