"""One time format, held in a test: no module but the time module (``core/moments.py``) formats
a time as text. ``to_text`` is the one text form of a time (ISO 8601, UTC, milliseconds, ``Z``),
``stamp``/``day_text``/``clock_label`` the others the module owns (file names, day folders,
chart axes); a ``.isoformat()``, a ``.strftime()``, a ``%``-format spec in an f-string or
``format(t, "%...")`` elsewhere is a sixth format in the making.

Read from the source with ``ast`` (nothing is imported): the package, the DAG files and the
plugins folder. Parsing (``fromisoformat``) is allowed: readers stay tolerant of old forms."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TIME_MODULE = ROOT / "include" / "counters" / "core" / "moments.py"
SCANNED = (ROOT / "include" / "counters", ROOT / "dags", ROOT / "plugins")
FORMATTING_METHODS = frozenset({"isoformat", "strftime", "ctime", "asctime"})


def formatting_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """Where ``tree`` formats a time as text: ``(line, what)``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in FORMATTING_METHODS:
                found.append((node.lineno, f".{func.attr}()"))
            elif (
                isinstance(func, ast.Name)
                and func.id == "format"
                and len(node.args) == 2
                and isinstance(node.args[1], ast.Constant)
                and "%" in str(node.args[1].value)
            ):
                found.append((node.lineno, f"format(..., {node.args[1].value!r})"))
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            spec = "".join(
                str(part.value)
                for part in ast.walk(node.format_spec)
                if isinstance(part, ast.Constant)
            )
            if "%" in spec:
                found.append((node.lineno, f"f-string spec {spec!r}"))
    return found


def scanned_files() -> list[Path]:
    return sorted(p for folder in SCANNED if folder.exists() for p in folder.rglob("*.py"))


def test_no_module_outside_the_time_module_formats_a_time() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in scanned_files()
        if path != TIME_MODULE
        for line, what in formatting_calls(ast.parse(path.read_text(), str(path)))
    ]
    assert not offenders, (
        "a time formatted outside include/counters/core/moments.py (use to_text, stamp, "
        "day_text or clock_label there): " + "; ".join(offenders)
    )


def test_the_rule_sees_every_way_to_format_a_time() -> None:
    """The scan itself: each form it must catch, and parsing, which it must not."""
    caught = formatting_calls(
        ast.parse(
            "a = t.isoformat()\n"
            "b = t.astimezone(UTC).strftime('%Y')\n"
            "c = f'{t:%Y-%m-%d}'\n"
            "d = format(t, '%H:%M')\n"
            "e = date.fromisoformat(s)\n"
            "f = f'{n:.2f} {t}'\n"
        )
    )
    assert sorted(line for line, _what in caught) == [1, 2, 3, 4]
    assert TIME_MODULE.exists() and formatting_calls(ast.parse(TIME_MODULE.read_text()))
    assert any(p.parent.name == "dags" for p in scanned_files())
