"""Operator commands on counters: reset, reshard, reconcile, recount, quarantine."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import click

from .. import engine
from ..config import Family
from ..core import format_key, to_text

if TYPE_CHECKING:
    from ..recount import RecountReport
    from ..reshard import Resharded, ReshardPlan
from ..store import Store
from .common import (
    Context,
    Failure,
    audited_store,
    can_confirm,
    confirm,
    counter_keys,
    echo_json,
    parse_time_option,
    pass_context,
    reported,
)


@click.command("reset")
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
    moment = parse_time_option(at, "--at")
    if not dry_run:
        can_confirm(yes, f"reset of {counter} (family {family.name})")
    store = audited_store(obj.conn, family)
    with reported():
        (key,) = counter_keys(store, [counter])
        try:
            plan = engine.plan_reset(store, key, moment, reset_id)
            if dry_run:
                _print_reset(family, plan, as_json, dry_run=True)
                return
            if not plan.already_done:
                confirm(
                    yes,
                    f"{family.name}: reset {format_key(key)} from {plan.value_before} to 0 at "
                    f"{to_text(plan.at)} ({plan.rows_deleted} raw row(s) consumed)?",
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
                "at": result.at,
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
            f"{family.name}: {format_key(result.counter)} at {to_text(result.at)}: {what} "
            f"(id {result.reset_id}; dry run, nothing changed)"
        )
        return
    state = "already done" if result.already_done else f"was {result.value_before}"
    click.echo(
        f"{family.name}: {format_key(result.counter)} reset to 0 at {to_text(result.at)} "
        f"({state}; {result.rows_deleted} raw row(s) consumed; id {result.reset_id})"
    )


FINISHING = " (finishing the reshard under way)"


def _reshard_json(plan: ReshardPlan, done: Resharded | None) -> dict[str, object]:
    """``reshard --json``: one key set with and without ``--dry-run`` (the plan, then what
    moved: nothing, in a dry run)."""
    moved = {"checkpoints_moved": 0, "records_moved": 0, "quarantined_moved": 0, "marks_moved": 0}
    if done is not None:
        moved = {key: getattr(done, key) for key in moved}
    return {**asdict(plan), "dry_run": done is None, **moved}


@click.command("reshard")
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
    from ..reshard import plan_reshard, reshard

    family = obj.family(name)
    if not dry_run:
        can_confirm(yes, f"reshard of family {family.name}")
    store = Store(obj.conn, family)
    with reported():
        try:
            plan = plan_reshard(store, shards)
            if dry_run:
                if as_json:
                    echo_json(_reshard_json(plan, None))
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
        echo_json(_reshard_json(plan, done))
        return
    click.echo(
        f"{family.name}: {done.shards_before} -> {done.shards_after} shard(s): "
        f"{done.checkpoints_moved} checkpoint(s), {done.records_moved} record(s) of counted keys, "
        f"{done.quarantined_moved} quarantine entr(ies), {done.marks_moved} index mark(s) moved. "
        f"Set 'shards: {done.shards_after}' in the YAML."
    )


@click.command("reconcile")
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
    store = audited_store(obj.conn, family)
    with reported():
        found = engine.reconcile(store, repair=repair)
    if as_json:
        echo_json(
            [
                {
                    "counter": format_key(d.counter),
                    "expected": d.expected,
                    "counted": d.counted,
                    "difference": d.difference,
                    "repaired": d.repaired,
                }
                for d in found
            ]
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


@click.command("recount")
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
    commit's recorded value must follow from the one before. A counter whose last commit's
    rows are archived in a file the archive's retention removed (its evidence expired), or in
    a file of a run before --from, cannot be rebuilt: it is listed as such, not as a
    difference. Exit code 0 when every counter equals the compact table, 7 on any difference
    or changed file, 9 when no counter differs but some cannot be rebuilt, 2 for a family
    without an archive. Examples:
      counterctl recount --family trades IBM
      counterctl recount --family trades --from 2026-11-01 --to 2026-12-01
    """
    from ..recount import recount

    family = obj.family(name)
    low, high = parse_time_option(since, "--from"), parse_time_option(until, "--to")
    if low and high and low >= high:
        raise Failure(f"--from ({since}) must be before --to ({until})", 2)
    store = Store(obj.conn, family)
    with reported():
        keys = counter_keys(store, counters)
        report = recount(store, keys or None, low, high)
    if as_json:
        echo_json(report.as_dict())
    else:
        _print_recount(report, every=bool(counters))
    if not report.ok:
        raise SystemExit(7)
    if report.cannot_rebuild:
        raise SystemExit(9)


def _print_recount(report: RecountReport, every: bool) -> None:
    """Each counter asked for (or, for the whole family, each that differs or cannot be
    rebuilt) and a summary."""
    shown = report.counters if every else report.differences + report.cannot_rebuild
    for r in shown:
        if r.status == "cannot_rebuild":
            click.echo(
                f"{format_key(r.counter)}\tcannot rebuild\tcompact {r.expected}\t{r.cannot_rebuild}"
            )
            continue
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
    if report.cannot_rebuild:
        verdict = (
            f"{len(report.cannot_rebuild)} counter(s) cannot be rebuilt (evidence expired or "
            "before the window), " + ("no other difference" if report.ok else verdict)
        )
    click.echo(
        f"{report.family}: {len(report.counters)} counter(s) recounted from {report.files} "
        f"archive file(s) ({report.pruned} past the retention, {report.duplicates} row(s) "
        f"in two files): {verdict}"
    )


@click.command("quarantine")
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
    store = audited_store(obj.conn, family)
    with reported():
        for text in releases:
            (key,) = counter_keys(store, [text])
            try:
                engine.release(store, key)
            except engine.EngineError as exc:
                raise Failure(str(exc), 2) from exc
            click.echo(f"{family.name}: released {text}")
        held = engine.quarantined(store)
    if as_json:
        echo_json(
            [
                {
                    "counter": format_key(q.counter),
                    "reason": q.reason,
                    "run_id": q.run_id,
                    "detail": q.detail,
                }
                for q in held
            ]
        )
        return
    for q in held:
        click.echo(f"{format_key(q.counter)}\t{q.reason}\t{q.run_id}\t{q.detail}")
    click.echo(f"{family.name}: {len(held)} counter(s) quarantined")
