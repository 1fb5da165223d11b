"""Test the validity of all DAGs. **USED BY DEV PARSE COMMAND DO NOT EDIT**

The astro CLI runs this file for `astro dev parse` and for the parse step of `astro deploy`.
This is its default DAG integrity test adapted to Airflow 3.3: DAGs are parsed with the
``DagBag`` of ``airflow.dag_processing.dagbag`` (no ``include_examples`` there any more),
connections and Variables are the Task SDK's (``airflow.sdk``), and no metadata DB is
initialised (parsing needs none). A DAG file that
reads a connection or a Variable while it is parsed gets a placeholder here instead of an error
(this project's DAG files read neither). The project's tests run it too
(``tests/dags/test_astro_integrity.py``, part of ``make test``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import BaseHook, Connection, Variable

EXCEPTIONS_FILE = Path(".astro/dag_integrity_exceptions.txt")
"""Files whose import errors are accepted, one path (relative to AIRFLOW_HOME) a line."""

_NO_DEFAULT = object()


def _placeholder_connection(conn_id: str, *args: Any, **kwargs: Any) -> Connection:
    print(f"connection {conn_id!r} read while parsing: an empty placeholder is returned")
    return Connection(conn_id=conn_id, conn_type="generic")


def _placeholder_variable(
    key: str, default: Any = _NO_DEFAULT, deserialize_json: bool = False
) -> Any:
    print(f"Variable {key!r} read while parsing: a placeholder value is returned")
    if default is not _NO_DEFAULT:
        return default
    return {} if deserialize_json else f"PLACEHOLDER_{key}"


BaseHook.get_connection = _placeholder_connection  # type: ignore[method-assign]
Variable.get = _placeholder_variable  # type: ignore[method-assign]
# The families' asset URIs name their cluster, which a deployment sets (COUNTERS_ASSET_CLUSTER)
# and the parse step's container does not: a placeholder, as for connections; parsing checks
# the DAGs, not which cluster they name.
os.environ.setdefault("COUNTERS_ASSET_CLUSTER", "dag-integrity-check:9042")


@contextmanager
def _quiet(namespace: str) -> Iterator[None]:
    logger = logging.getLogger(namespace)
    before = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = before


def _relative(path: str) -> str:
    return os.path.relpath(path, os.environ.get("AIRFLOW_HOME") or os.getcwd())


def _bag() -> DagBag:
    with _quiet("airflow"):
        return DagBag()  # the dags_folder; Airflow 3's DagBag has no example DAGs to leave out


BAG = _bag()
IMPORT_ERRORS = [(None, None)] + [
    (_relative(path), message.strip()) for path, message in sorted(BAG.import_errors.items())
]
"""One case per file that failed to import, plus a no-op so the test always exists."""


@pytest.mark.parametrize("rel_path,message", IMPORT_ERRORS, ids=[p for p, _ in IMPORT_ERRORS])
def test_file_imports(rel_path: str | None, message: str | None) -> None:
    """A DAG file that fails to import fails the parse (unless listed in the exceptions)."""
    accepted = EXCEPTIONS_FILE.read_text().split() if EXCEPTIONS_FILE.exists() else []
    if rel_path and message and rel_path not in accepted:
        raise AssertionError(f"{rel_path} failed to import with message\n{message}")


def test_the_dags_folder_has_dags() -> None:
    """A folder that parses to nothing (a missing families file, a wrong dags_folder) fails."""
    assert BAG.dags, f"no DAGs parsed from {BAG.dag_folder}"
