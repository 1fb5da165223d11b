"""Kinds as rules chosen once (CONTRIBUTING.md, "Adding a kind"): every kind has rules that
answer every hook, and no module outside ``config.py`` and ``kinds/`` decides by the kind
itself, so a new kind's file is the one place its differences live."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
from counters.kinds import RULES, DemoWriter, DerivedTable, Kind, KindRules, Reconcile
from counters.kinds.registry import register
from counters.maintenance import RECOUNTS

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "counters"
ALLOWED = {PACKAGE / "config.py"} | set((PACKAGE / "kinds").rglob("*.py"))
"""The modules that may name a kind: the YAML's validation and the kinds themselves."""
HOOK_TYPES: dict[str, tuple[type, ...]] = {
    "counts": (str,),
    "newer_rows": (str,),
    "value_column": (str, type(None)),
    "keeps_rows": (bool,),
    "yaml_defaults": (Mapping,),
    "derived_table": (DerivedTable, type(None)),
    "summed": (bool,),
    "members": (bool,),
    "reads_from_floor": (bool,),
    "creates_raw_table": (bool,),
    "reset_refusal": (str, type(None)),
    "reconcile": (Reconcile,),
    "demo": (DemoWriter,),
}


def test_every_hook_is_listed_here() -> None:
    assert set(KindRules.__abstractmethods__) == set(HOOK_TYPES)


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_has_rules_that_answer_every_hook(kind: Kind) -> None:
    rules = RULES[kind]
    assert rules.kind is kind
    assert not type(rules).__abstractmethods__
    for hook, types in HOOK_TYPES.items():
        assert isinstance(getattr(rules, hook), types), f"{kind}: {hook}"
    assert rules.reconcile is Reconcile.NOTHING or rules.reconcile in RECOUNTS, kind


def test_a_kind_that_leaves_out_a_hook_or_comes_twice_is_refused() -> None:
    class Partial(KindRules):
        kind = Kind.INCREMENTS
        counts = "half of what a kind says"

    before = dict(RULES)
    with pytest.raises(TypeError, match="abstract"):
        register(Partial)
    with pytest.raises(TypeError, match="has rules already"):
        register(type(RULES[Kind.INCREMENTS]))
    assert before == RULES


def _is_kind(node: ast.expr) -> bool:
    """``x.kind`` or ``x.kind.value``."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    return isinstance(node, ast.Attribute) and node.attr == "kind"


def decisions_by_kind(path: Path) -> list[str]:
    """Where ``path`` decides by the kind: it imports ``Kind``, names a member ``Kind.X``, or
    compares something's ``.kind`` (or ``.kind.value``) with a kind's name."""
    names = {k.value for k in Kind}
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and any(a.name == "Kind" for a in node.names):
            found.append(f"{path.name}:{node.lineno} imports Kind")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "Kind"
        ):
            found.append(f"{path.name}:{node.lineno} names Kind.{node.attr}")
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            kind_of = any(_is_kind(o) for o in operands)
            named = any(isinstance(o, ast.Constant) and o.value in names for o in operands)
            if kind_of and named:
                found.append(f"{path.name}:{node.lineno} compares a kind with its name")
    return found


def test_no_module_outside_the_kinds_decides_by_the_kind() -> None:
    found = [
        where
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in ALLOWED
        for where in decisions_by_kind(path)
    ]
    assert not found, f"ask the family's rules (counters.kinds) instead: {found}"


def test_the_check_sees_each_way_of_deciding_by_the_kind(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    for line in (
        "from counters.config import Kind",
        "unique = family.kind is Kind.UNIQUE",
        "rows = family.kind.value == 'rows'",
        "rows = 'rows' != family.kind",
    ):
        source.write_text(line + "\n")
        assert decisions_by_kind(source), line
    source.write_text("x = m.kind == 'incr'\nmembers = family.rules.members\n")
    assert not decisions_by_kind(source)


KIND_IN_TEMPLATE = re.compile(r"kind\s*[!=]=\s*[\"'](?:increments|rows|unique)[\"']")


def test_no_template_decides_by_the_kind() -> None:
    found = [
        f"{path.name}:{number}"
        for path in sorted(PACKAGE.rglob("*.html"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if KIND_IN_TEMPLATE.search(line)
    ]
    assert not found, f"pass the family's rules to the page instead: {found}"
    assert KIND_IN_TEMPLATE.search('{{ "x" if c.kind == "rows" else "y" }}')
