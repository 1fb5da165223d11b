"""docs/limits.md, the limits-and-faults matrix: every cell names a test that exists, or says
plainly that none does. A test renamed or moved without the matrix would leave a cell naming
nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PROJECT = Path(__file__).resolve().parents[2]
MATRIX = PROJECT / "docs" / "limits.md"
PREFIXES = {
    "E/": "tests/integration/engine/",
    "A/": "tests/integration/airflow/",
    "U/": "tests/unit/",
    "C/": "tests/cluster/",
}
PROMISES = ["read", "loss", "twice", "delete", "audit", "alert"]
PLAIN = ("not covered", "n/a", "same")
REFERENCE = re.compile(r"`([EAUC]/[\w/]+\.py)(?:::([\w…]+))?`")


def tables(text: str) -> list[list[list[str]]]:
    """Each markdown table of the page, as rows of cells (the header row first)."""
    found: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            if not set(line) <= set("|- "):
                current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            found.append(current)
            current = []
    return found


def resolve(path: str, name: str | None) -> list[str]:
    """What is wrong with one reference (empty: it names an existing test)."""
    prefix = path[:2]
    file = PROJECT / (PREFIXES[prefix] + path[2:])
    if not file.exists():
        test_dir = file.parent
        found = list(test_dir.rglob(file.name)) if test_dir.exists() else []
        if not found:
            return [f"{path}: no such file"]
        file = found[0]
    if name is None:
        return []
    pattern = re.compile(
        r"^(?:    )?def (" + ".*".join(re.escape(p) for p in name.split("…")) + r")\(", re.M
    )
    return [] if pattern.search(file.read_text()) else [f"{path}::{name}: no such test"]


def test_every_cell_of_the_matrix_names_an_existing_test_or_says_none_does():
    text = MATRIX.read_text()
    matrices = [t for t in tables(text) if t[0][0] == "" and [r[0] for r in t[1:]] == PROMISES]
    assert len(matrices) >= 7, "a table per kind of stress, rows the six promises"
    problems: list[str] = []
    cells = 0
    for table in matrices:
        for row in table[1:]:
            for column, cell in zip(table[0][1:], row[1:], strict=True):
                cells += 1
                references = REFERENCE.findall(cell)
                if not references and not cell.startswith(PLAIN):
                    problems.append(f"{row[0]} / {column}: {cell!r} names no test")
                for path, name in references:
                    problems += resolve(path, name or None)
    assert not problems, "\n".join(problems)
    assert cells >= 100
