"""``counterctl``: a thin command line over the library (the DAG calls the same functions).

Exit codes: 0 done (or nothing to do), 1 unexpected error, 2 bad configuration or input
(or a permission the role lacks), 3 another run holds the family, 4 conservation check failed,
5 Cassandra unreachable, 6 Cassandra could not serve a request (too few live replicas, a
timeout: retry), 7 reconcile or recount found differences, 8 health: a family is past its
freshness limit (or was never compacted), 9 recount: no counter differs but some cannot be
rebuilt (their evidence expired). A run that quarantined counters (NULL increments, a
failed check, a compact row changed outside the engine) compacts the rest and exits 4.
"""

from __future__ import annotations

import click

from ..audit import code_version
from .audit_commands import audit_command
from .common import LOG_FORMATS, Context, configure_logging
from .counter_commands import (
    quarantine_command,
    reconcile_command,
    recount_command,
    reset_command,
    reshard_command,
)
from .family_commands import families_command, init_command, retire_command
from .run_commands import compact_command, demo_writer_command, health_command, read_command


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"counterctl {code_version()}")
    ctx.exit()


@click.group()
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    help="Families YAML ($COUNTERS_CONFIG, a relative one in Airflow's DAG folder; else "
    "counter_families.yaml in the DAG folder).",
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
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    envvar="COUNTERS_LOG_FORMAT",
    help="How log lines and errors go to stderr: text, or one JSON object a line (time, level, "
    "logger, message; an error's exit_code) for a CronJob's log pipeline. Also "
    "$COUNTERS_LOG_FORMAT.",
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print the version (the package's, and the checkout's commit) and exit.",
)
@click.pass_context
def cli(
    ctx: click.Context, config: str | None, conn_id: str | None, verbose: int, log_format: str
) -> None:
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
    configure_logging(verbose, log_format)
    ctx.obj = Context(config, conn_id, verbose, log_format)
    ctx.call_on_close(ctx.obj.close)


for command in (
    families_command,
    init_command,
    retire_command,
    compact_command,
    read_command,
    health_command,
    demo_writer_command,
    reset_command,
    reshard_command,
    reconcile_command,
    recount_command,
    quarantine_command,
    audit_command,
):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="counterctl")
