"""Each table declares its statements once, by name, at class level (``STATEMENTS``), and
prepares only those; docs/data-model.md lists them as declared (``counters.store.catalog``)."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections import Counter
from pathlib import Path

import pytest
from counters import store as store_package
from counters.store import catalog
from counters.store.statements import Cql, Statements, declare

pytestmark = pytest.mark.unit

STORE_DIR = Path(store_package.__file__).parent


def test_the_doc_lists_the_declared_statements() -> None:
    """docs/data-model.md's list is the generator's: a statement added, changed or removed
    without ``python -m counters.store.catalog`` fails here."""
    doc = catalog.DOC.read_text()
    assert catalog.updated(doc) == doc, "run python -m counters.store.catalog"
    assert catalog.main(["--check"]) == 0


def test_a_stale_doc_is_found(tmp_path: Path) -> None:
    doc = tmp_path / "data-model.md"
    doc.write_text(catalog.DOC.read_text().replace("`raw_scan`", "`raw_scan_old`"))
    assert catalog.main(["--doc", str(doc), "--check"]) == 1
    assert catalog.main(["--doc", str(doc)]) == 0  # written again
    assert catalog.main(["--doc", str(doc), "--check"]) == 0


def test_each_statement_is_declared_once() -> None:
    """One name, one text: a family's statements are prepared by name, whatever table asks,
    and the same CQL under two names is one statement written twice."""
    found = catalog.declared()
    names = Counter(name for _table, name, _cql in found)
    texts = Counter(cql.text for _table, _name, cql in found)
    assert [n for n, times in names.items() if times > 1] == []
    assert [t for t, times in texts.items() if times > 1] == []


def test_every_declaring_class_is_in_the_catalog() -> None:
    declaring = {
        cls
        for path in STORE_DIR.glob("*.py")
        for _name, cls in inspect.getmembers(
            importlib.import_module(f"counters.store.{path.stem}"), inspect.isclass
        )
        if "STATEMENTS" in vars(cls)
    }
    assert declaring == set(catalog.TABLES)


def prepared_names(source: str) -> dict[str, set[str]]:
    """Per class, the literal names it passes to ``self.statements.prepared(self, name)``
    (and ``rows_by_partition(self, name, ...)``), and ``"?"`` for any ``prepare`` call."""
    out: dict[str, set[str]] = {}
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        names = out.setdefault(cls.name, set())
        for node in ast.walk(cls):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr == "prepare":
                names.add("?")
            if node.func.attr in ("prepared", "rows_by_partition") and len(node.args) > 1:
                names |= {
                    n.value
                    for n in ast.walk(node.args[1])
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                }
    return out


def strings_outside_statements(source: str) -> set[str]:
    """The string literals of a class's source but for its ``STATEMENTS``."""
    cls = ast.parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)
    body = [
        node
        for node in cls.body
        if not (
            isinstance(node, ast.Assign)
            and [ast.unparse(t) for t in node.targets] == ["STATEMENTS"]
        )
    ]
    return {
        n.value
        for node in body
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_the_finder_sees_prepare_calls_and_names() -> None:
    source = (
        "class T:\n"
        "    def f(self):\n"
        "        self.statements.prepared(self, 'a' if x else 'b')\n"
        "        self.statements.prepare('c', 'SELECT 1')\n"
    )
    assert prepared_names(source) == {"T": {"a", "b", "?"}}


@pytest.mark.parametrize("table", catalog.TABLES, ids=lambda t: t.__name__)
def test_a_table_prepares_only_its_declared_statements(table: type) -> None:
    """No CQL text outside ``STATEMENTS``: a table calls ``prepared`` with one of its names,
    never ``prepare`` with text of its own; and every declared name is used (a name used
    with a suffix, ``ledger_scan`` + ``_values``, counts as its own)."""
    used = prepared_names(Path(inspect.getfile(table)).read_text())[table.__name__]
    assert "?" not in used, f"{table.__name__} prepares CQL text of its own"
    declared = set(vars(table)["STATEMENTS"])
    assert used - declared <= {"_values", "_in", "_range"}, used - declared
    named = used | strings_outside_statements(inspect.getsource(table))
    unused = {
        name
        for name in declared
        if name not in named
        and not any(name.startswith(u) and name != u for u in used if u and u[0] != "_")
        and not name.endswith(("_in", "_range", "_values"))
    }
    assert not unused, f"{table.__name__} declares what it never prepares: {unused}"


def test_a_declared_text_names_its_parts_in_single_braces() -> None:
    """``{{key}}`` in a declared text (a brace doubled as an f-string's, in a literal that is
    not one) reaches the node as ``{key}``: a syntax error on the first run that prepares it."""
    doubled = [name for _t, name, cql in catalog.declared() if "{{" in cql.text or "}}" in cql.text]
    assert doubled == []


def test_a_by_partition_statement_declares_its_in_twin() -> None:
    """One declaration gives both forms, so a second copy cannot drift: the ``_in`` text is
    generated (its key leading its rows, ``{key_in}``, an aggregate grouped by partition)."""
    declared = declare(
        rows=Cql(
            "SELECT {row_columns} FROM {raw} WHERE {key_where} AND {time} > ?", by_partition=True
        ),
        sums=Cql("SELECT count(*), sum(x) FROM {raw} WHERE {key_where}", by_partition=True),
        other=Cql("SELECT 1 FROM {raw} WHERE {key_where}"),
    )
    assert list(declared) == ["rows", "rows_in", "sums", "sums_in", "other"]
    assert declared["rows_in"].text == (
        "SELECT {key}, {row_columns} FROM {raw} WHERE {key_in} AND {time} > ?"
    )
    assert declared["sums_in"].text == (
        "SELECT {key}, count(*), sum(x) FROM {raw} WHERE {key_in} GROUP BY {key}"
    )
    with pytest.raises(ValueError, match=r"statement 'bad': by_partition needs a SELECT of one"):
        declare(bad=Cql("DELETE FROM {raw} WHERE {key_where}", by_partition=True))
    with pytest.raises(ValueError, match=r"statement 'rows': rows_in is declared by by_partition"):
        declare(rows=declared["rows"], rows_in=declared["rows_in"])


def test_a_familys_parts_are_filled_once_and_a_call_after_the_first_is_a_lookup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``prepared`` fills a text's family parts from its table's ``statement_parts``, once:
    every later call for the name finds the prepared statement without building any part."""

    class Table:
        STATEMENTS = declare(read=Cql("SELECT {row_columns} FROM {raw} WHERE {key_where}"))
        built = 0

        @property
        def statement_parts(self) -> dict[str, str]:
            Table.built += 1
            return {"row_columns": "a, b"}

    statements = Statements.__new__(Statements)
    statements._prepared = {}
    sent: list[tuple[str, str]] = []

    def prepare(name: str, cql: str, serial: bool = False) -> str:
        sent.append((name, cql))
        statements._prepared[name] = cql
        return cql

    monkeypatch.setattr(statements, "prepare", prepare)
    table = Table()
    for _ in range(3):
        assert statements.prepared(table, "read") == "SELECT a, b FROM {raw} WHERE {key_where}"
    assert sent == [("read", "SELECT a, b FROM {raw} WHERE {key_where}")] and Table.built == 1


def test_a_store_table_passes_only_parts_that_vary() -> None:
    """A part of a statement's text that is the family's (a select list, a relation, a
    measure) is its table's ``statement_parts``, computed once, not built again on every call:
    only a row's own columns (a reshard's moves, an audit row) are passed to ``prepared``."""
    varying = {"ledger_rows", "ledger_row_insert", "audit_write"}
    passed = set()
    for path in STORE_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("prepared", "rows_by_partition")
                and any(k.arg not in (None, "params") for k in node.keywords)
            ):
                passed.add(ast.literal_eval(node.args[1]))
    assert passed == varying
