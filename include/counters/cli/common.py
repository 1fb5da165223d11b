"""What every ``counterctl`` command shares: the context, exit codes, confirmations."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from typing import Any

import click
from cassandra import DriverException, Unauthorized
from cassandra.cluster import NoHostAvailable

from .. import engine
from ..audit import Provenance
from ..config import Catalog, ConfigError, Family, load_catalog
from ..connection import (
    CassandraUnavailable,
    Connection,
    ConnectionConfigError,
    ConnectionSettings,
    connect,
)
from ..core import Key, day_text, parse_moment, to_text
from ..schema import SchemaError
from ..store import Store

EXIT_CODES: dict[type[BaseException], int] = {  # the first class that matches wins
    ConfigError: 2,
    engine.ArchiveError: 2,
    SchemaError: 2,
    ConnectionConfigError: 2,
    engine.LeaseHeld: 3,
    engine.EpochInFuture: 2,
    engine.ClockSkew: 2,
    engine.ChecksFailed: 4,
    CassandraUnavailable: 5,
    Unauthorized: 2,
    NoHostAvailable: 6,
    DriverException: 6,  # Unavailable, read/write timeouts and failures, OperationTimedOut
}


class Failure(click.ClickException):
    """A one-line reason and the exit code that goes with it."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        # click types exit_code as a ClassVar, yet reads it from the instance (e.exit_code)
        self.exit_code = code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        """As click shows it (``Error: ...``), or one JSON line under ``--log-format json``."""
        if _log_format != "json":
            super().show(file)
            return
        line: dict[str, object] = {"time": to_text(datetime.now(UTC)), "level": "error"}
        line |= {"logger": "counterctl", "message": self.format_message()}
        line["exit_code"] = self.exit_code
        click.echo(json.dumps(line), err=True)


@contextmanager
def reported() -> Iterator[None]:
    """Map library errors to one-line messages and exit codes."""
    try:
        yield
    except click.ClickException:
        raise
    except tuple(EXIT_CODES) as exc:
        raise Failure(*failure(exc)) from exc


def failure(exc: BaseException) -> tuple[str, int]:
    """The one line and the exit code for an error; the driver's errors say what to do."""
    transient = "Cannot achieve consistency level" in str(exc)
    if isinstance(exc, Unauthorized) and not transient:
        return (
            f"permission denied: {exc} (the role needs the grants that `counterctl init "
            "--print-grants` prints)",
            2,
        )
    if isinstance(exc, DriverException | NoHostAvailable):
        # an Unauthorized that could not read the role's permissions is an outage too
        return (
            f"{type(exc).__name__}: {exc} -- Cassandra could not serve the request at the "
            "family's consistency level (too few live replicas, or a timeout): transient, retry "
            "when the nodes are back. A failed run deletes no row it has not counted",
            6,
        )
    return str(exc), next(c for kind, c in EXIT_CODES.items() if isinstance(exc, kind))


LOG_FORMATS = ("text", "json")
_log_format = "text"


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line (``--log-format json``): what a CronJob's log pipeline parses
    (time in the outputs' format, level, logger, message, and the traceback when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": to_text(datetime.fromtimestamp(record.created, UTC)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def configure_logging(verbose: int, log_format: str = "text") -> None:
    """Warnings to stderr (-v info, -vv debug), as text or one JSON object a line. Run again
    after importing Airflow, which sends every log line to stdout, where the commands' output
    (JSON among it) goes."""
    global _log_format
    _log_format = log_format
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    if not verbose:  # the driver's connection tracebacks; a failure is reported in one line
        for name in ("cassandra.cluster", "cassandra.connection", "cassandra.pool"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


EXIT_UNHEALTHY = 8
"""``counterctl health``: a family is past its freshness limit, or was never compacted."""


def airflow_connection_settings(conn_id: str) -> ConnectionSettings:
    """The settings of an Airflow connection, read as Airflow's own processes read it: the
    ``AIRFLOW_CONN_<ID>`` variable, the secrets backends, the metadata DB of ``$AIRFLOW_HOME``."""
    try:
        from ..airflow.runtime import server_connection_settings
    except ImportError as exc:
        raise Failure(f"--conn-id {conn_id!r}: Airflow is not installed here ({exc})", 2) from exc
    try:
        return server_connection_settings(conn_id)
    except ConnectionConfigError:
        raise
    except Exception as exc:  # AirflowNotFoundException, a metadata DB that does not answer
        home = os.environ.get("AIRFLOW_HOME") or "~/airflow"
        raise Failure(
            f"--conn-id {conn_id!r}: cannot read the Airflow connection ({type(exc).__name__}: "
            f"{exc}); define it in the metadata DB of AIRFLOW_HOME={home}, a secrets backend or "
            f"AIRFLOW_CONN_{conn_id.upper()}",
            2,
        ) from exc


class Context:
    def __init__(
        self,
        config: str | None,
        conn_id: str | None = None,
        verbose: int = 0,
        log_format: str = "text",
    ):
        self.config_path = config
        self.conn_id = conn_id
        self.verbose = verbose
        self.log_format = log_format
        self._catalog: Catalog | None = None
        self._conn: Connection | None = None
        self._settings: ConnectionSettings | None = None

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            with reported():
                self._catalog = load_catalog(self.config_path)
        return self._catalog

    def family(self, name: str) -> Family:
        with reported():
            return self.catalog.get(name)

    @property
    def settings(self) -> ConnectionSettings:
        """The Airflow connection ``--conn-id`` names (as the DAGs connect), else the
        ``CASSANDRA_*`` environment."""
        if self._settings is None:
            with reported():
                if self.conn_id:
                    self._settings = airflow_connection_settings(self.conn_id)
                    self.take_back_logging()  # Airflow's import took over the logging
                else:
                    self._settings = ConnectionSettings.from_env()
        return self._settings

    def take_back_logging(self) -> None:
        """The command's logging again, after an import of Airflow's took it over."""
        configure_logging(self.verbose, self.log_format)

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            settings = self.settings
            with reported():
                self._conn = connect(settings)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


pass_context = click.make_pass_decorator(Context)


def stdin_is_terminal() -> bool:
    """Whether a person can answer a confirmation (tests replace it)."""
    return sys.stdin.isatty()


def can_confirm(yes: bool, what: str) -> None:
    """Checked before connecting: a change goes on only with ``--yes`` or a person at a
    terminal to say yes; without a terminal (a script, a pipe, cron) it is refused rather
    than guessed."""
    if not yes and not stdin_is_terminal():
        raise Failure(
            f"{what}: refusing to change anything without confirmation; standard input is not a "
            "terminal, so pass --yes (or --dry-run to see what it would do)",
            2,
        )


def confirm(yes: bool, question: str) -> None:
    """Ask (unless ``--yes``); "no" aborts with nothing changed."""
    if not yes:
        click.confirm(question, abort=True, err=True)


LOCAL_HOSTS = ("localhost",)
DEV_REPLICATION = "{'class': 'SimpleStrategy', 'replication_factor': 1}"


def is_local_host(host: str) -> bool:
    """localhost or a loopback address (127.0.0.1, the local 3-node cluster's 127.0.0.2/3,
    ::1): the local development setup."""
    if host.strip().lower() in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.strip()).is_loopback
    except ValueError:
        return False


def replication_for(given: str | None, hosts: tuple[str, ...]) -> str:
    """The replication for keyspaces ``init`` creates: the one given, or SimpleStrategy RF 1
    only when every contact point is local (a single dev node); a real cluster must say."""
    if given:
        return given
    remote = [h for h in hosts if not is_local_host(h)]
    if remote:
        raise Failure(
            f"init: --replication is required for the cluster at {', '.join(remote)}: "
            f"SimpleStrategy with replication factor 1 is the default only for a local "
            f"development node (localhost/127.0.0.1). E.g. --replication \"{{'class': "
            f"'NetworkTopologyStrategy', 'datacenter1': 3}}\" (or COUNTERS_REPLICATION)",
            2,
        )
    return DEV_REPLICATION


def _json_value(value: object) -> object:
    """A value ``json`` does not know: a time as ``to_text`` writes it (the one format of every
    output: UTC, milliseconds, ``Z``), a date in ISO 8601, anything else as its text."""
    if isinstance(value, datetime):
        return to_text(value)
    if isinstance(value, date):
        return day_text(value)
    return str(value)


def echo_json(data: object) -> None:
    """Every ``--json`` output goes through here, so every time in it has one format."""
    click.echo(json.dumps(data, indent=2, default=_json_value))


def parse_time_option(value: str | None, option: str) -> datetime | None:
    """An option's time (ISO 8601, UTC if no offset), tz-aware UTC to the millisecond (what
    the write API takes); a bad one exits 2 naming the option."""
    if value is None:
        return None
    try:
        return parse_moment(value)
    except ValueError as exc:
        raise Failure(f"{option}: {exc}", 2) from exc


def by_cli(**parameters: object) -> Provenance:
    """Who runs this command (the OS user, the host and the Cassandra role are added to every
    audit row it writes) and the options it was given."""
    return Provenance("cli", None, {k: v for k, v in parameters.items() if v is not None})


def audited_store(conn: Connection, family: Family, **parameters: object) -> Store:
    """The family's store, its audit rows saying this command wrote them, with ``parameters``
    (``by_cli``): every command that changes counters opens its store so."""
    store = Store(conn, family)
    store.audit.provenance = by_cli(**parameters)
    return store


def counter_keys(store: Store, texts: Iterable[str]) -> list[Key]:
    """COUNTER arguments as the family's typed keys ('/' between a composite key's parts);
    one that is not exits 2, naming it and the family's key."""
    try:
        return [store.keys.parse_key(split_counter(store.family, text)) for text in texts]
    except ValueError as exc:
        raise Failure(str(exc), 2) from exc


def split_counter(family: Family, text: str) -> list[str]:
    parts = text.split("/") if len(family.columns.key) > 1 else [text]
    if len(parts) != len(family.columns.key):
        raise Failure(
            f"counter {text!r}: family {family.name!r} has key {list(family.columns.key)}; "
            "give one value per column, separated by '/'",
            2,
        )
    return parts
