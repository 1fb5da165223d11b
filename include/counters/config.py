"""Counter families, declared in YAML and validated once, at load, into frozen typed objects.

Every error names the file, the family and the field, so a bad entry is fixed where it was written.
"""

from __future__ import annotations

import logging
import os
import re
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from counters.kinds import RULES, Kind, KindRules

KIND_NAMES = frozenset(k.value for k in Kind)

CONFIG_ENV = "COUNTERS_CONFIG"
CONFIG_FILE_NAME = "counter_families.yaml"
"""The families file's name in the DAG folder: the default when ``$COUNTERS_CONFIG`` is unset,
so the families ship with the DAG files (adding a family is a DAG-only deploy)."""
LOCAL_DEV_ENV = "COUNTERS_LOCAL_DEV"
"""Set to 1 by scripts/env.sh (``make run``, ``make test``, ``make bench``): the local dev
setup, where a local-folder archive is expected and not warned about."""
CHECKOUT = Path(__file__).resolve().parents[2]
"""The project's checkout when the package runs from it (``include/counters`` below it): the
base of the local dev setup's relative folders and of ``git describe``. Installed, it is
site-packages' parent, which is why those folders are refused outside the local dev setup."""

log = logging.getLogger(__name__)

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,47}$")
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


class ConfigError(ValueError):
    """The families file cannot be used; the message says where and why."""


def parse_duration(text: str | int | float) -> timedelta:
    """Parse ``90s``, ``1m``, ``2h``, ``1d``, ``500ms`` (or a bare number of seconds)."""
    if isinstance(text, bool):
        raise ValueError(f"expected a duration like '1m' or '90s', got {text!r}")
    if isinstance(text, int | float):
        return timedelta(seconds=text)
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"expected a duration like '1m', '90s' or '2h', got {text!r}")
    amount, unit = int(match.group(1)), match.group(2)
    return timedelta(seconds=amount * _UNIT_SECONDS[unit])


def _identifier(value: str, what: str) -> str:
    if not isinstance(value, str) or not IDENTIFIER.match(value):
        raise ValueError(
            f"{what} must be a CQL identifier (letters, digits, underscore; "
            f"not starting with a digit; at most 48 chars), got {value!r}"
        )
    return value


class Retention(StrEnum):
    DELETE = "delete"
    KEEP = "keep"


class Discovery(StrEnum):
    """How a run finds the counters that have rows to fold.

    ``index`` (default): a small table of touched counters kept by the write API (cost
    follows activity), plus a sweep, a token-range scan of the whole raw table, every
    ``sweep_interval``: rows written by any other writer are folded within that bound.
    ``scan``: every run scans the raw table's token ranges (cost follows table size).
    """

    INDEX = "index"
    SCAN = "scan"


class Consistency(StrEnum):
    ONE = "ONE"
    LOCAL_ONE = "LOCAL_ONE"
    QUORUM = "QUORUM"
    LOCAL_QUORUM = "LOCAL_QUORUM"
    EACH_QUORUM = "EACH_QUORUM"
    ALL = "ALL"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Columns(_Strict):
    """Column names in the raw table; defaults are the seed's."""

    key: tuple[str, ...] = ("type",)
    time: str = "modify_time"
    increment: str = "increment"
    member: str | None = None

    @field_validator("key", mode="before")
    @classmethod
    def _key_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return (value,)
        return value

    @field_validator("key")
    @classmethod
    def _key_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("key needs at least one column")
        for name in value:
            _identifier(name, "key column")
        if len(set(value)) != len(value):
            raise ValueError(f"key columns repeat: {list(value)}")
        return value

    @field_validator("time", "increment", "member")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return None if value is None else _identifier(value, "column")


class CompactColumns(_Strict):
    """Names in the compact table (a rows family defaults to ``count``/``counted_until``)."""

    value: str = "value"
    epoch: str = "epoch"

    @field_validator("value", "epoch")
    @classmethod
    def _names(cls, value: str) -> str:
        return _identifier(value, "compact column")


class Alerts(_Strict):
    """Where a family's alerts go. Empty lists mean: no channel of that type."""

    email: tuple[str, ...] = ()
    slack_webhook_conn_id: str | None = None
    webhook_url: str | None = None
    smtp_conn_id: str = "counters_smtp"
    remind_every: timedelta | None = None
    """While the family keeps failing (or stays stale), remind this often; 0: never. Unset:
    ``$COUNTERS_ALERT_REMIND_EVERY``, else 1h (``counters.airflow.alerting``)."""

    @field_validator("remind_every", mode="before")
    @classmethod
    def _remind_every(cls, value: Any) -> timedelta | None:
        return value if value is None or isinstance(value, timedelta) else parse_duration(value)


class Family(_Strict):
    name: str
    keyspace: str
    raw_table: str
    compact_table: str
    lag: timedelta
    schedule: str = "* * * * *"
    description: str = ""
    kind: Kind = Kind.INCREMENTS
    columns: Columns = Field(default_factory=Columns)
    compact_columns: CompactColumns = Field(default_factory=CompactColumns)
    retention: Retention | None = None
    shards: int = Field(default=4, ge=1, le=256)
    consistency: Consistency = Consistency.LOCAL_QUORUM
    compaction_dc: str | None = None
    """The one data center whose workers compact this family, required when its consistency
    is ``LOCAL_*`` and its keyspace is replicated to several: ``LOCAL_SERIAL`` serialises the
    commits of one data center only."""
    discovery: Discovery = Discovery.INDEX
    sweep_interval: timedelta = timedelta(minutes=15)
    """With ``discovery: index``: how often a run also scans the whole raw table, so rows
    written without the write API (plain CQL ``INSERT``) are folded within this bound."""
    sweep_every_run_below: int = Field(default=10_000, ge=0)
    """With ``discovery: index``: a family whose last sweep read fewer raw rows and counters
    than this sweeps every run, so rows of any writer are folded within a run, not within
    ``sweep_interval``; a larger one sweeps every ``sweep_interval``. 0: always by interval."""
    sweep_offset: timedelta | None = None
    """Where in each ``sweep_interval`` (counted from 1970-01-01 UTC) the sweep falls, e.g.
    ``3h`` with a ``1d`` interval: the first run after 03:00 UTC. Default: a stable offset
    from the family's name, so families deployed together do not all sweep at once."""
    shard_tasks: bool = False
    """``false`` (the default): every run whole in the DAG's one ``run`` task, one task instance
    per run, what a minute family costs Airflow least with (a small run starts from the
    trigger, in the warm pool; docs/airflow.md, "The DAG's shape"); a large run's shards run
    one after another. ``true``: a large run's steps as their own tasks, mapped over shard
    groups (per-shard tasks, retries and workers), five task instances per run. Changed with
    the DAG paused and no run in flight (a running run would lose its tasks)."""
    catchup: bool = False
    start_date: datetime | None = None
    """Where the DAG's schedule starts (catchup creates the runs from here); UTC if naive."""
    freshness: timedelta = timedelta(minutes=10)
    owner: str = "counters"
    tags: tuple[str, ...] = ()
    alerts: Alerts = Field(default_factory=Alerts)
    archive: str | None = None
    """Where the rows cleanup deletes are archived first, as Parquet (an ``ObjectStoragePath``
    URL: ``file:///...``, ``s3://bucket/prefix``, ...; a plain path is a local folder, relative
    to the project root). None: no archive."""
    archive_conn_id: str | None = None
    """The Airflow connection with the archive store's credentials (None: the store's default)."""
    archive_retention: timedelta | None = None
    """How long archived day folders are kept (whole days): each run deletes the older ones.
    None: kept for good."""

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data: Any) -> Any:
        """Defaults that depend on the kind (its rules' ``yaml_defaults``): a rows family counts
        ``count``/``counted_until`` and is found by scanning (its writers are the business
        application, not our API)."""
        kind = data.get("kind") if isinstance(data, Mapping) else None
        if isinstance(kind, str) and kind in KIND_NAMES:  # else the field's own error names it
            return {**RULES[Kind(kind)].yaml_defaults, **data}
        return data

    @field_validator("start_date")
    @classmethod
    def _start_date_utc(cls, value: datetime | None) -> datetime | None:
        return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _identifier(value, "name")

    @field_validator("keyspace", "raw_table", "compact_table")
    @classmethod
    def _tables(cls, value: str) -> str:
        return _identifier(value, "table/keyspace name")

    @field_validator("archive")
    @classmethod
    def _archive_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return archive_url_problem(value)

    @field_validator(
        "lag", "freshness", "sweep_interval", "sweep_offset", "archive_retention", mode="before"
    )
    @classmethod
    def _duration(cls, value: Any) -> timedelta | None:
        if value is None or isinstance(value, timedelta):
            return value
        return parse_duration(value)

    @field_validator("lag")
    @classmethod
    def _lag_positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError(f"lag must be > 0 (it absorbs writers' clock skew), got {value}")
        if value.total_seconds() % 1:
            raise ValueError(f"lag must be a whole number of seconds, got {value}")
        return value

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        from croniter import croniter

        if not croniter.is_valid(value):
            raise ValueError(f"schedule must be a cron expression like '* * * * *', got {value!r}")
        return value

    @model_validator(mode="after")
    def _kind_rules(self) -> Family:
        if self.raw_table == self.compact_table:
            raise ValueError("raw_table and compact_table must differ")
        rules = self.rules
        if rules.keeps_rows and self.retention is Retention.DELETE:
            raise ValueError(
                f"retention: a '{self.kind.value}' family keeps its rows (business data); use "
                "'keep'"
            )
        if rules.value_column is not None and not getattr(self.columns, rules.value_column):
            raise ValueError(
                f"columns.{rules.value_column} is required for a '{self.kind.value}' family"
            )
        if not rules.keeps_rows and self.retention is Retention.KEEP:
            keeping = ", ".join(f"'{k.value}'" for k, r in RULES.items() if r.keeps_rows)
            raise ValueError(
                f"retention: 'keep' is only for {keeping} families (their rows are business data); "
                f"a '{self.kind.value}' family folds its rows one by one and must delete them "
                "(a kept row below the checkpoint could never be told from a late one)"
            )
        if self.consistency in (Consistency.ONE, Consistency.LOCAL_ONE):
            raise ValueError(
                f"consistency: {self.consistency.value} is refused (every kind): a fold that "
                "reads one replica can miss rows another holds and move its epoch past them, "
                "and a delete seen by one replica lets a later run fold the row again; use "
                "LOCAL_QUORUM (default), QUORUM, EACH_QUORUM or ALL"
            )
        self._archive_rules()
        if self.sweep_interval <= timedelta(0):
            raise ValueError(f"sweep_interval must be > 0, got {self.sweep_interval}")
        if self.sweep_offset is not None and not (
            timedelta(0) <= self.sweep_offset < self.sweep_interval
        ):
            raise ValueError(
                f"sweep_offset must be >= 0 and shorter than sweep_interval "
                f"({self.sweep_interval}), got {self.sweep_offset}"
            )
        return self

    def _archive_rules(self) -> None:
        if self.archive is None:
            if self.archive_retention is not None or self.archive_conn_id is not None:
                raise ValueError(
                    "archive_retention and archive_conn_id need an archive (the archive's URL)"
                )
            return
        if self.folds_by_slice:
            raise ValueError(
                f"archive: a '{self.kind.value}' family keeps its rows (business data): nothing is "
                "deleted, so there is nothing to archive; remove 'archive'"
            )
        retention = self.archive_retention
        if retention is not None and (
            retention < timedelta(days=1) or retention % timedelta(days=1)
        ):
            raise ValueError(
                f"archive_retention must be a whole number of days, at least 1d (the archive "
                f"is kept in day folders), got {retention}"
            )

    @property
    def sweep_phase(self) -> timedelta:
        """Where in each ``sweep_interval`` the family sweeps: its ``sweep_offset``, else a
        stable offset from its name."""
        if self.sweep_offset is not None:
            return self.sweep_offset
        seconds = max(int(self.sweep_interval.total_seconds()), 1)
        return timedelta(seconds=zlib.crc32(self.name.encode()) % seconds)

    @property
    def rules(self) -> KindRules:
        """What the family's kind decides (``counters.kinds``): asked everywhere outside this
        module instead of the kind."""
        return RULES[self.kind]

    @property
    def effective_retention(self) -> Retention:
        if self.retention is not None:
            return self.retention
        return Retention.KEEP if self.rules.keeps_rows else Retention.DELETE

    @property
    def fold_table(self) -> str:
        """The table the engine folds: the raw table, or for a unique family the derived
        table of first writes (one +1 row per member, keyed by its first-write time)."""
        derived = self.rules.derived_table
        return self.raw_table if derived is None else f"{self.raw_table}{derived.suffix}"

    @property
    def fold_columns(self) -> Columns:
        derived = self.rules.derived_table
        if derived is None:
            return self.columns
        return Columns(key=self.columns.key, time=derived.time, increment=derived.increment)

    @property
    def folds_by_slice(self) -> bool:
        """Kept rows are folded by slice (checkpoint, epoch] with a server-side aggregate;
        deleted rows are folded one by one, tracking the counted-but-not-deleted ones."""
        return self.effective_retention is Retention.KEEP

    @property
    def dag_id(self) -> str:
        return f"compact_{self.name}"

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables this family reads rows from or writes totals to (the engine's own tables
        are named after them): no other family may use one of them."""
        return tuple(dict.fromkeys((self.raw_table, self.fold_table, self.compact_table)))


ARCHIVE_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
ARCHIVE_SCHEMES = frozenset(
    {
        "file", "local", "s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "hdfs",
        "webhdfs", "sftp", "ssh", "smb", "ftp", "oss", "oci", "dbfs", "lakefs", "webdav",
    }
)  # fmt: skip
"""Schemes of stores an archive can be kept in (durable and writable, as fsspec names them;
the store's fsspec package must be installed where the runs run, e.g. s3fs for ``s3``)."""


def archive_url_problem(value: str) -> str:
    """``value`` if it can name an archive's location, else ``ValueError`` naming it: a URL of
    a durable, writable store (``ARCHIVE_SCHEMES``) with a path, or a plain path (a local
    folder, relative to the project root: for the local dev setup only,
    ``local_archive_warnings``). Whether the store answers is found out by a run,
    which then deletes nothing."""
    text = value.strip() if isinstance(value, str) else ""
    example = "e.g. 'file:///data/archive', 's3://bucket/prefix' or 'var/archive'"
    if not text:
        raise ValueError(f"archive must be a URL or a path ({example}), got {value!r}")
    match = ARCHIVE_SCHEME.match(text)
    if match is None:
        if "://" in text or ":" in text.split("/")[0]:
            raise ValueError(
                f"archive {value!r} is neither a URL (scheme://path) nor a path ({example})"
            )
        return text
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme not in ARCHIVE_SCHEMES:
        raise ValueError(
            f"archive {value!r}: {scheme!r} is not a store an archive can be kept in (not durable, "
            f"not writable, or unknown); use one of {', '.join(sorted(ARCHIVE_SCHEMES))}"
        )
    if not rest.strip("/"):
        raise ValueError(f"archive {value!r} names no folder or bucket")
    return text


def shared_table(families: Sequence[Family], family: Family) -> str | None:
    """A message naming the table ``family`` shares with one of ``families``, else None: two
    families on one table would each count its rows (and delete what the other counts)."""
    for other in families:
        if other.name == family.name or other.keyspace != family.keyspace:
            continue
        for table in family.tables:
            if table in other.tables:
                return (
                    f"family {family.name!r} uses table {family.keyspace}.{table}, which family "
                    f"{other.name!r} uses too: each would count its rows (and delete the rows "
                    "the other counts); give each family its own raw and compact tables"
                )
    return None


class _File(_Strict):
    families: tuple[Family, ...]

    @model_validator(mode="after")
    def _unique_names(self) -> _File:
        seen: set[str] = set()
        for index, family in enumerate(self.families):
            if family.name in seen:
                raise ValueError(f"family name {family.name!r} is declared twice")
            seen.add(family.name)
            shared = shared_table(self.families[:index], family)
            if shared:
                raise ValueError(shared)
        return self


@dataclass(frozen=True)
class Catalog:
    """The families of one file, by name."""

    path: Path
    families: tuple[Family, ...]

    def get(self, name: str) -> Family:
        for family in self.families:
            if family.name == name:
                return family
        known = ", ".join(f.name for f in self.families) or "(none)"
        raise ConfigError(f"unknown family {name!r} in {self.path}; known families: {known}")

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.families]


def dag_folder(env: Mapping[str, str]) -> Path:
    """Airflow's DAG folder as the environment names it (``AIRFLOW__CORE__DAGS_FOLDER``, else
    ``$AIRFLOW_HOME/dags``, else ``~/airflow/dags``): where a DAG-only deploy puts its files. A
    DAG folder set only in airflow.cfg is not seen here: set ``COUNTERS_CONFIG`` then. Pure."""
    folder = env.get("AIRFLOW__CORE__DAGS_FOLDER")
    if folder:
        return Path(folder)
    home = env.get("AIRFLOW_HOME") or str(Path("~/airflow").expanduser())
    return Path(home) / "dags"


def default_config_path(env: Mapping[str, str]) -> Path:
    """``counter_families.yaml`` in Airflow's DAG folder, so the families are deployed with the
    DAG files. Pure."""
    return dag_folder(env) / CONFIG_FILE_NAME


def config_path_in(explicit: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path:
    """The families file: ``explicit`` (``--config``, relative to the current directory as any
    command-line path), else ``$COUNTERS_CONFIG``, else the DAG folder's. A relative
    ``$COUNTERS_CONFIG`` is in the DAG folder: the scheduler, DAG processor and workers each
    start in a directory of their own, and a DAG-only deploy puts the file in the bundle. Pure."""
    if explicit:
        return Path(explicit)
    named = env.get(CONFIG_ENV)
    if not named:
        return default_config_path(env)
    path = Path(named).expanduser()
    return path if path.is_absolute() else dag_folder(env) / path


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The families file in this process's environment (``config_path_in``)."""
    return config_path_in(explicit, os.environ)


def local_folder(raw: str, env: Mapping[str, str], checkout: Path, setting: str) -> Path:
    """A local folder setting (``raw``, no ``scheme://``) as an absolute path. A relative path is
    the checkout's folder (``checkout``) in the local dev setup (``$COUNTERS_LOCAL_DEV``:
    ``make run``, ``make test``); elsewhere it is refused, naming ``setting``: relative to the
    installed package it would land in site-packages, relative to the current directory in
    whichever folder each process started in. Pure but for ``~``."""
    path = Path(raw).expanduser()
    if path.is_absolute():
        return path
    if env.get(LOCAL_DEV_ENV) == "1":
        return checkout / path
    raise ConfigError(
        f"{setting}: {raw!r} is a relative path, used only in the local dev setup "
        f"({LOCAL_DEV_ENV}=1); give an absolute path or a URL (e.g. 's3://bucket/prefix')"
    )


def local_archive_warnings(families: Sequence[Family], env: Mapping[str, str]) -> list[str]:
    """One warning per family whose ``archive`` is a local folder, outside the local dev setup
    (``$COUNTERS_LOCAL_DEV``): a worker's or pod's disk is not an archive (it goes with the pod,
    and each worker would hold a different part of it). Pure."""
    if env.get(LOCAL_DEV_ENV) == "1":
        return []
    warnings = []
    for family in families:
        if family.archive is None:
            continue
        match = ARCHIVE_SCHEME.match(family.archive)
        if match is None and not Path(family.archive).expanduser().is_absolute():
            warnings.append(
                f"family {family.name!r}: field 'archive': {family.archive!r} is a relative path, "
                f"used only in the local dev setup ({LOCAL_DEV_ENV}=1): its cleanups are refused "
                "(and delete nothing); use an object store (e.g. 's3://bucket/prefix')"
            )
        elif match is None or match.group(1).lower() in ("file", "local"):
            warnings.append(
                f"family {family.name!r}: field 'archive': {family.archive!r} is a local folder; "
                "outside the local dev setup use an object store (e.g. 's3://bucket/prefix'): "
                "the rows a cleanup deletes are kept only there"
            )
    return warnings


def _warn_local_archives(families: Sequence[Family], path: Path) -> None:
    for warning in local_archive_warnings(families, os.environ):
        log.warning("counters: %s: %s", path, warning)


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read families file {path}: {exc.strerror}") from exc
    try:  # libyaml's loader when present: the DAG processor parses this file often
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: malformed YAML: {exc}") from exc


def _family_label(raw: Any, index: int) -> str:
    name = raw.get("name") if isinstance(raw, Mapping) else None
    return f"family {name!r} (families[{index}])" if name else f"families[{index}]"


def _format_error(path: Path, raw: Any, exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        loc = list(error["loc"])
        where = ""
        if loc[:1] == ["families"] and len(loc) > 1 and isinstance(loc[1], int):
            families = raw.get("families") if isinstance(raw, Mapping) else None
            entry = families[loc[1]] if isinstance(families, list) else None
            where = _family_label(entry, loc[1])
            loc = loc[2:]
        field = ".".join(str(part) for part in loc) or "(entry)"
        message = error["msg"].removeprefix("Value error, ")
        value = error.get("input")
        shown = f" (got {value!r})" if error["type"] == "extra_forbidden" else ""
        prefix = f"{where}: " if where else ""
        lines.append(f"{prefix}field '{field}': {message}{shown}")
    return f"{path}: " + "; ".join(lines)


def parse_catalog(raw: Any, path: Path) -> Catalog:
    if not isinstance(raw, Mapping) or "families" not in raw:
        raise ConfigError(f"{path}: top level must be a mapping with a 'families:' list")
    if not isinstance(raw["families"], list):
        raise ConfigError(f"{path}: 'families' must be a list of family entries")
    try:
        parsed = _File.model_validate(dict(raw))
    except ValidationError as exc:
        raise ConfigError(_format_error(path, raw, exc)) from None
    return Catalog(path=path, families=parsed.families)


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """Load and validate the whole file; the first bad entry refuses the file."""
    resolved = config_path(path)
    catalog = parse_catalog(_read_yaml(resolved), resolved)
    _warn_local_archives(catalog.families, resolved)
    return catalog


FileStamp = tuple[str, int, int, int, int]
"""A file's (path, mtime_ns, size, inode, ctime_ns): what a memoized parse of it is keyed on.
The inode and ctime catch what mtime and size miss: a file replaced by one that kept the old
mtime (``cp -p``, ``rsync -a``, a git checkout of the same size); no tool sets ctime back."""

RACY_S = 2.0
"""A file changed this recently is not memoized: its mtime comes from a coarse clock (a few
ms), so a rewrite of the same size within that tick would keep the same stamp."""

_lenient_memo: dict[str, tuple[FileStamp, list[Family], dict[str, str]]] = {}


def file_stamp(path: Path) -> FileStamp | None:
    """The file's stamp, or None when it cannot be read (the loader then reports why)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (str(path), stat.st_mtime_ns, stat.st_size, stat.st_ino, stat.st_ctime_ns)


def memo_usable(stamp: FileStamp | None, now_ns: int, racy_s: float = RACY_S) -> bool:
    """Whether a parse of the file with ``stamp`` may be kept and reused: it exists and was
    not changed in the last ``racy_s`` (``RACY_S``). Pure."""
    return stamp is not None and now_ns - stamp[1] >= racy_s * 1e9


def load_families_leniently(
    path: str | os.PathLike[str] | None = None,
) -> tuple[list[Family], dict[str, str]]:
    """Validate entry by entry: good families, and an error per bad entry (keyed by its name).

    The DAG factory uses this so one broken family shows up as one import error and the
    other families still load. Memoized per process on the file's (path, mtime_ns, size):
    every task process parses its DAG file at startup, and the parse of a large YAML is most
    of that (the preload warms the memo, so forked task processes inherit it).
    """
    resolved = config_path(path)
    stamp = file_stamp(resolved)
    kept = _lenient_memo.get(str(resolved))
    if kept is not None and stamp is not None and kept[0] == stamp:
        return list(kept[1]), dict(kept[2])
    good, errors = _parse_leniently(resolved)
    _warn_local_archives(good, resolved)
    if memo_usable(stamp, time.time_ns()) and stamp is not None:
        _lenient_memo[str(resolved)] = (stamp, list(good), dict(errors))
    else:
        _lenient_memo.pop(str(resolved), None)
    return good, errors


def _parse_leniently(resolved: Path) -> tuple[list[Family], dict[str, str]]:
    raw = _read_yaml(resolved)
    if not isinstance(raw, Mapping) or not isinstance(raw.get("families"), list):
        raise ConfigError(f"{resolved}: top level must be a mapping with a 'families:' list")
    good: list[Family] = []
    errors: dict[str, str] = {}
    seen: set[str] = set()
    for index, entry in enumerate(raw["families"]):
        label = _family_label(entry, index)
        key = entry.get("name") if isinstance(entry, Mapping) and entry.get("name") else label
        try:
            family = parse_catalog({"families": [entry]}, resolved).families[0]
        except ConfigError as exc:
            errors[str(key)] = str(exc).replace("families[0]", f"families[{index}]")
            continue
        if family.name in seen:
            errors[f"{family.name}#{index}"] = (
                f"{resolved}: {label}: family name {family.name!r} is declared twice"
            )
            continue
        shared = shared_table(good, family)
        if shared:
            errors[family.name] = f"{resolved}: {label}: {shared}"
            continue
        seen.add(family.name)
        good.append(family)
    return good, errors


@dataclass(frozen=True)
class BrokenEntry:
    """A family entry of the YAML that does not load (its DAG is not built): what can still
    be read of it, so the freshness check can find its family in the cluster and alert the
    family's own channels (``alerts``, when that part of the entry validates alone)."""

    name: str | None
    keyspace: str | None
    alerts: Alerts | None
    error: str


def broken_entries(path: str | os.PathLike[str] | None = None) -> list[BrokenEntry]:
    """The entries ``load_families_leniently`` could not load, each with its name, keyspace and
    alerts where they are valid on their own. Empty when the file cannot be read at all
    (``load_families_leniently`` raises that)."""
    resolved = config_path(path)
    _good, errors = load_families_leniently(resolved)
    if not errors:
        return []
    raw = _read_yaml(resolved)
    out: list[BrokenEntry] = []
    for index, entry in enumerate(raw["families"]):
        fields = entry if isinstance(entry, Mapping) else {}
        name = fields.get("name") if isinstance(fields.get("name"), str) else None
        key = name or _family_label(entry, index)
        error = errors.get(f"{name}#{index}") or errors.get(str(key))
        if error is None:
            continue
        keyspace = fields.get("keyspace")
        out.append(
            BrokenEntry(
                name,
                keyspace if isinstance(keyspace, str) and IDENTIFIER.match(keyspace) else None,
                _alerts_alone(fields.get("alerts")),
                error,
            )
        )
    return out


def _alerts_alone(raw: Any) -> Alerts | None:
    """An entry's ``alerts`` validated on their own (None: absent or invalid too)."""
    if raw is None:
        return None
    try:
        return Alerts.model_validate(raw)
    except ValidationError:
        return None
