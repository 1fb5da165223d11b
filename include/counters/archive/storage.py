"""The archive's files, through Airflow's ``ObjectStoragePath`` (as the GX results are kept):
where a family's archive lives, a file written whole or not at all and read back, the day
folders pruned by age. The only file I/O of the archive; what goes into a file is
``archive.table``'s.

``ObjectStoragePath`` is fsspec's ``UPath`` with Airflow's connections (credentials) and lineage
on top. It is used where Airflow is imported anyway (a task) or where the family names an
``archive_conn_id``; elsewhere (``counterctl``'s shard processes) the same URL is opened as the
``UPath`` it wraps: importing Airflow costs each such process ~2 CPU-s, 5-10 % of a 1M-row run.

Layout: ``<archive>/<family>/<YYYY-MM-DD>/<run id>-<shard>.parquet``, the day being the day the
run started (its audit row's), so every attempt of a run's cleanup names the same file. A
second part of the same run and shard (a run cleaned up again with other commits) is
``<run id>-<shard>.<n>.parquet``; nothing is ever overwritten.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sys
from datetime import date, datetime
from typing import TYPE_CHECKING

from ..config import CHECKOUT, ConfigError, Family, local_folder
from ..core import day_text, utc_naive
from ..errors import ArchiveError

if TYPE_CHECKING:
    from airflow.sdk import ObjectStoragePath

PROJECT_ROOT = CHECKOUT
"""The checkout, in the local dev setup (the package installed editable from ``include/``): a
relative ``archive`` is a folder of it there, and refused elsewhere (``config.local_folder``)."""
DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
MAX_PARTS = 100
"""Parts of one run and shard: past it, a cleanup refuses (and deletes nothing)."""


def _where(family: Family) -> str:
    return f"family {family.name!r}: archive {family.archive!r}"


def open_path(url: str, conn_id: str | None = None) -> ObjectStoragePath:
    """A URL as a path: Airflow's ``ObjectStoragePath`` (with the connection's credentials) when
    a connection is named or Airflow is imported already, else the ``UPath`` it wraps."""
    if conn_id or "airflow.sdk" in sys.modules:
        from airflow.sdk import ObjectStoragePath

        return ObjectStoragePath(url, conn_id=conn_id) if conn_id else ObjectStoragePath(url)
    from upath import UPath

    return UPath(url)  # type: ignore[return-value]


def archive_root(family: Family) -> ObjectStoragePath:
    """The family's ``archive`` as a path (a plain path is a local folder: a relative one is the
    checkout's, in the local dev setup only), with its ``archive_conn_id`` for credentials."""
    if family.archive is None:
        raise ArchiveError(f"family {family.name!r} has no archive (field 'archive')")
    raw = family.archive
    if "://" not in raw:
        try:
            path = local_folder(
                raw, os.environ, PROJECT_ROOT, f"family {family.name!r}: field 'archive'"
            )
        except ConfigError as exc:
            raise ArchiveError(str(exc)) from exc
        raw = path.resolve().as_uri()
    try:
        return open_path(raw, family.archive_conn_id)
    except (ValueError, ImportError) as exc:
        raise ArchiveError(f"{_where(family)} cannot be opened: {exc}") from exc


def family_root(family: Family) -> ObjectStoragePath:
    return archive_root(family) / family.name


def day_of(moment: datetime) -> str:
    """The day folder of a run started at ``moment`` (UTC)."""
    return day_text(moment)


def part_name(run_id: str, shard: int, part: int = 0) -> str:
    """``<run id>-<shard>.parquet`` (a run id's characters other than letters, digits, ``_``,
    ``.`` and ``-`` as ``_``), ``.<part>`` before the suffix from the second part on."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)
    return f"{safe}-{shard}.parquet" if part == 0 else f"{safe}-{shard}.{part}.parquet"


def write_part(family: Family, day: str, run_id: str, shard: int, data: bytes) -> str:
    """Write an archive file whole (a temporary file, then renamed: a crash leaves the file
    whole or absent) and read it back; returns its URL. The name is the run's and shard's
    first part that is free, or that holds these very bytes already (the file of an attempt
    that crashed before its manifest was recorded: taken as it is)."""
    digest = hashlib.sha256(data).hexdigest()
    try:
        folder = family_root(family) / day
        folder.mkdir(parents=True, exist_ok=True)
        for part in range(MAX_PARTS):
            target = folder / part_name(run_id, shard, part)
            if target.exists():
                if hashlib.sha256(target.read_bytes()).hexdigest() == digest:
                    return str(target)
                continue
            temporary = folder / f".{target.name}.{secrets.token_hex(4)}.tmp"
            temporary.write_bytes(data)
            temporary.rename(target)
            written = target.read_bytes()
            if hashlib.sha256(written).hexdigest() != digest:
                raise ArchiveError(
                    f"{_where(family)}: {target} read back {len(written)} bytes that differ "
                    f"from the {len(data)} written"
                )
            return str(target)
    except ArchiveError:
        raise
    except Exception as exc:  # any store's error: the cleanup deletes nothing
        raise ArchiveError(
            f"{_where(family)}: cannot write the archive of run {run_id!r} shard {shard}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    raise ArchiveError(
        f"{_where(family)}: run {run_id!r} shard {shard} has {MAX_PARTS} archive parts in {day}"
    )


def read_file(family: Family, url: str) -> bytes | None:
    """A file's bytes, None when it does not exist."""
    try:
        path = open_path(url, family.archive_conn_id)
        if not path.exists():
            return None
        return path.read_bytes()
    except Exception as exc:
        raise ArchiveError(
            f"{_where(family)}: cannot read {url}: {type(exc).__name__}: {exc}"
        ) from exc


def days(family: Family) -> list[str]:
    """The family's day folders, oldest first."""
    root = family_root(family)
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if DAY.match(p.name))


def day_files(family: Family, day: str) -> list[ObjectStoragePath]:
    """The archive files of one day folder (not the temporary files of writes under way)."""
    folder = family_root(family) / day
    return sorted(
        (p for p in folder.iterdir() if p.name.endswith(".parquet") and not p.name.startswith(".")),
        key=lambda p: p.name,
    )


def pruned_before(family: Family, now: datetime) -> date | None:
    """The first day the archive keeps (``archive_retention`` before ``now``), None when it
    keeps every day."""
    if family.archive_retention is None:
        return None
    return (utc_naive(now) - family.archive_retention).date()


def prune(family: Family, now: datetime) -> int:
    """Delete the family's day folders older than ``archive_retention``; how many. One listing
    of the family's folder."""
    cutoff = pruned_before(family, now)
    if cutoff is None or family.archive is None:
        return 0
    try:
        root = family_root(family)
        removed = 0
        for day in days(family):
            if date.fromisoformat(day) < cutoff:
                (root / day).rmdir(recursive=True)
                removed += 1
        return removed
    except ArchiveError:
        raise
    except Exception as exc:
        raise ArchiveError(
            f"{_where(family)}: cannot prune the days before {cutoff}: {type(exc).__name__}: {exc}"
        ) from exc


def day_in_url(url: str) -> date | None:
    """The day folder an archive file's URL names."""
    parts = url.rstrip("/").split("/")
    if len(parts) >= 2 and DAY.match(parts[-2]):
        return date.fromisoformat(parts[-2])
    return None
