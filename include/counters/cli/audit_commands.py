"""``counterctl audit``: the audit trail as a table, CSV, JSON or JSON lines."""

from __future__ import annotations

import sys

import click

from .. import audit_export
from ..core import to_text
from ..status import AuditRow
from ..store import Store
from .common import Context, Failure, parse_time_option, pass_context, reported


@click.command("audit")
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

    from ..status import audit_stream

    family = obj.family(name)
    fmt = "json" if as_json else fmt
    low, high = parse_time_option(since, "--since"), parse_time_option(until, "--until")
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


def _print_audit_table(rows: list[AuditRow]) -> None:
    click.echo(
        "started_at\trun_id\taction\toutcome\tepoch_after\tcounters\trows_folded\t"
        "sum_folded\tlate_rows\trows_deleted\twho"
    )
    for r in rows:
        who = r.airflow_user or (f"{r.os_user}@{r.host}" if r.os_user else "-")
        click.echo(
            f"{to_text(r.started_at)}\t{r.run_id}\t{r.action}\t{r.outcome}\t"
            f"{to_text(r.epoch_after)}\t{r.counters}\t{r.rows_folded}\t{r.sum_folded}\t"
            f"{r.late_rows}\t{r.rows_deleted}\t{who} ({r.triggered_by or '-'})"
        )
