"""The ``run`` task of a family's DAG: on a worker (``run_task``) and when the trigger hands a
run back to a worker (``resume_run``, the task's ``next_method``).

Both do a run with the task bodies of :mod:`counters.airflow.tasks` (``plan``, then
``whole_run``), as the warm pool does (:mod:`counters.airflow.warmpool`); what is here is the
task's own: the XComs it pushes, the asset event through the family's alias, the failing
streak it closes, and how an outcome of the pool fails the task or is redone here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.sdk.exceptions import AirflowSkipException

from ..config import Family
from ..core.codec import decode, encode
from . import assets
from .alerting import FAILING
from .errors import CheckFailed
from .notifiers import Channels, notify_recovery
from .poolrun import PoolOutcome
from .tasks import plan, provenance, remember_plan, scheduled_time, whole_run

log = logging.getLogger(__name__)


def run_task(
    family: Family, channels: Channels, context: Mapping[str, Any], *, whole: bool
) -> list[list[int]] | None:
    """The ``run`` task on a worker: plan the run, then do it here when it is small, or always
    (``whole``: the one-task shape); returns the shard groups to map ``compact`` and
    ``cleanup`` over (none when done here; nothing at all in the one-task shape). A run that
    ended without failing closes the family's failing streak; one that committed something
    updates the compact table's asset (through the family's alias). XComs: ``summary`` of a
    run done here; ``run`` (the plan) only where mapped tasks read it."""
    dag_run, params, ti = context["dag_run"], context["params"], context["ti"]
    try:
        run = plan(
            family,
            run_id=dag_run.run_id,
            scheduled=scheduled_time(dag_run),
            epoch=params.get("epoch"),
            dry_run=bool(params.get("dry_run")),
            started_by=provenance(dag_run, params),
        )
    except AirflowSkipException:  # noop or idle: the run ended without failing
        notify_recovery(family.name, channels, FAILING, context)
        raise
    remember_plan(family, run, int(ti.try_number or 0))
    if not whole:
        ti.xcom_push("run", encode(run))
        if not run.small:
            return [list(group) for group in run.shard_groups]
    ended = whole_run(family, run, any_size=whole)
    asset = ended.asset_extra() if ended.committed else None
    run_done(family, channels, context, ended.summary(), asset)
    return None if whole else []


def run_done(
    family: Family,
    channels: Channels,
    context: Mapping[str, Any],
    summary: Mapping[str, Any],
    asset: Mapping[str, Any] | None,
) -> None:
    """The end of a run that committed (here or in the warm pool): the XCom ``summary``, the
    failing streak closed and, when it committed something, the compact table's asset event
    (``asset``: its ``extra``, ``RunOutcome.asset_extra``) through the family's alias."""
    context["ti"].xcom_push("summary", dict(summary))
    notify_recovery(family.name, channels, FAILING, context)
    if asset is not None:
        alias = assets.compacted_alias(family)
        context["outlet_events"][alias].add(assets.compact_asset(family), extra=dict(asset))


def resume_run(
    family: Family, channels: Channels, context: Mapping[str, Any], event: Mapping[str, Any]
) -> None:
    """A run the trigger handed back to this worker (``event``: the warm pool's outcome,
    ``poolrun.PoolOutcome``). A run the pool committed or stopped (noop, idle) while the
    family's failing streak was open is ended here as the ``run`` task ends it (the streak
    closed with its notice; the XCom and asset event of a commit; a stop skips the task). A
    check that failed or counters quarantined in the pool were audited there: the task fails
    as the step would have failed it (at once, its alerts and streak as on a worker; no second
    audit row). Anything else (a large run, an error, no answer in time, a pool process that
    died) is done here, as the ``run`` task does a run: its retries, its failure callback's
    audit row and its alerts hold unchanged."""
    outcome = decode(PoolOutcome, event)
    log.info(
        "family %s: run handed back by the trigger (%s): %s",
        family.name,
        outcome.outcome,
        outcome.message,
    )
    if outcome.outcome == "success":
        run_done(family, channels, context, outcome.summary or {}, outcome.asset)
        return
    if outcome.outcome == "stopped":
        notify_recovery(family.name, channels, FAILING, context)
        raise AirflowSkipException(outcome.message)
    if outcome.outcome == "failed":
        raise CheckFailed(
            outcome.message, checks=outcome.checks, counters=outcome.counters, audited=True
        )
    run_task(family, channels, context, whole=True)
