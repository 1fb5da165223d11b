"""``counterctl``: a thin command line over the library (the DAG calls the same functions).

Exit codes: 0 done (or nothing to do), 1 unexpected error, 2 bad configuration or input
(or a permission the role lacks), 3 another run holds the family, 4 conservation check failed,
5 Cassandra unreachable, 6 Cassandra could not serve a request (too few live replicas, a
timeout: retry), 7 reconcile or recount found differences, 8 health: a family is past its
freshness limit (or was never compacted). A run that quarantined counters (NULL increments, a
failed check, a compact row changed outside the engine) compacts the rest and exits 4.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

import click
from cassandra import DriverException, Unauthorized
from cassandra.cluster import NoHostAvailable

from . import audit_export, engine, health, metrics
from .audit import Provenance, code_version, config_fingerprint
from .config import Catalog, ConfigError, Family, load_catalog
from .connection import (
    CassandraUnavailable,
    Connection,
    ConnectionConfigError,
    ConnectionSettings,
    connect,
)
from .core import Tally, epoch_for, format_key, parse_epoch
from .schema import (
    AUDIT_TABLE,
    COMPACTOR_ROLE,
    LEGACY_AUDIT_TABLE,
    SchemaError,
    compactor_grants,
    ensure_schema,
)
from .status import AuditRow
from .store.auditlog import AuditUpgradeError

if TYPE_CHECKING:
    from .recount import RecountReport
from .store import Store

EXIT_CODES: dict[type[BaseException], int] = {  # the first class that matches wins
    ConfigError: 2,
    engine.ArchiveError: 2,
    SchemaError: 2,
    ConnectionConfigError: 2,
    engine.LeaseHeld: 3,
    engine.EpochInFuture: 2,
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


def configure_logging(verbose: int) -> None:
    """Warnings to stderr (-v info, -vv debug). Run again after importing Airflow, which sends
    every log line to stdout, where the commands' output (JSON among it) goes."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    if not verbose:  # the driver's connection tracebacks; a failure is reported in one line
        for name in ("cassandra.cluster", "cassandra.connection", "cassandra.pool"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


EXIT_UNHEALTHY = 8
"""``counterctl health``: a family is past its freshness limit, or was never compacted."""


def airflow_connection_settings(conn_id: str) -> ConnectionSettings:
    """The settings of an Airflow connection, read as Airflow's own processes read it: the
    ``AIRFLOW_CONN_<ID>`` variable, the secrets backends, the metadata DB of ``$AIRFLOW_HOME``."""
    try:
        from .airflow.runtime import server_connection_settings
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
    def __init__(self, config: str | None, conn_id: str | None = None, verbose: int = 0):
        self.config_path = config
        self.conn_id = conn_id
        self.verbose = verbose
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
                    configure_logging(self.verbose)  # Airflow's import took over the logging
                else:
                    self._settings = ConnectionSettings.from_env()
        return self._settings

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


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"counterctl {code_version()}")
    ctx.exit()


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


def echo_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.group()
@click.option(
    "--config",
    envvar="COUNTERS_CONFIG",
    type=click.Path(dir_okay=False),
    help="Families YAML (default: include/counter_families.yaml, or $COUNTERS_CONFIG).",
)
@click.option(
    "--conn-id",
    envvar="COUNTERS_CONN_ID",
    help="Connect with this Airflow connection (e.g. cassandra_default), read as Airflow "
    "reads it (AIRFLOW_CONN_*, secrets backends, the metadata DB of AIRFLOW_HOME), instead "
    "of the CASSANDRA_* environment. Also $COUNTERS_CONN_ID.",
)
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print the version (the package's, and the checkout's commit) and exit.",
)
@click.pass_context
def cli(ctx: click.Context, config: str | None, conn_id: str | None, verbose: int) -> None:
    """Compact event-sourced counters in Cassandra.

    Connection (without --conn-id): CASSANDRA_HOSTS, CASSANDRA_PORT, CASSANDRA_USERNAME,
    CASSANDRA_PASSWORD, CASSANDRA_LOCAL_DC, CASSANDRA_PROTOCOL_VERSION (unset: negotiated);
    TLS: CASSANDRA_TLS_CA_FILE (PEM; or CASSANDRA_TLS=true for the system's CAs),
    CASSANDRA_TLS_CHECK_HOSTNAME (default true), CASSANDRA_TLS_CERT_FILE and
    CASSANDRA_TLS_KEY_FILE (a client certificate: mutual TLS).

    Metrics: where Airflow is configured (an airflow.cfg in AIRFLOW_HOME, or AIRFLOW__METRICS__*
    set), compact and health send the DAGs' metrics through Airflow's StatsD/OpenTelemetry
    settings.
    """
    configure_logging(verbose)
    ctx.obj = Context(config, conn_id, verbose)
    ctx.call_on_close(ctx.obj.close)


@cli.command("families")
@click.option(
    "--hashes",
    is_flag=True,
    help="Also print each family's configuration hash (the audit rows' config_hash).",
)
@click.option("--json", "as_json", is_flag=True, help="Print every family's fields as JSON.")
@pass_context
def families_command(obj: Context, hashes: bool, as_json: bool) -> None:
    """List the families of the config file."""
    if as_json:
        echo_json(
            [
                {**f.model_dump(mode="json"), "config_hash": config_fingerprint(f)}
                for f in obj.catalog.families
            ]
        )
        return
    for family in obj.catalog.families:
        line = (
            f"{family.name}\t{family.kind.value}\t{family.keyspace}.{family.raw_table} -> "
            f"{family.keyspace}.{family.compact_table}\tlag={family.lag}\tschedule='{family.schedule}'"
        )
        click.echo(f"{line}\t{config_fingerprint(family)}" if hashes else line)


@cli.command("init")
@click.option("--family", "names", multiple=True, help="Only these families (default: all).")
@click.option(
    "--replication",
    envvar="COUNTERS_REPLICATION",
    help="Replication map for keyspaces that do not exist yet, e.g. \"{'class': "
    "'NetworkTopologyStrategy', 'datacenter1': 3}\". Required unless every contact point is "
    "local (localhost/127.0.0.1: then SimpleStrategy with replication factor 1). Also "
    "$COUNTERS_REPLICATION.",
)
@click.option(
    "--with-demo-tables",
    is_flag=True,
    help="Also create the demo business tables (rows families' raw tables) if missing.",
)
@click.option(
    "--print-grants",
    is_flag=True,
    help="Only print the CQL GRANTs of the least-privilege compaction role (no connection).",
)
@click.option(
    "--role",
    default=COMPACTOR_ROLE,
    show_default=True,
    help="The role --print-grants grants to.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print what was done (or the grants) as JSON."
)
@pass_context
def init_command(
    obj: Context,
    names: tuple[str, ...],
    replication: str | None,
    with_demo_tables: bool,
    print_grants: bool,
    role: str,
    as_json: bool,
) -> None:
    """Create keyspaces and tables (IF NOT EXISTS); check existing tables against the YAML.

    \b
    A rows family's raw table is business data: init checks it but does not create it
    (except the demo's, with --with-demo-tables). Run init as a role that may create
    tables; run compactions as a role with only the grants of --print-grants: SELECT and
    MODIFY on each family's own tables (SELECT only on kept raw rows), nothing else.
    """
    families = [obj.family(n) for n in names] if names else list(obj.catalog.families)
    if print_grants:
        if as_json:
            echo_json({"role": role, "statements": compactor_grants(families, role)})
        else:
            _print_grants(families, role)
        return
    replication = replication_for(replication, obj.settings.hosts)
    if with_demo_tables:
        from .demo import create_demo_tables

        with reported():
            create_demo_tables(obj.conn.session, families, replication)
    done = []
    for family in families:
        with reported():
            layout = ensure_schema(obj.conn.session, family, replication)
            try:
                moved = Store(obj.conn, family, layout).audit_log.upgrade()
            except AuditUpgradeError as exc:
                raise Failure(str(exc), 1) from exc
        if as_json:
            done.append(
                {
                    "family": family.name,
                    "keyspace": family.keyspace,
                    "raw_table": family.raw_table,
                    "compact_table": family.compact_table,
                    "key": [c.name for c in layout.key],
                    "clustering": [c.name for c in layout.clustering],
                    "audit_rows_moved": moved,
                }
            )
            continue
        click.echo(
            f"{family.name}: ready ({family.keyspace}.{family.raw_table}: key "
            f"{[c.name for c in layout.key]}, clustering {[c.name for c in layout.clustering]})"
        )
        if moved:
            click.echo(
                f"{family.name}: {moved} audit row(s) moved from {family.keyspace}."
                f"{LEGACY_AUDIT_TABLE} into month partitions ({family.keyspace}.{AUDIT_TABLE})"
            )
    if as_json:
        echo_json(done)


def _print_grants(families: list[Family], role: str) -> None:
    names = ", ".join(f.name for f in families)
    click.echo(
        f"-- Least-privilege grants for the compaction role {role!r} (families: {names}).\n"
        "-- Create the role first, as a superuser, with a password from your secrets store:\n"
        f"--   CREATE ROLE IF NOT EXISTS {role} WITH LOGIN = true AND PASSWORD = '<secret>';"
    )
    for statement in compactor_grants(families, role):
        click.echo(f"{statement};")


def _parse_epoch(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_epoch(value)
    except ValueError as exc:
        raise Failure(f"--epoch: {exc}", 2) from exc


@cli.command("compact")
@click.option("--family", "name", required=True)
@click.option("--epoch", help="Fold rows up to this time (ISO 8601; default: now - lag).")
@click.option("--dry-run", is_flag=True, help="Plan and report; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--run-id", help="Run id (default: generated).")
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    help="Processes compacting shards in parallel (default: shards, at most the CPU count).",
)
@pass_context
def compact_command(
    obj: Context,
    name: str,
    epoch: str | None,
    dry_run: bool,
    as_json: bool,
    run_id: str | None,
    workers: int | None,
) -> None:
    """Compact one family: fold, verify, clean up, record the audit row."""
    family = obj.family(name)
    at = _parse_epoch(epoch) or epoch_for(datetime.now(UTC), family.lag)
    store = Store(obj.conn, family)
    store.provenance = _by_cli(epoch=epoch, dry_run=dry_run, run_id=run_id, workers=workers)
    progress = _progress() if sys.stderr.isatty() and not as_json else None
    workers = workers or max(1, min(family.shards, os.cpu_count() or 1))
    started = datetime.now(UTC)
    audited: list[str] = []

    def on_audit(record: dict[str, Any], tally: Tally) -> None:
        """The run's metrics, as the DAG sends them (whatever the outcome)."""
        audited.append(record["outcome"])
        metrics.emit_run(
            record,
            quarantined=lambda: health.quarantined_now(store),
            stale_after=health.stale_after(family),
        )
        configure_logging(obj.verbose)  # importing Airflow's facade took over the logging

    try:
        with reported():
            summary = engine.run_family(
                store,
                at,
                run_id,
                dry_run=dry_run,
                progress=progress,
                workers=workers,
                on_audit=on_audit,
            )
    except click.ClickException:
        if not audited:  # failed before (or while) writing its audit row: still count it
            failed = {"family": family.name, "outcome": "failed", "started_at": started}
            metrics.emit_run(
                failed,
                quarantined=lambda: health.quarantined_now(store),
                stale_after=health.stale_after(family),
            )
            configure_logging(obj.verbose)
        raise
    if as_json:
        click.echo(json.dumps(summary.as_dict(), indent=2, default=str))
    else:
        _print_summary(summary)


def _by_cli(**parameters: object) -> Provenance:
    """Who runs this command (the OS user, the host and the Cassandra role are added to every
    audit row it writes) and the options it was given."""
    return Provenance("cli", None, {k: v for k, v in parameters.items() if v is not None})


def _progress() -> Callable[[str], None]:
    def say(message: str) -> None:
        click.echo(f"  .. {message}", err=True)

    return say


def _print_summary(summary: engine.RunSummary) -> None:
    data = summary.as_dict()
    click.echo(f"{data['family']}: {data['outcome']} (run {data['run_id']})")
    if summary.message:
        click.echo(f"  {summary.message}")
    click.echo(f"  epoch: {data['epoch_before']} -> {data['epoch']}")
    click.echo(
        f"  counters: {data['counters_committed']} committed, rows folded: {data['rows_folded']}, "
        f"sum folded: {data['sum_folded']}, rows deleted: {data['rows_deleted']}, "
        f"conflicts: {data['conflicts']}"
    )
    click.echo(
        f"  late rows: {data['late_rows']} (sum {data['late_sum']}, worst lateness "
        f"{data['max_lateness_ms'] / 1000:.3f} s)"
    )
    if data["checks"]:
        click.echo(
            "  checks: "
            + ", ".join(f"{k}={'ok' if v else 'FAIL'}" for k, v in data["checks"].items())
        )
    click.echo("  durations: " + ", ".join(f"{k} {v:.3f}s" for k, v in data["durations_s"].items()))


@cli.command("read")
@click.option("--family", "name", required=True)
@click.option("--json", "as_json", is_flag=True)
@click.argument("counters", nargs=-1, required=True)
@pass_context
def read_command(obj: Context, name: str, as_json: bool, counters: tuple[str, ...]) -> None:
    """Read counters: compact value + increments newer than its epoch.

    \b
    A composite key is written with '/' between its parts, e.g. 7/2026-11-22.
    """
    from .client import CounterClient

    family = obj.family(name)
    client = CounterClient(obj.conn, family)
    with reported():
        try:
            keys = [client.store.parse_key(_split_counter(family, c)) for c in counters]
        except ValueError as exc:
            raise Failure(str(exc), 2) from exc
        values = client.read_many(keys)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "counter": format_key(v.counter),
                        "value": v.value,
                        "compact_value": v.compact_value,
                        "epoch": v.epoch.isoformat() if v.epoch else None,
                        "newer_sum": v.newer_sum,
                    }
                    for v in values
                ],
                indent=2,
            )
        )
        return
    for v in values:
        epoch = v.epoch.isoformat() if v.epoch else "-"
        click.echo(
            f"{format_key(v.counter)}\t{v.value}\t(compact {v.compact_value} @ {epoch} "
            f"+ newer {v.newer_sum})"
        )


def _split_counter(family: Family, text: str) -> list[str]:
    parts = text.split("/") if len(family.columns.key) > 1 else [text]
    if len(parts) != len(family.columns.key):
        raise Failure(
            f"counter {text!r}: family {family.name!r} has key {list(family.columns.key)}; "
            "give one value per column, separated by '/'",
            2,
        )
    return parts


@cli.command("reset")
@click.option("--family", "name", required=True)
@click.option(
    "--at",
    "at",
    help="Reset point (ISO 8601, not in the future). Later increments count. Default: now "
    "less the family's lag, truncated to the minute (as a run's epoch), unless the counter was "
    "reset within the last hour and no --reset-id is given: then that reset is taken for this "
    "one (repeating the command after an unknown outcome resets once).",
)
@click.option(
    "--reset-id",
    help="Idempotency id (default: derived from counter and point). When given it alone "
    "decides: the same id is one reset (found in the run log, 14 days), a new id resets again.",
)
@click.option("--dry-run", is_flag=True, help="Show what the reset would do; change nothing.")
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Do not ask for confirmation (required when standard input is not a terminal).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.argument("counter")
@pass_context
def reset_command(
    obj: Context,
    name: str,
    at: str | None,
    reset_id: str | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    counter: str,
) -> None:
    """Set COUNTER back to zero; repeating the command is one reset (recorded in the audit).

    \b
    Asks for confirmation on a terminal (shows the value it takes back to zero); elsewhere
    refuses without --yes. --dry-run shows the same and changes nothing.
    """
    family = obj.family(name)
    moment = _parse_epoch(at)
    if not dry_run:
        can_confirm(yes, f"reset of {counter} (family {family.name})")
    store = Store(obj.conn, family)
    store.provenance = _by_cli()
    with reported():
        try:
            key = store.parse_key(_split_counter(family, counter))
        except ValueError as exc:
            raise Failure(str(exc), 2) from exc
        try:
            plan = engine.plan_reset(store, key, moment, reset_id)
            if dry_run:
                _print_reset(family, plan, as_json, dry_run=True)
                return
            if not plan.already_done:
                confirm(
                    yes,
                    f"{family.name}: reset {format_key(key)} from {plan.value_before} to 0 at "
                    f"{plan.at.isoformat()} ({plan.rows_deleted} raw row(s) consumed)?",
                )
            result = engine.reset_counter(store, key, moment, reset_id)
        except engine.EngineError as exc:
            raise Failure(str(exc), 2) from exc
    _print_reset(family, result, as_json, dry_run=False)


def _print_reset(family: Family, result: engine.ResetResult, as_json: bool, dry_run: bool) -> None:
    if as_json:
        echo_json(
            {
                "family": family.name,
                "counter": format_key(result.counter),
                "at": result.at.isoformat(),
                "value_before": result.value_before,
                "already_done": result.already_done,
                "rows_consumed": result.rows_deleted,
                "reset_id": result.reset_id,
                "dry_run": dry_run,
            }
        )
        return
    if dry_run:
        what = (
            "already reset: nothing to do"
            if result.already_done
            else f"would reset it from {result.value_before} to 0, consuming "
            f"{result.rows_deleted} raw row(s)"
        )
        click.echo(
            f"{family.name}: {format_key(result.counter)} at {result.at.isoformat()}: {what} "
            f"(id {result.reset_id}; dry run, nothing changed)"
        )
        return
    state = "already done" if result.already_done else f"was {result.value_before}"
    click.echo(
        f"{family.name}: {format_key(result.counter)} reset to 0 at {result.at.isoformat()} "
        f"({state}; {result.rows_deleted} raw row(s) consumed; id {result.reset_id})"
    )


FINISHING = " (finishing the reshard under way)"


@cli.command("reshard")
@click.option("--family", "name", required=True)
@click.option("--shards", type=int, required=True, help="The new shard count (1..256).")
@click.option(
    "--dry-run", is_flag=True, help="Count the checkpoints it would move; change nothing."
)
@click.option(
    "--yes",
    "-y",
    is_flag=True,
    help="Do not ask for confirmation (required when standard input is not a terminal).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_context
def reshard_command(
    obj: Context, name: str, shards: int, dry_run: bool, yes: bool, as_json: bool
) -> None:
    """Move the family's checkpoints to another shard count, exactly.

    Every counter's checkpoint, quarantine entry, index mark and record of counted keys moves to
    its place under --shards; runs are refused meanwhile (pause the family's DAG first, or they
    fail until it is done). Resumable: after a crash, run the same command again. Then set
    'shards' in the YAML to the new count. Asks for confirmation on a terminal; elsewhere
    refuses without --yes. --dry-run counts what would move and changes nothing."""
    from dataclasses import asdict

    from .reshard import plan_reshard, reshard

    family = obj.family(name)
    if not dry_run:
        can_confirm(yes, f"reshard of family {family.name}")
    store = Store(obj.conn, family)
    with reported():
        try:
            plan = plan_reshard(store, shards)
            if dry_run:
                if as_json:
                    echo_json({**asdict(plan), "dry_run": True})
                else:
                    click.echo(
                        f"{family.name}: {plan.shards_before} -> {plan.shards_after} shard(s) "
                        f"would move {plan.checkpoints_to_move} of {plan.checkpoints} "
                        f"checkpoint(s){FINISHING if plan.under_way else ''} (dry run, nothing "
                        "changed)"
                    )
                return
            if plan.shards_before != plan.shards_after or plan.under_way:
                confirm(
                    yes,
                    f"{family.name}: move {plan.checkpoints_to_move} of {plan.checkpoints} "
                    f"checkpoint(s) from {plan.shards_before} to {plan.shards_after} shard(s)? "
                    "Runs are refused meanwhile",
                )
            progress = None if as_json else click.echo
            done = reshard(store, shards, progress=progress)
        except engine.EngineError as exc:
            raise Failure(str(exc), 2) from exc
    if as_json:
        echo_json(asdict(done))
        return
    click.echo(
        f"{family.name}: {done.shards_before} -> {done.shards_after} shard(s): "
        f"{done.checkpoints_moved} checkpoint(s), {done.records_moved} record(s) of counted keys, "
        f"{done.quarantined_moved} quarantine entr(ies), {done.marks_moved} index mark(s) moved. "
        f"Set 'shards: {done.shards_after}' in the YAML."
    )


@cli.command("reconcile")
@click.option("--family", "name", required=True)
@click.option("--repair", is_flag=True, help="Fix what can be fixed (see --help text).")
@click.option("--json", "as_json", is_flag=True)
@pass_context
def reconcile_command(obj: Context, name: str, repair: bool, as_json: bool) -> None:
    """Recount a unique family's set (or a rows family's rows) and report differences.

    \b
    unique: distinct members vs the counter's value; --repair rewrites the derived row of every
            member not yet counted (healing writers that crashed mid-way), then compact.
    rows:   the rows that exist after each reset point and at or below each checkpoint vs
            its count (rows that arrived behind it, rows deleted since), for every counter
            with rows or a checkpoint; --repair commits the recount conditionally.
    Exit code 0 when everything matches (or was repaired), 7 when differences remain.
    """
    family = obj.family(name)
    store = Store(obj.conn, family)
    store.provenance = _by_cli()
    with reported():
        found = engine.reconcile(store, repair=repair)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "counter": format_key(d.counter),
                        "expected": d.expected,
                        "counted": d.counted,
                        "difference": d.difference,
                        "repaired": d.repaired,
                    }
                    for d in found
                ],
                indent=2,
            )
        )
    else:
        for d in found:
            click.echo(
                f"{format_key(d.counter)}\texpected {d.expected}\tcounted {d.counted}\t"
                f"difference {d.difference:+d}{'  (repaired)' if d.repaired else ''}"
            )
        click.echo(f"{family.name}: {len(found)} counter(s) differ")
    if any(not d.repaired for d in found):
        raise SystemExit(7)


@cli.command("recount")
@click.option("--family", "name", required=True)
@click.option(
    "--from",
    "since",
    help="Only the archive of the runs started at or after this time (ISO 8601, UTC if no "
    "offset): each counter's opening balance is its value before its first archived commit "
    "after it.",
)
@click.option(
    "--to",
    "until",
    help="Only the runs started before this time: each counter is rebuilt up to its last "
    "archived commit before it and compared with the value that commit recorded (not with "
    "the compact table, which holds today's).",
)
@click.option("--json", "as_json", is_flag=True, help="Every counter, every figure, as JSON.")
@click.argument("counters", nargs=-1)
@pass_context
def recount_command(
    obj: Context,
    name: str,
    since: str | None,
    until: str | None,
    as_json: bool,
    counters: tuple[str, ...],
) -> None:
    """Rebuild counters from the archive of deleted rows plus the rows still present, and
    compare them with the compact table: COUNTER(s), or every counter of the family.

    \b
    Each file the audit rows' manifests name is checked first (sha256, rows, sum): a file
    changed after its run wrote it is reported and not counted. A counter's value is its
    opening balance (0 when its first commit, or its last reset, is in the window) plus the
    counted rows of every archived commit since, plus its counted rows still present; each
    commit's recorded value must follow from the one before. Exit code 0 when every counter
    equals the compact table, 7 on any difference or changed file, 2 for a family without
    an archive. Examples:
      counterctl recount --family trades IBM
      counterctl recount --family trades --from 2026-11-01 --to 2026-12-01
    """
    from .recount import recount

    family = obj.family(name)
    low, high = _parse_time(since, "--from"), _parse_time(until, "--to")
    if low and high and low >= high:
        raise Failure(f"--from ({since}) must be before --to ({until})", 2)
    store = Store(obj.conn, family)
    with reported():
        try:
            keys = [store.parse_key(_split_counter(family, c)) for c in counters]
        except ValueError as exc:
            raise Failure(str(exc), 2) from exc
        report = recount(store, keys or None, low, high)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        _print_recount(report, every=bool(counters))
    if not report.ok:
        raise SystemExit(7)


def _print_recount(report: RecountReport, every: bool) -> None:
    """Each counter asked for (or, for the whole family, each that differs) and a summary."""
    shown = report.counters if every else report.differences
    for r in shown:
        opening = (
            "-" if r.opening is None else f"{r.opening}{' (from zero)' if r.from_start else ''}"
        )
        diff = "-" if r.difference is None else f"{r.difference:+d}"
        click.echo(
            f"{format_key(r.counter)}\trebuilt {r.rebuilt}\tcompact {r.expected}\t"
            f"difference {diff}\topening {opening}\tarchived {r.archived_rows} row(s) of "
            f"{r.archived_commits} commit(s), sum {r.archived_sum}\tpresent {r.present_rows} "
            f"row(s), sum {r.present_sum}"
        )
        for problem in r.problems:
            click.echo(f"  ! {problem}")
        for note in r.notes:
            click.echo(f"  . {note}")
    for problem in report.file_problems:
        click.echo(f"file: {problem}")
    verdict = (
        "every counter equals the compact table"
        if report.ok
        else f"{len(report.differences)} counter(s) differ, {len(report.file_problems)} "
        "file problem(s)"
    )
    click.echo(
        f"{report.family}: {len(report.counters)} counter(s) recounted from {report.files} "
        f"archive file(s) ({report.pruned} past the retention, {report.duplicates} row(s) "
        f"in two files): {verdict}"
    )


@cli.command("quarantine")
@click.option("--family", "name", required=True)
@click.option(
    "--release",
    "releases",
    multiple=True,
    metavar="COUNTER",
    help="Let this counter back into compaction (repeatable); its readers' copy is restored "
    "from the ledger. Fix its raw rows first if they were the reason.",
)
@click.option("--json", "as_json", is_flag=True)
@pass_context
def quarantine_command(obj: Context, name: str, releases: tuple[str, ...], as_json: bool) -> None:
    """List the counters kept out of compaction (NULL increments, a failed conservation
    check, a compact row changed outside the engine), or release some."""
    family = obj.family(name)
    store = Store(obj.conn, family)
    store.provenance = _by_cli()
    with reported():
        for text in releases:
            try:
                key = store.parse_key(_split_counter(family, text))
            except ValueError as exc:
                raise Failure(str(exc), 2) from exc
            try:
                engine.release(store, key)
            except engine.EngineError as exc:
                raise Failure(str(exc), 2) from exc
            click.echo(f"{family.name}: released {text}")
        held = engine.quarantined(store)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "counter": format_key(q.counter),
                        "reason": q.reason,
                        "run_id": q.run_id,
                        "detail": q.detail,
                    }
                    for q in held
                ],
                indent=2,
            )
        )
        return
    for q in held:
        click.echo(f"{format_key(q.counter)}\t{q.reason}\t{q.run_id}\t{q.detail}")
    click.echo(f"{family.name}: {len(held)} counter(s) quarantined")


@cli.command("audit")
@click.option("--family", "name", required=True)
@click.option("--since", help="Rows started at or after this time (ISO 8601, UTC if no offset).")
@click.option("--until", help="Rows started before this time (ISO 8601, UTC if no offset).")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    help="At most this many rows, newest first (default: 20 for the table, every row of the "
    "range for --format).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", *audit_export.FORMATS]),
    default="table",
    show_default=True,
    help="csv, json, jsonl (a JSON object per line) and parquet stream every row of the range "
    "(a page at a time) with every "
    "column: who, parameters, code version, configuration hash, GX suite and result.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    default="-",
    help="Write the export to this file (default: standard output; parquet needs a file "
    "unless standard output is redirected).",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@pass_context
def audit_command(
    obj: Context,
    name: str,
    since: str | None,
    until: str | None,
    limit: int | None,
    fmt: str,
    output: str,
    as_json: bool,
) -> None:
    """Print or export the family's audit rows, newest first.

    \b
    Every run and every operator action (reset, reconcile --repair, quarantine --release,
    a manual compact) has a row naming who did it. Examples:
      counterctl audit --family trades
      counterctl audit --family trades --since 2026-11-01 --until 2026-12-01 \\
          --format parquet -o trades-2026-11.parquet
    """
    from itertools import islice

    from .status import audit_stream

    family = obj.family(name)
    fmt = "json" if as_json else fmt
    low, high = _parse_time(since, "--since"), _parse_time(until, "--until")
    if low and high and low >= high:
        raise Failure(f"--since ({since}) must be before --until ({until})", 2)
    if fmt == "parquet" and output == "-" and sys.stdout.isatty():
        raise Failure("--format parquet writes binary: give --output FILE or redirect", 2)
    store = Store(obj.conn, family)
    with reported():
        rows = audit_stream(store, low, high)
        if limit is not None or fmt == "table":
            rows = islice(rows, limit or 20)
        if fmt == "table":
            _print_audit_table(list(rows))
            return
        with click.open_file(output, "wb") as sink:
            for chunk in audit_export.chunks(fmt, rows, family.name, low, high):
                sink.write(chunk)


def _parse_time(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_epoch(value)
    except ValueError as exc:
        raise Failure(f"{option}: {exc}", 2) from exc


def _print_audit_table(rows: list[AuditRow]) -> None:
    click.echo(
        "started_at\trun_id\taction\toutcome\tepoch_after\tcounters\trows_folded\t"
        "sum_folded\tlate_rows\trows_deleted\twho"
    )
    for r in rows:
        who = r.airflow_user or (f"{r.os_user}@{r.host}" if r.os_user else "-")
        click.echo(
            f"{r.started_at:%Y-%m-%d %H:%M:%S}\t{r.run_id}\t{r.action}\t{r.outcome}\t"
            f"{r.epoch_after}\t{r.counters}\t{r.rows_folded}\t{r.sum_folded}\t"
            f"{r.late_rows}\t{r.rows_deleted}\t{who} ({r.triggered_by or '-'})"
        )


@cli.command("health")
@click.option("--family", "names", multiple=True, help="Only these families (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print every family's lag as JSON.")
@pass_context
def health_command(obj: Context, names: tuple[str, ...], as_json: bool) -> None:
    """Check every family's lag against its freshness limit, for a watchdog outside Airflow.

    \b
    The lag is now - the family's lag - its compacted epoch, read from Cassandra (the
    counters_freshness DAG's rule): fresh, late (past half the limit) or stale (past it);
    never before the first run. Exit code 0 when every family is fresh or late, 8 when one
    is stale or was never compacted (5/6 when Cassandra does not answer), so a cron job, a
    Kubernetes probe or a monitoring check sees compaction stop even when the scheduler
    (which runs the freshness DAG) is down. Sends each family's gauges (compacted epoch,
    lag, limit, quarantined counters) where Airflow's metrics are configured.
    """
    families = [obj.family(n) for n in names] if names else list(obj.catalog.families)
    now = datetime.now(UTC)
    with reported():
        lags = health.read_lags((Store(obj.conn, f) for f in families), now)
    for lag in lags:
        metrics.emit_family(
            lag.family.name,
            lag.epoch,
            stale_after=health.stale_after(lag.family),
            quarantined=partial(health.quarantined_now, Store(obj.conn, lag.family)),
            now=now,
        )
    configure_logging(obj.verbose)  # importing Airflow's facade took over the logging
    bad = health.unhealthy(lags)
    if as_json:
        click.echo(json.dumps([lag.as_dict() for lag in lags], indent=2))
    else:
        for lag in lags:
            click.echo(lag.line())
        click.echo(
            f"{len(lags) - len(bad)} of {len(lags)} famil{'y' if len(lags) == 1 else 'ies'} "
            "within their freshness limit"
            + (f"; unhealthy: {', '.join(lag.family.name for lag in bad)}" if bad else "")
        )
    if bad:
        raise SystemExit(EXIT_UNHEALTHY)


@cli.command("demo-writer", hidden=True)
@click.option("--family", "names", multiple=True, help="Only these families (default: all).")
@click.option("--rate", default=20.0, show_default=True, help="Increments per second per family.")
@click.option("--counters", default=50, show_default=True, help="Distinct counters per family.")
@click.option("--duration", default=0.0, help="Stop after this many seconds (0: until signalled).")
@pass_context
def demo_writer_command(
    obj: Context, names: tuple[str, ...], rate: float, counters: int, duration: float
) -> None:
    """Keep appending increments to the demo families until SIGINT/SIGTERM."""
    from .demo import write_forever

    families = [obj.family(n) for n in names] if names else list(obj.catalog.families)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with reported():
        written = write_forever(obj.conn, families, rate, counters, stop, duration or None)
    click.echo(f"demo writer stopped after {written} increments", err=True)


def main() -> None:
    cli(prog_name="counterctl")


if __name__ == "__main__":
    main()
