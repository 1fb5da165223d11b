"""The architecture held in a test: imports only go down CONTRIBUTING.md's layer table, no
module imports itself back through others, and no private name is imported across modules.

Read from the source with ``ast`` (nothing is imported), so lazy imports inside functions and
``TYPE_CHECKING`` imports count like the rest: a cycle or an upward import that only a lazy
import hides is still one."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
SOURCES = {"counters": ROOT / "include" / "counters", "bench": ROOT / "bench"}

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kinds", ("kinds", "kinds.*")),
    ("config", ("config",)),
    ("core", ("core", "core.*", "audit", "errors", "rowkeys")),
    (
        "archive",
        (
            "archive",
            "archive.values",
            "archive.record",
            "archive.table",
            "archive.recount_rule",
            "archive.storage",
        ),
    ),
    ("gx", ("gx", "gx.*")),
    (
        "store",
        (
            "store",
            "store.statements",
            "store.keys",
            "store.records",
            "store.raw",
            "store.touched",
            "store.ledger",
            "store.runlog",
            "store.control",
            "store.auditlog",
            "store.reads",
            "store.catalog",
            "schema",
            "connection",
            "connection_settings",
        ),
    ),
    (
        "engine",
        (
            "compaction",
            "compaction.*",
            "maintenance",
            "identity",
            "reshard",
            "recount",
            "engine",
        ),
    ),
    ("reads", ("status", "client", "audit_export")),
    (
        "interfaces",
        ("", "__main__", "cli", "cli.*", "metrics", "health", "demo", "airflow", "airflow.*"),
    ),
)
"""CONTRIBUTING.md's table, bottom first, as module names under ``counters`` ("" is the package
itself, "x.*" every module under the package x): a module may import its own layer and those
above it in this tuple, never one below."""

BENCH_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("tools", ("ops", "nodeprofile", "dags", "required", "kinds")),
    ("harness", ("params", "harness", "report")),
    (
        "sections",
        ("mainset", "scaling", "steady", "idle", "reads", "limits", "probes", "audit", "archive"),
    ),
    (
        "entry points",
        ("", "__main__", "run", "worker", "results", "orchestration", "shape", "taskprofile"),
    ),
)
"""CONTRIBUTING.md's layers of ``bench`` (outside the package: it may import any of
``counters``, which never imports it), read as ``LAYERS``: a section module runs on the harness,
the harness on the tools, and only the entry points assemble sections."""

TABLES = {"counters": LAYERS, "bench": BENCH_LAYERS}


@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``importer`` imports ``names`` from module ``target``."""

    importer: str
    target: str
    names: tuple[str, ...]
    line: int

    def __str__(self) -> str:
        names = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.importer}:{self.line} imports {self.target}{names}"


def module_name(package: str, root: Path, path: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_files() -> dict[str, Path]:
    """Every module of ``counters`` and ``bench``, by dotted name."""
    return {
        module_name(package, root, path): path
        for package, root in SOURCES.items()
        for path in sorted(root.rglob("*.py"))
    }


def imports_of(name: str, path: Path, modules: set[str]) -> Iterator[Import]:
    """Every import of a project module in ``path``, wherever it is in the file; ``from p import
    m`` of a submodule ``m`` is an import of ``p.m``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in SOURCES:
                    yield Import(name, alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] not in SOURCES:
                continue
            names = tuple(alias.name for alias in node.names)
            submodules = [n for n in names if f"{target}.{n}" in modules]
            for sub in submodules:
                yield Import(name, f"{target}.{sub}", (), node.lineno)
            rest = tuple(n for n in names if n not in submodules)
            if rest or not names:
                yield Import(name, target, rest, node.lineno)


def all_imports() -> list[Import]:
    files = module_files()
    return [edge for name, path in files.items() for edge in imports_of(name, path, set(files))]


def layer_of(module: str) -> list[str]:
    """The layers of its package's table whose entries name ``module`` (exactly one, if the
    table is right)."""
    package = module.split(".")[0]
    inner = module.removeprefix(package).removeprefix(".")
    return [
        layer
        for layer, entries in TABLES[package]
        for entry in entries
        if inner == entry or (entry.endswith(".*") and inner.startswith(entry[:-1]))
    ]


def rank(layer: str, package: str = "counters") -> int:
    return [name for name, _ in TABLES[package]].index(layer)


def upward(edges: list[Import]) -> list[str]:
    """The imports of a lower layer's module from a higher layer's, within each package, and
    any import of ``bench`` from ``counters``."""
    found = []
    for edge in edges:
        package, target_package = edge.importer.split(".")[0], edge.target.split(".")[0]
        if package == "counters" and target_package == "bench":
            found.append(f"{edge}: the package imports the benchmark")
            continue
        if package != target_package:
            continue
        (importer_layer,), (target_layer,) = layer_of(edge.importer), layer_of(edge.target)
        if rank(target_layer, package) > rank(importer_layer, package):
            found.append(f"{edge}: {importer_layer} imports up from {target_layer}")
    return found


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def private_imports(edges: list[Import]) -> list[str]:
    return [
        f"{edge.importer}:{edge.line} imports {name}, private to {edge.target}"
        for edge in edges
        for name in edge.names
        if name.startswith("_") and not name.startswith("__") and edge.target != edge.importer
    ]


def documented_layers() -> dict[str, str]:
    """CONTRIBUTING.md's table: each module or package of ``counters``' top level (``x.py``,
    ``x/``) named in a row's module column, by the row's layer (a name that is not one, such as
    ``pool.py`` under ``airflow/``, is left out)."""
    top_level = {m.split(".")[1] for m in module_files() if m.startswith("counters.")}
    documented = {}
    for line in CONTRIBUTING.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] not in dict(LAYERS):
            continue
        for named in re.findall(r"`([a-z_]+)(?:\.py|/)`", cells[1]):
            if named in top_level:
                documented.setdefault(named, cells[0])
    return documented


def test_every_module_is_in_exactly_one_layer() -> None:
    modules = list(module_files())
    misplaced = {m: layer_of(m) for m in modules if len(layer_of(m)) != 1}
    assert not misplaced, f"modules not in exactly one layer of LAYERS/BENCH_LAYERS: {misplaced}"
    unused = [
        f"{package}.{entry}"
        for package, table in TABLES.items()
        for _, entries in table
        for entry in entries
        if not any(
            m.split(".")[0] == package
            and (
                m.removeprefix(package).removeprefix(".") == entry
                or (entry.endswith(".*") and m.startswith(f"{package}.{entry[:-1]}"))
            )
            for m in modules
        )
    ]
    assert not unused, f"the tables name modules that do not exist: {unused}"


def test_the_bench_layers_are_contributings() -> None:
    """CONTRIBUTING.md names each bench module in its layer's line ("- layer: `a`, `b`")."""
    text = CONTRIBUTING.read_text()
    for layer, entries in BENCH_LAYERS:
        line = next((x for x in text.splitlines() if x.startswith(f"- bench {layer}:")), "")
        named = set(re.findall(r"`([a-z_]+)`", line))
        wanted = {e for e in entries if e and e != "__main__"}
        assert named == wanted, f"CONTRIBUTING.md's bench {layer!r} line names {named}: {wanted}"


def test_the_layers_are_contributings_table() -> None:
    ours = {entry: layer for layer, entries in LAYERS for entry in entries if "." not in entry}
    ours.pop("")  # the package itself: its __init__.py, not a row's module
    documented = documented_layers()
    differ = {
        name: (layer, documented.get(name))
        for name, layer in ours.items()
        if documented.get(name) != layer
    }
    assert not differ, f"LAYERS' layer (left) differs from CONTRIBUTING.md's (right): {differ}"


def test_imports_only_go_down_the_layers() -> None:
    found = upward(all_imports())
    assert not found, "\n".join(found)


def test_no_import_cycles() -> None:
    found = cycles(all_imports())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_private_name_is_imported_across_modules() -> None:
    found = private_imports(all_imports())
    assert not found, "\n".join(found)


def test_the_checks_see_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The reader finds the imports a module only makes inside a function or for the type
    checker, and each check flags its case."""
    source = tmp_path / "sample.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from counters.cli import main\n"
        "def f():\n    from .compaction.fold import _bases\n"
    )
    modules = {"counters.core", "counters.cli", "counters.compaction.fold"}
    edges = list(imports_of("counters.core", source, modules))
    assert [(e.target, e.names) for e in edges] == [
        ("counters.cli", ("main",)),
        ("counters.compaction.fold", ("_bases",)),
    ]
    assert len(upward(edges)) == 2
    assert len(private_imports(edges)) == 1
    back = Import("counters.compaction.fold", "counters.core", ("x",), 1)
    assert cycles([*edges, back]) == [["counters.compaction.fold", "counters.core"]]


def test_airflow_is_imported_from_its_public_interface() -> None:
    """Airflow 3's public interface is ``airflow.sdk``: a name it exports is imported from
    there, never from the module that defines it (``airflow.sdk.definitions.*`` moves between
    releases), and no private module (``_x``) of Airflow's is imported at all."""
    import airflow.sdk

    exported = set(airflow.sdk.__all__)
    files = [*(ROOT / "include" / "counters").rglob("*.py"), *(ROOT / "dags").glob("*.py")]
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "airflow"
            ):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}"
            parts = (node.module or "").split(".")
            names = {alias.name for alias in node.names}
            if any(part.startswith("_") for part in parts):
                found.append(f"{where}: a private module")
            elif node.module.startswith("airflow.sdk.definitions"):
                found.append(f"{where}: internal (airflow.sdk exports what is public of it)")
            elif node.module.startswith("airflow.sdk.") and names & exported:
                found.append(f"{where}: {sorted(names & exported)} are airflow.sdk's")
    assert not found, found


MAX_MODULE_LINES = 800


def test_no_module_is_over_the_line_cap() -> None:
    """A module past 800 lines holds more than one thing: split it (CONTRIBUTING.md)."""
    over = {
        name: lines
        for name, path in module_files().items()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_every_path_in_the_where_to_start_table_exists() -> None:
    """CONTRIBUTING.md's "Where to start": each path it names is there (a rename breaks it)."""
    text = CONTRIBUTING.read_text()
    section = text.split("## Where to start", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    paths = {
        word.strip("`")
        for row in rows[1:]
        for word in re.findall(r"`[^`]+`", row)
        if "/" in word or word.endswith(".py`")
    }
    roots = ("tests/", "docs/", "bench/", "scripts/")
    missing = []
    for path in sorted(paths):
        place = ROOT / path if path.startswith(roots) else ROOT / "include" / "counters" / path
        if not place.exists():
            missing.append(path)
    assert len(rows) >= 7 and paths, "the table has a row per change"
    assert not missing, f"CONTRIBUTING.md's Where to start names what is not there: {missing}"


def task_returns(tree: ast.AST) -> Iterator[tuple[str, int, str]]:
    """Every TaskFlow function (``@task`` or ``@task(...)``): ``(name, line, its return
    annotation as written)``."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if isinstance(target, ast.Name) and target.id == "task":
                returns = ast.unparse(node.returns) if node.returns is not None else "(none)"
                yield node.name, node.lineno, returns


def test_every_task_names_the_type_its_xcom_holds() -> None:
    """A task's return value crosses XCom through the one codec (``Encoded[T]``) or as a
    plain value; ``dict[str, Any]`` says nothing of what it holds (and Airflow would push
    each of its keys as an XCom too)."""
    files = [*(ROOT / "include" / "counters").rglob("*.py"), *(ROOT / "dags").glob("*.py")]
    found = [
        (f"{path.relative_to(ROOT)}:{line}", name, returns)
        for path in files
        for name, line, returns in task_returns(ast.parse(path.read_text()))
    ]
    assert len(found) >= 7, found  # the run's steps, the freshness and maintenance tasks
    untyped = [f for f in found if "Any" in f[2] or f[2].startswith("dict") or f[2] == "(none)"]
    assert not untyped, untyped
