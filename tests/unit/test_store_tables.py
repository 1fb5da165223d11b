"""The store composed by table (issue #42): ``Store`` is a container with no base class,
holding the statements core (``store.statements``), the keys (``store.keys``) and one object
per table over them, each reached only through its attribute; no class under ``store/``
inherits another of the project's, and no object there reaches into another's private names."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
from counters import store as store_package
from counters.config import Family
from counters.store import (
    AuditLog,
    IndexTable,
    Keys,
    LeaseTable,
    LedgerTable,
    OwnersTable,
    QuarantineTable,
    RawTable,
    Reader,
    RunLogTable,
    Statements,
    StateTable,
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
        (QuarantineTable, {"add", "read_quarantine", "release"}),
        (LeaseTable, {"acquire_lease", "renew_lease", "release_lease"}),
        (StateTable, {"family_state", "advance_family_epoch", "retire"}),
        (OwnersTable, {"table_owners", "claim_table", "replace_identity"}),
        (AuditLog, {"page", "write"}),
        (Keys, {"bucket", "shard"}),
        (Statements, {"prepare", "concurrent"}),
    ],
)
def test_a_composed_table_is_only_reached_through_its_attribute(
    table: type, some: set[str]
) -> None:
    methods = sorted(name for name in vars(table) if not name.startswith("_"))
    assert some <= set(methods)
    assert table.__mro__ == (table, object), f"{table.__name__} holds the core, not inherits it"
    store = a_store()
    on_store = [
        name
        for name in methods
        if name not in STORE_OWN and (hasattr(Store, name) or hasattr(store, name))
    ]
    assert not on_store, f"{table.__name__}'s methods still on Store itself: {on_store}"


STORE_PARTS = {
    "statements",
    "keys",
    "raw",
    "index",
    "ledger",
    "runs",
    "state",
    "owners",
    "lease",
    "quarantine",
    "audit",
    "reader",
}
STORE_OWN = {"family", "conn", "layout", "with_shards"}
"""What a store says it is for (read-only) and its one way to another shard count."""
CLASS_DUNDERS = {"__dict__", "__doc__", "__init__", "__module__", "__weakref__"}
CLASS_DUNDERS |= {"__annotations__", "__firstlineno__", "__static_attributes__", "__qualname__"}
"""What Python puts in a class's namespace: no ``__getattr__`` that would delegate to a part."""


def a_store() -> Store:
    """A store built without a node: statements are prepared on first use, none is here."""
    family = Family.model_validate(
        {"name": "f", "keyspace": "k", "raw_table": "r", "compact_table": "c", "lag": "1m"}
    )
    return Store(object(), family)  # a stand-in connection: nothing is sent


def test_the_store_holds_its_parts_and_nothing_else() -> None:
    """Store's own names, exactly: a method added to it (``page``, ``bucket``) or a
    ``__getattr__`` delegating to its parts fails here, as ``hasattr(Store, name)`` could not
    see an instance's delegation."""
    own = {name for name in vars(Store) if not name.startswith("__")}
    assert own == STORE_OWN
    assert set(vars(Store)) - own <= CLASS_DUNDERS, set(vars(Store)) - own - CLASS_DUNDERS
    assert set(vars(a_store())) == STORE_PARTS


STORE_DIR = Path(store_package.__file__).parent
STORE_MODULES = sorted(f"counters.store.{p.stem}" for p in STORE_DIR.glob("*.py"))
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make"})
"""Underscored by ``namedtuple`` so as not to clash with fields, public all the same."""


def test_the_store_is_a_container_without_a_base_class() -> None:
    assert Store.__mro__ == (Store, object)
    assert Statements.__mro__ == (Statements, object)
    assert Keys.__mro__ == (Keys, object)
    read_only = {n for n, v in vars(Store).items() if isinstance(v, property)}
    assert read_only == {"family", "conn", "layout"}, "what a store is for, read-only"
    assert all(v.fset is None for n, v in vars(Store).items() if n in read_only)


def test_no_class_under_store_inherits_a_class_of_the_project() -> None:
    """Composition only: a class of ``store/`` may subclass the driver's or Python's classes
    (``MillisTimestampType``, ``NamedTuple`` records, exceptions), never the project's."""
    inheriting = []
    for name in STORE_MODULES:
        module = importlib.import_module(name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or issubclass(cls, BaseException):
                continue
            project = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] == "counters"]
            if project:
                inheriting.append(f"{name}.{cls_name} inherits {project[0].__qualname__}")
    assert not inheriting


def private_reaches(source: str) -> list[str]:
    """``x._name`` where ``x`` is not ``self`` (a dunder or the ``namedtuple`` API aside)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr not in NAMEDTUPLE_API
            and not (isinstance(node.value, ast.Name) and node.value.id == "self")
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_private_reaches_are_found() -> None:
    assert private_reaches("self.statements._run(x)") == ["1: self.statements._run"]
    assert private_reaches("schema._has_table(s)\nself._x\nr._asdict()") == ["1: schema._has_table"]


def test_no_object_under_store_reaches_into_another_objects_private_names() -> None:
    reaches = {
        path.name: found
        for path in sorted(STORE_DIR.glob("*.py"))
        if (found := private_reaches(path.read_text()))
    }
    assert not reaches
