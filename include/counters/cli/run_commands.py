"""``counterctl compact``, ``read``, ``health`` and the demo writer."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial

import click

from .. import engine, health, metrics
from ..config import Family
from ..core import Tally, format_key, run_epoch, to_text
from ..gx import evidence
from ..store import Store
from .common import (
    EXIT_UNHEALTHY,
    Context,
    Failure,
    audited_store,
    counter_keys,
    echo_json,
    pass_context,
    reported,
)


@click.command("compact")
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
    try:
        with reported():  # the cluster's time, not this host's (the plan refuses a host far off)
            cluster_now = obj.conn.cluster_clock().now()
        at = run_epoch(cluster_now, family.lag, epoch)
    except ValueError as exc:
        raise Failure(f"--epoch: {exc}", 2) from exc
    store = audited_store(
        obj.conn, family, epoch=epoch, dry_run=dry_run, run_id=run_id, workers=workers
    )
    if _run_imports_airflow(family):
        # importing Airflow takes over the logging: import it now, not in the middle of the
        # run, and send the run's lines back to stderr, away from the summary on stdout
        import airflow.sdk  # noqa: F401

        obj.take_back_logging()
    progress = _progress() if sys.stderr.isatty() and not as_json else None
    workers = workers or max(1, min(family.shards, os.cpu_count() or 1))
    started = datetime.now(UTC)
    audited: list[str] = []

    def on_audit(ended: engine.RunOutcome) -> None:
        """The run's metrics, as the DAG sends them (whatever the outcome)."""
        audited.append(ended.outcome)
        health.emit_run_metrics(store, ended)
        obj.take_back_logging()  # importing Airflow's facade took over the logging

    try:
        with reported():
            ended = engine.run_family(
                store,
                at,
                run_id,
                dry_run=dry_run,
                progress=progress,
                workers=workers,
                on_audit=on_audit,
            )
    except click.ClickException as exc:
        if not audited:  # failed before (or while) writing its audit row: still count it
            plan = engine.RunPlan(family.name, run_id or "", at, None, (), dry_run=dry_run)
            failed = engine.RunOutcome(
                plan, "failed", started, family.kind.value, Tally(), message=exc.format_message()
            )
            health.emit_run_metrics(store, failed, clock=False)
            obj.take_back_logging()
        raise
    if as_json:
        echo_json(ended.summary())
    else:
        _print_summary(ended)


def _run_imports_airflow(family: Family) -> bool:
    """Whether this process imports Airflow during the run: to send its metrics through
    Airflow's facade (``metrics.airflow_configured``), or to open the GX results store or the
    archive with a connection's credentials (``ObjectStoragePath``). Elsewhere the run does not
    (a local store is opened as a ``UPath``), and importing Airflow would cost the run ~2 CPU-s."""
    return (
        metrics.airflow_configured()
        or bool(os.environ.get(evidence.RESULTS_CONN_ENV))
        or family.archive_conn_id is not None
    )


def _progress() -> Callable[[str], None]:
    def say(message: str) -> None:
        click.echo(f"  .. {message}", err=True)

    return say


def _print_summary(ended: engine.RunOutcome) -> None:
    data = ended.summary()
    click.echo(f"{data['family']}: {data['outcome']} (run {data['run_id']})")
    if ended.message:
        click.echo(f"  {ended.message}")
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


@click.command("read")
@click.option("--family", "name", required=True)
@click.option("--json", "as_json", is_flag=True)
@click.argument("counters", nargs=-1, required=True)
@pass_context
def read_command(obj: Context, name: str, as_json: bool, counters: tuple[str, ...]) -> None:
    """Read counters: compact value + increments newer than its epoch.

    \b
    A composite key is written with '/' between its parts, e.g. 7/2026-11-22.
    """
    from ..client import CounterClient

    family = obj.family(name)
    client = CounterClient(obj.conn, family)
    with reported():
        values = client.read_many(counter_keys(client.store, counters))
    if as_json:
        echo_json(
            [
                {
                    "counter": format_key(v.counter),
                    "value": v.value,
                    "compact_value": v.compact_value,
                    "epoch": to_text(v.epoch),
                    "newer_sum": v.newer_sum,
                }
                for v in values
            ]
        )
        return
    for v in values:
        epoch = to_text(v.epoch) or "-"
        click.echo(
            f"{format_key(v.counter)}\t{v.value}\t(compact {v.compact_value} @ {epoch} "
            f"+ newer {v.newer_sum})"
        )


@click.command("health")
@click.option("--family", "names", multiple=True, help="Only these families (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print every family's lag as JSON.")
@pass_context
def health_command(obj: Context, names: tuple[str, ...], as_json: bool) -> None:
    """The status command: every family's lag against its freshness limit.

    \b
    `counterctl health` is the status command, for a person or a watchdog outside Airflow.
    The lag is now - the family's lag - its compacted epoch, read from Cassandra (the
    counters_freshness DAG's rule): fresh, late (past half the limit) or stale (past it);
    never before the first run. "now" is the cluster's time (a coordinator's), and each line
    shows this host's clock offset from it: compaction refuses a host off by more than a
    quarter of the family's lag. Without --family it also lists the families the cluster
    knows in the YAML's keyspaces that the YAML does not hold (no DAG compacts them):
    unconfigured, unless retired (`counterctl retire`). Exit code 0 when every family is
    fresh or late, 8 when one is stale, was never compacted or is unconfigured, or when this
    host's clock is off by more than a family allows (5/6 when Cassandra does not answer; 2
    when the YAML does not load), so a cron job, a Kubernetes probe or a monitoring check
    sees compaction stop even when the scheduler (which runs the freshness DAG) is down.
    Sends each family's gauges (compacted epoch, lag, limit, quarantined counters, clock
    offset) where Airflow's metrics are configured.
    """
    families = [obj.family(n) for n in names] if names else list(obj.catalog.families)
    with reported():
        clock = obj.conn.cluster_clock()
        now = clock.now()
        lags = health.read_lags((Store(obj.conn, f) for f in families), now, clock.offset)
        missing, unread = (
            ([], [])
            if names
            else health.read_unconfigured(obj.conn, families, (), str(obj.catalog.path))
        )
    if metrics.airflow_configured():
        # importing Airflow takes over the logging: take it back before any metric is sent
        # (a warning of the metrics' must reach stderr, away from the output on stdout)
        import airflow.sdk  # noqa: F401

        obj.take_back_logging()
    for lag in lags:
        metrics.emit_family(
            lag.family.name,
            lag.epoch,
            stale_after=health.stale_after(lag.family),
            quarantined=partial(health.quarantined_now, Store(obj.conn, lag.family)),
            now=now,
            clock_offset=clock.offset.seconds,
        )
    obj.take_back_logging()  # importing Airflow's facade took over the logging
    late = [lag.family.name for lag in health.unhealthy(lags)]
    bad = late + [u.name for u in missing if not u.healthy] + unread
    skewed = [lag.family.name for lag in lags if lag.clock_refused]
    if as_json:
        echo_json([lag.as_dict() for lag in lags] + [u.as_dict() for u in missing])
    else:
        click.echo(f"clock: this host is {clock.offset.describe()}")
        for lag in lags:
            click.echo(lag.line())
        for found in missing:
            click.echo(found.line())
        for problem in unread:
            click.echo(f"! {problem}")
        click.echo(
            f"{len(lags) - len(late)} of {len(lags)} "
            f"famil{'y' if len(lags) == 1 else 'ies'} within their freshness limit"
            + (f"; unhealthy: {', '.join(bad)}" if bad else "")
            + (
                f"; this host's clock is too far off to compact: {', '.join(skewed)}"
                if skewed
                else ""
            )
        )
    if bad or skewed:
        raise SystemExit(EXIT_UNHEALTHY)


@click.command("demo-writer", hidden=True)
@click.option("--family", "names", multiple=True, help="Only these families (default: all).")
@click.option("--rate", default=20.0, show_default=True, help="Increments per second per family.")
@click.option("--counters", default=50, show_default=True, help="Distinct counters per family.")
@click.option("--duration", default=0.0, help="Stop after this many seconds (0: until signalled).")
@pass_context
def demo_writer_command(
    obj: Context, names: tuple[str, ...], rate: float, counters: int, duration: float
) -> None:
    """Keep appending increments to the demo families until SIGINT/SIGTERM."""
    from ..demo import write_forever

    families = [obj.family(n) for n in names] if names else list(obj.catalog.families)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with reported():
        written = write_forever(obj.conn, families, rate, counters, stop, duration or None)
    click.echo(f"demo writer stopped after {written} increments", err=True)
