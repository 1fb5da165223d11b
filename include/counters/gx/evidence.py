"""Check results that outlive the worker: each run's GX validation result and its Data Docs
page, kept at a configurable location through Airflow's ``ObjectStoragePath`` (or the ``UPath`` it
wraps, where Airflow is not imported and no connection is named), pruned by age.

GX validates in memory (``checks.validate_evidence``), on whichever worker ran the task. After
each validation the ``verify`` step stores the result (``result.json``) at

    $COUNTERS_GX_RESULTS/<family>/<YYYY-MM-DD>/<run time>__<run name>/

(a local folder by default: ``var/gx-results`` of the checkout in the local dev setup,
``$AIRFLOW_HOME/gx-results`` elsewhere; ``file:///shared/...`` on a shared volume,
``s3://bucket/prefix`` or ``gs://...`` in a deployment, with the Airflow connection
``$COUNTERS_GX_RESULTS_CONN_ID`` for credentials), records that folder in the run's audit row
(``gx_result``), and deletes the day folders older than ``$COUNTERS_GX_KEEP_DAYS`` (90). The UI
reads results from there, and renders a run's page (``page.html``) from its result the first
time someone opens it, stored beside it (``page``): rendering costs more than validating, and
few of a minute family's pages are ever read. Folders kept before this have their page already.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import LOCAL_DEV_ENV, ConfigError, local_folder
from ..core import day_text, from_text, stamp, utc_naive
from . import checks

if TYPE_CHECKING:
    from airflow.sdk import ObjectStoragePath

log = logging.getLogger(__name__)

RESULTS_ENV = "COUNTERS_GX_RESULTS"
RESULTS_CONN_ENV = "COUNTERS_GX_RESULTS_CONN_ID"
KEEP_DAYS_ENV = "COUNTERS_GX_KEEP_DAYS"
DEFAULT_KEEP_DAYS = 90
DEV_RESULTS = "var/gx-results"
"""The default in the local dev setup, a folder of the checkout (``checks.PROJECT_ROOT``)."""
HOME_RESULTS = "gx-results"
"""The default elsewhere, a folder of ``$AIRFLOW_HOME`` (not of the installed package)."""
RESULT_FILE = "result.json"
PAGE_FILE = "page.html"
DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
FOLDER = re.compile(r"^\d{8}T\d{6}\.\d{6}Z__[A-Za-z0-9_.-]+$")
FILES = (RESULT_FILE, PAGE_FILE)


class EvidenceConfigError(ValueError):
    """A setting of the results store that cannot be used (names the variable and value)."""


def keep_days(env: dict[str, str] | None = None) -> int:
    raw = (env if env is not None else os.environ).get(KEEP_DAYS_ENV)
    if not raw:
        return DEFAULT_KEEP_DAYS
    try:
        days = int(raw)
    except ValueError:
        days = 0
    if days < 1:
        raise EvidenceConfigError(
            f"{KEEP_DAYS_ENV} must be a whole number of days >= 1, got {raw!r}"
        )
    return days


def results_location(
    location: str | os.PathLike[str] | None, env: Mapping[str, str], checkout: Path
) -> str:
    """The store's root as a URL: ``location``, else ``$COUNTERS_GX_RESULTS``, else the default
    (``var/gx-results`` of the checkout in the local dev setup, ``$AIRFLOW_HOME/gx-results``
    elsewhere). A plain path is a local folder; a relative one is refused outside the local dev
    setup, naming the variable (``config.local_folder``). Pure but for ``~``."""
    raw = str(location or env.get(RESULTS_ENV) or "")
    if not raw:
        if env.get(LOCAL_DEV_ENV) == "1":
            return (checkout / DEV_RESULTS).as_uri()
        home = Path(env.get("AIRFLOW_HOME") or "~/airflow").expanduser()
        return (home / HOME_RESULTS).as_uri()
    if "://" in raw:
        return raw
    try:
        return local_folder(raw, env, checkout, RESULTS_ENV).as_uri()
    except ConfigError as exc:
        raise EvidenceConfigError(str(exc)) from exc


def results_root(location: str | os.PathLike[str] | None = None) -> ObjectStoragePath:
    """The store's root in this process's environment (``results_location``), with
    ``$COUNTERS_GX_RESULTS_CONN_ID``'s credentials. Opened as the archive opens its folder
    (``archive.storage.open_path``): Airflow's ``ObjectStoragePath`` in a task or with a
    connection, else the ``UPath`` it wraps, so ``counterctl compact`` does not import Airflow
    in the middle of its run only to write one file."""
    from ..archive.storage import open_path

    raw = results_location(location, os.environ, checks.PROJECT_ROOT)
    return open_path(raw, os.environ.get(RESULTS_CONN_ENV) or None)


def family_root(family: str, location: str | os.PathLike[str] | None = None) -> ObjectStoragePath:
    return results_root(location) / family


def folder_name(run_time: datetime, run_id: str) -> str:
    """``<run time>__<run name>``: sorts by time; names the run (``checks.run_name``)."""
    return f"{stamp(run_time, micros=True)}__{checks.run_name(run_id)}"


@dataclass(frozen=True)
class Stored:
    """One run's stored evidence: ``<day>/<folder>`` under the family's root."""

    day: str
    folder: str

    @property
    def relative(self) -> str:
        return f"{self.day}/{self.folder}"

    @property
    def run_name(self) -> str:
        return self.folder.split("__", 1)[1]

    @property
    def run_time(self) -> datetime:
        return from_text(self.folder.split("__", 1)[0])


def keep(
    family: str,
    run_id: str,
    report: checks.SuiteReport,
    *,
    now: datetime | None = None,
    location: str | os.PathLike[str] | None = None,
) -> str:
    """Store a validation's result; returns the folder's URL (the audit row's ``gx_result``).
    Then prunes the family's days older than the kept age. The page is rendered on demand."""
    now = now or datetime.now(UTC)
    root = family_root(family, location)
    target = root / day_text(now) / folder_name(now, run_id)
    target.mkdir(parents=True, exist_ok=True)
    (target / RESULT_FILE).write_text(json.dumps(report.result, default=str, sort_keys=True))
    removed = prune(family, now=now, location=location)
    if removed:
        log.info("GX results of family %s: %d day(s) older than kept removed", family, removed)
    return str(target)


def days(family: str, location: str | os.PathLike[str] | None = None) -> list[str]:
    """The family's day folders, newest first."""
    root = family_root(family, location)
    if not root.exists():
        return []
    return sorted((p.name for p in root.iterdir() if DAY.match(p.name)), reverse=True)


def prune(
    family: str,
    *,
    now: datetime | None = None,
    days_kept: int | None = None,
    location: str | os.PathLike[str] | None = None,
) -> int:
    """Delete the family's day folders older than ``days_kept`` (``$COUNTERS_GX_KEEP_DAYS``,
    90) before ``now``; returns how many. One listing of the family's folder. A naive ``now``
    is UTC, as ``keep`` names its day folder and the archive's ``prune`` reads one (never this
    host's local time: a day's folders kept or deleted a day early)."""
    days_kept = days_kept if days_kept is not None else keep_days()
    cutoff = (utc_naive(now or datetime.now(UTC)) - timedelta(days=days_kept)).date()
    root = family_root(family, location)
    removed = 0
    for day in days(family, location):
        if date.fromisoformat(day) < cutoff:
            (root / day).rmdir(recursive=True)
            removed += 1
    return removed


def runs(
    family: str, limit: int = 200, location: str | os.PathLike[str] | None = None
) -> list[Stored]:
    """The newest ``limit`` stored runs, newest first (lists day folders until it has them)."""
    root = family_root(family, location)
    found: list[Stored] = []
    for day in days(family, location):
        folders = sorted(
            (p.name for p in (root / day).iterdir() if FOLDER.match(p.name)), reverse=True
        )
        found += [Stored(day, folder) for folder in folders[: limit - len(found)]]
        if len(found) >= limit:
            break
    return found


def latest(family: str, location: str | os.PathLike[str] | None = None) -> Stored | None:
    newest = runs(family, 1, location)
    return newest[0] if newest else None


def stored_of(
    family: str, url: str | None, location: str | os.PathLike[str] | None = None
) -> Stored | None:
    """The stored run an audit row's ``gx_result`` names, if it lies in this store."""
    if not url:
        return None
    root = str(family_root(family, location)).rstrip("/") + "/"
    if not url.startswith(root):
        return None
    parts = url[len(root) :].strip("/").split("/")
    if len(parts) != 2 or not DAY.match(parts[0]) or not FOLDER.match(parts[1]):
        return None
    return Stored(*parts)


def open_file(
    family: str, day: str, folder: str, name: str, location: str | os.PathLike[str] | None = None
) -> ObjectStoragePath | None:
    """A stored file, or None when a part is not a name the store writes (no ``..``, no other
    file) or the file does not exist."""
    if not (DAY.match(day) and FOLDER.match(folder) and name in FILES):
        return None
    target = family_root(family, location) / day / folder / name
    return target if target.exists() else None


def read_json(path: ObjectStoragePath) -> dict[str, Any]:
    return json.loads(path.read_text())


def page(
    family: str,
    day: str,
    folder: str,
    render: Callable[[dict[str, Any]], str],
    location: str | os.PathLike[str] | None = None,
) -> str | None:
    """A stored run's Data Docs page (HTML): the stored one, else rendered from its result by
    ``render`` and stored beside it, written once (under a temporary name, then renamed, so no
    reader sees half a page; a store the caller may not write to is logged, and the page is
    still returned). None when the run has no stored result."""
    stored = open_file(family, day, folder, PAGE_FILE, location)
    if stored is not None:
        return stored.read_text(encoding="utf-8")
    result = open_file(family, day, folder, RESULT_FILE, location)
    if result is None:
        return None
    html = render(read_json(result))
    partial = result.parent / f".{PAGE_FILE}.{uuid.uuid4().hex}.tmp"
    try:
        partial.write_text(html, encoding="utf-8")
        partial.rename(result.parent / PAGE_FILE)
    except OSError:
        log.warning(
            "GX results: cannot store the page of %s/%s/%s", family, day, folder, exc_info=True
        )
    return html
