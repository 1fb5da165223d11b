"""Build the DAGs from the families YAML: one ``compact_<family>`` DAG each, plus freshness.

Parsing is cheap and does no I/O beyond reading the YAML: no Cassandra, no Variables, no GX
(tasks import what they need when they run). A broken family entry does not stop the others:
``family_dags`` builds the good ones and ``check_config`` (its own DAG file) raises one import
error naming every broken entry.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeAlias

from airflow.sdk import (
    DAG,
    BaseOperator,
    ExceptionRetryPolicy,
    Param,
    RetryAction,
    RetryRule,
    XComArg,
    get_current_context,
    get_parsing_context,
    task,
)
from airflow.sdk.exceptions import AirflowSkipException

from ..config import (
    BrokenEntry,
    ConfigError,
    Family,
    broken_entries,
    config_path,
    load_families_leniently,
)
from ..core.codec import encode
from . import assets, metadata
from .alerting import FAILING
from .notifiers import Channels, CountersAlertNotifier, notify_recovery
from .pool import pool_name

if TYPE_CHECKING:  # the engine's types: imported when a task runs (``_tasks``), not to parse
    from ..compaction.outcome import RunSummaryJson
    from ..core.codec import Encoded
    from ..engine import CleanupReport, RunPlan, ShardReport, VerifiedRun
    from .tasks import FreshnessSummary

log = logging.getLogger(__name__)

FRESHNESS_DAG_ID = "counters_freshness"
FRESHNESS_SCHEDULE = "*/5 * * * *"

PlanPayload: TypeAlias = "Encoded[RunPlan]"
"""The run's ``RunPlan`` as it crosses XCom (``core.codec``: pushed by ``run`` as XCom ``run``);
each later task reads it back with ``tasks.received_plan``. Airflow's own serde would need
``counters.*`` in ``allowed_deserialization_classes`` and writes naive datetimes in the host's
local time: one explicit codec instead. Every step's value crosses the same way
(``Encoded[T]``, read back with ``decode(T, ...)``)."""


def _tasks() -> ModuleType:
    """The task bodies, imported when a task runs: they import the engine and the Cassandra
    driver (about 0.2 s), which parsing the DAG files does not need."""
    from . import tasks

    return tasks


def _runtask() -> ModuleType:
    """The ``run`` task's body (``runtask``), imported when it runs, as ``_tasks``."""
    from . import runtask

    return runtask


DEFAULT_START_DATE = datetime(2026, 11, 1, tzinfo=UTC)
"""Where the schedule of the freshness and example DAGs starts, and that of a family without a
``start_date`` of its own (where it starts catching up, with ``catchup: true``)."""

FIRST_TASK = "run"
"""The first task of every run: it plans the run, ends a run with nothing to do, and does a
small run (most minutes) start to end itself; a larger run goes on in the mapped tasks."""

RETRIES = 3
RETRIES_ENV = "COUNTERS_TASK_RETRIES"
"""How many times a task that failed on a transient error (a Cassandra timeout) is tried
again; default ``RETRIES``."""
RETRY_DELAY = timedelta(seconds=20)
RETRY_BACKOFF = 2.0
MAX_RETRY_DELAY = timedelta(minutes=5)
LEASE_RETRY_DELAY = timedelta(seconds=60)
TASK_TIMEOUT = timedelta(minutes=30)

# Failures a retry cannot fix fail at once (checks, refused rows and bad config raise
# AirflowFailException subclasses anyway; this also covers engine errors that escape).
# A held lease is retried after a minute; anything else (Cassandra timeouts, unavailable
# nodes) gets the task's retries with exponential backoff.
RETRY_POLICY = ExceptionRetryPolicy(
    rules=[
        RetryRule(
            exception=[
                "counters.errors.ChecksFailed",
                "counters.errors.EpochInFuture",
                "counters.schema.SchemaError",
                "counters.config.ConfigError",
            ],
            action=RetryAction.FAIL,
            reason="not transient: retrying cannot fix it",
        ),
        RetryRule(
            exception="counters.errors.LeaseHeld",
            action=RetryAction.RETRY,
            retry_delay=LEASE_RETRY_DELAY,
            reason="another run holds the shard's lease",
        ),
    ]
)


def pool() -> str:
    """The pool of ``run``, ``compact`` and ``cleanup`` (created if missing: ``pool.py``)."""
    return pool_name()


def retries() -> int:
    """The tasks' retries (``COUNTERS_TASK_RETRIES``, else ``RETRIES``)."""
    text = os.environ.get(RETRIES_ENV)
    if text is None or not text.strip():
        return RETRIES
    if not text.strip().isdigit():
        raise ValueError(f"{RETRIES_ENV} must be a whole number of retries, got {text!r}")
    return int(text)


def _start_date(family: Family) -> datetime:
    return family.start_date or DEFAULT_START_DATE


def _columns(family: Family) -> str:
    cols = family.columns
    parts = [f"key `{', '.join(cols.key)}`", f"time `{cols.time}`"]
    value = family.rules.value_column
    if value is not None:
        parts.append(f"{value} `{getattr(cols, value)}`")
    return ", ".join(parts)


def doc_md(family: Family, channels: Channels) -> str:
    """The DAG's documentation in the UI: tables, lag, read rule, tasks, params, alerts."""
    cc = family.compact_columns
    deleted = family.effective_retention.value == "delete"
    rows = [
        ("raw table", f"`{family.keyspace}.{family.raw_table}` ({_columns(family)})"),
        (
            "compact table",
            f"`{family.keyspace}.{family.compact_table}` (value `{cc.value}`, epoch `{cc.epoch}`)",
        ),
        (
            "schedule",
            f"`{family.schedule}`, catchup {'on' if family.catchup else 'off'}, one run at a time",
        ),
        (
            "lag",
            f"{family.lag}: a run scheduled at T folds the rows with time <= T (to the "
            "minute) - lag",
        ),
        (
            "shards",
            f"{family.shards}: one `compact` and one `cleanup` task per token range; a small "
            "run (few touched counters, no sweep) does every phase of every shard in its "
            "first task, `run`",
        ),
        (
            "raw rows after folding",
            ("deleted (only after `verify` passed)" if deleted else "kept (business data)")
            + (
                f"; archived to Parquet first, in `{family.archive}`"
                + (
                    f" (kept {family.archive_retention.days} days)"
                    if family.archive_retention
                    else " (kept for good)"
                )
                + f": `counterctl recount --family {family.name}`"
                if family.archive
                else ""
            ),
        ),
        (
            "freshness",
            f"`{FRESHNESS_DAG_ID}` alerts when the compacted epoch is behind now - lag by "
            f"more than {family.freshness}",
        ),
        ("alerts", channels.describe()),
    ]
    table = "\n".join(["| | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows)])
    return f"""\
### Counter family `{family.name}` ({family.kind.value})

{family.description or ""}

{table}

**Read rule.** value = compact `{cc.value}` + sum of the raw rows newer than the compact
`{cc.epoch}`: `counterctl read --family {family.name} <counter>`.

**Tasks.** `run` plans the run (the epoch, and whether it sweeps the whole raw table): a run
whose epoch is not newer than the compacted epoch records a `noop`, one with nothing touched
and no sweep due an `idle` audit row, and the rest is skipped. A small run (few counters
touched, no sweep: most minutes) is then done start to end in `run` itself, every phase below
one after the other in one process (its log and its XCom `summary` give each phase's outcome,
`gx_result` in it where the GX result is stored; a failing phase fails it and audits as its
own task would), and the rest is skipped. A larger run goes on in the tasks below: `compact`
(per shard: fold, commit a bucket at a time in conditional batches, write the readers' copies,
recount on the server and quarantine any counter that does not add up) -> `verify` (the
conservation evidence, by the engine and the Great Expectations suite; its result stored, its
Data Docs page under Browse > Counter families) -> `cleanup` (per shard: delete exactly the
rows the commits counted, count what is left) -> `record_audit` (check that no counted row is
left, advance the compacted epoch, audit row; fails, and so alerts, when counters are
quarantined). Audit: `counterctl audit --family {family.name}`; quarantine:
`counterctl quarantine --family {family.name}`.

**Params.** `epoch`: fold up to this ISO time instead of the scheduled time minus the lag;
`dry_run`: compact without writing (audit `dry-run`).

**Backfill.** `airflow backfill create --dag-id {family.dag_id} --from-date 2026-11-22T09:00
--to-date 2026-11-22T09:10 --max-active-runs 1`: each run takes its epoch from its own logical
date, in order; runs whose epoch is already compacted are recorded no-ops (docs/airflow.md,
"Backfills").
"""


def default_args(family: Family, channels: Channels) -> dict[str, Any]:
    def audit_failure(context: Any) -> None:
        """A task that failed for good leaves the run's audit row (``tasks.record_failure``)."""
        _tasks().record_failure(family, context)

    return {
        "owner": family.owner,
        "retries": retries(),
        "retry_delay": RETRY_DELAY,
        "retry_exponential_backoff": RETRY_BACKOFF,
        "max_retry_delay": MAX_RETRY_DELAY,
        "retry_policy": RETRY_POLICY,
        "execution_timeout": TASK_TIMEOUT,
        "on_failure_callback": [CountersAlertNotifier(family.name, channels), audit_failure],
    }


def _all(mapped: Sequence[Any]) -> list[Any]:
    """A mapped task's results in one request (iterating probes one index past the end,
    which Airflow logs as an error), one list per task instance flattened."""
    return [report for reports in mapped[:] for report in reports]


def _label(shards: Sequence[int]) -> str:
    return ",".join(str(s) for s in shards)


def build_compaction_dag(family: Family, env: dict[str, str] | None = None) -> DAG:
    """The DAG of one family. With ``shard_tasks`` (the default): run -> compact[shards] ->
    verify -> cleanup[shards] -> record_audit (``run`` does a small run itself; the rest is
    skipped). Five tasks, the fewest that keep a large run's per-shard tasks: every task of a
    DAG gets a task instance row in every run, skipped or not. Without: ``run`` alone does
    every run whole, one task instance per run (docs/airflow.md, "The DAG's shape")."""
    channels = Channels.for_family(family, env)
    with _family_dag(family, channels) as dag:
        if family.shard_tasks:
            _shard_tasks(family, channels)
        else:
            FamilyRun(
                task_id=FIRST_TASK,
                family=family,
                channels=channels,
                whole=True,
                from_trigger=runs_from_trigger(env),
            )
    return dag


def _family_dag(family: Family, channels: Channels) -> DAG:
    """A family's DAG, without its tasks: schedule, one run at a time, the run's params."""
    return DAG(
        dag_id=family.dag_id,
        description=(family.description or f"Compact counter family {family.name}")[:200],
        schedule=family.schedule,
        start_date=_start_date(family),
        catchup=family.catchup,
        max_active_runs=1,
        tags=["counters", family.kind.value, *family.tags],
        doc_md=doc_md(family, channels),
        default_args=default_args(family, channels),
        params={
            "epoch": Param(
                None,
                type=["null", "string"],
                description="Fold rows up to this time (ISO 8601, UTC if no offset) instead "
                "of the run's scheduled time minus the lag.",
            ),
            "dry_run": Param(
                False, type="boolean", description="Compact without writing anything."
            ),
        },
    )


WARM_POOL_ENV = "COUNTERS_WARM_POOL"
TRIGGER_CLASS = "counters.airflow.trigger.FamilyRunTrigger"
TRIGGER_BACKSTOP = timedelta(minutes=30)
"""The trigger's timeout in Airflow: past it the task fails and is retried (the trigger hands
the run to a worker long before, ``trigger.pool_timeout``)."""


def runs_from_trigger(env: dict[str, str] | None = None) -> bool:
    """Whether the one-task DAGs' runs start from the trigger, in the warm pool
    (``$COUNTERS_WARM_POOL``: ``on``, the default; ``off``: every run on a worker, for a
    deployment without a triggerer)."""
    env = dict(os.environ) if env is None else env
    text = (env.get(WARM_POOL_ENV) or "on").strip().lower()
    if text not in ("on", "off"):
        raise ValueError(f"{WARM_POOL_ENV} must be 'on' or 'off', got {text!r}")
    return text == "on"


class FamilyRun(BaseOperator):
    """The ``run`` task of a family's DAG: plans the run (XCom ``run`` in the mapped shape) and
    does it whole when it is small, or always (``whole``: the one-task shape); returns the
    shard groups to map ``compact`` and ``cleanup`` over (none when done here; nothing in the
    one-task shape). A plain operator with no template fields, so a run writes no rendered
    fields (one execution-API request fewer than a ``@task``); the body is
    ``runtask.run_task``. A run done here that committed something updates the compact table's
    asset through the family's alias.

    ``from_trigger`` (the one-task shape, ``runs_from_trigger``): the task starts from the
    trigger, which runs a small run in the warm pool and ends the task there; a run it hands
    back resumes here in ``resume`` (``trigger``, ``runtask.resume_run``)."""

    template_fields: Sequence[str] = ()
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        family: Family,
        channels: Channels,
        whole: bool,
        from_trigger: bool = False,
        **kwargs: Any,
    ):
        super().__init__(
            pool=pool(),
            inlets=[assets.raw_asset(family)],
            outlets=[assets.compacted_alias(family)],
            **kwargs,
        )
        self.family = family
        self.channels = channels
        self.whole = whole
        if from_trigger:
            from airflow.triggers.base import StartTriggerArgs

            self.start_from_trigger = True
            self.start_trigger_args = StartTriggerArgs(
                trigger_cls=TRIGGER_CLASS,
                trigger_kwargs={"family": family.model_dump(mode="python")},
                next_method="resume",
                timeout=TRIGGER_BACKSTOP,
            )

    def execute(self, context: Any) -> list[list[int]] | None:
        return _runtask().run_task(self.family, self.channels, context, whole=self.whole)

    def resume(self, context: Any, event: dict[str, Any] | None = None) -> None:
        """A run the trigger handed back (``event``: the pool's outcome)."""
        _runtask().resume_run(self.family, self.channels, context, event or {})


def _shard_tasks(family: Family, channels: Channels) -> None:
    """``run``, then a large run's steps as their own tasks, mapped over shard groups."""
    raw, compacted = assets.raw_asset(family), assets.compact_asset(family)

    @task(pool=pool(), map_index_template="shards {{ shard_label }}")
    def compact(run: PlanPayload, shards: list[int]) -> list[Encoded[ShardReport]]:
        get_current_context()["shard_label"] = _label(shards)  # type: ignore[typeddict-unknown-key]
        tasks = _tasks()
        reports = tasks.compact(family, tasks.received_plan(run), shards)
        return [tasks.encode(report) for report in reports]

    @task(multiple_outputs=False)
    def verify(run: PlanPayload, reports: list[list[Encoded[ShardReport]]]) -> Encoded[VerifiedRun]:
        tasks = _tasks()
        found = [tasks.decode(tasks.ShardReport, report) for report in _all(reports)]
        return tasks.encode(tasks.verify(family, tasks.received_plan(run), found))

    @task(pool=pool(), map_index_template="shards {{ shard_label }}")
    def cleanup(
        run: PlanPayload, verified: Encoded[VerifiedRun], shards: list[int]
    ) -> list[Encoded[CleanupReport]]:
        get_current_context()["shard_label"] = _label(shards)  # type: ignore[typeddict-unknown-key]
        tasks = _tasks()
        found = tasks.decode(tasks.VerifiedRun, verified)
        reports = tasks.cleanup(family, tasks.received_plan(run), found, shards)
        return [tasks.encode(report) for report in reports]

    @task(inlets=[raw], outlets=[compacted], multiple_outputs=False)
    def record_audit(
        run: PlanPayload,
        verified: Encoded[VerifiedRun],
        cleanups: list[list[Encoded[CleanupReport]]],
    ) -> RunSummaryJson:
        """Checks the cleanup, then audits the run (one task: a task instance costs the
        scheduler more than these reads); skipped (no asset event) when it committed
        nothing. Returns the run's summary (``RunOutcome.summary``)."""
        context = get_current_context()
        tasks = _tasks()
        found = tasks.decode(tasks.VerifiedRun, verified)
        reports = [tasks.decode(tasks.CleanupReport, report) for report in _all(cleanups)]
        ended = tasks.finish(family, tasks.received_plan(run), found, reports)
        notify_recovery(family.name, channels, FAILING, context)
        if not ended.committed:
            raise AirflowSkipException("the run committed nothing: no compact-table event")
        context["outlet_events"][compacted].extra = ended.asset_extra()
        return ended.summary()

    # The wiring passes XComArgs where the task functions take values; Airflow types a
    # TaskFlow call with the function's own parameters, so these references are Any.
    first = FamilyRun(task_id=FIRST_TASK, family=family, channels=channels, whole=False)
    groups: Any = first.output
    run: Any = XComArg(first, key="run")
    reports: Any = compact.partial(run=run).expand(shards=groups)
    verified: Any = verify(run, reports)
    cleanups: Any = cleanup.partial(run=run, verified=verified).expand(shards=groups)
    record_audit(run, verified, cleanups)


FRESHNESS_TASK = "check_freshness"


def build_freshness_dag(
    families: list[Family],
    env: dict[str, str] | None = None,
    *,
    broken: Sequence[BrokenEntry] = (),
    config_problem: str | None = None,
) -> DAG:
    """``counters_freshness``: every 5 minutes, one task that checks every family (one task
    process, not one per family each parsing the whole DAG); a stale family alerts its own
    channels, and the task fails naming every stale family. It also looks in the YAML's
    keyspaces for families the cluster knows that the YAML does not load (``broken``: its
    entries that do not; ``config_problem``: why the whole file does not), which alert too:
    a typo in one entry removes that family's DAG, not its watch."""
    channels = {f.name: Channels.for_family(f, env) for f in families}
    config = str(config_path())
    with DAG(
        dag_id=FRESHNESS_DAG_ID,
        description="Alert when a counter family's compacted epoch falls behind now - lag",
        schedule=FRESHNESS_SCHEDULE,
        start_date=DEFAULT_START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["counters", "freshness"],
        doc_md="\n".join(
            [
                "### Freshness of the counter families",
                "",
                f"Every 5 minutes, one task (`{FRESHNESS_TASK}`) checks every family: a family "
                "whose compacted epoch is behind `now - lag` by more than its `freshness` (e.g. "
                "the scheduler stopped, the DAG is paused, or its runs keep failing) alerts its "
                "own channels (once, then reminders; a notice when it is fresh again), and the "
                "task fails naming every stale family. Its log has one line per family, its "
                "return value (XCom `freshness` when it fails) every family's state. A family "
                "that was never compacted is left alone. A family the cluster knows (its state "
                "or its tables' owners, in the keyspaces the YAML names) that the YAML does not "
                "load (missing, or its entry broken: it has no DAG) alerts its entry's own "
                "channels when they still validate, else the default ones (`COUNTERS_ALERT_*`), "
                "until it loads again; one removed on purpose is retired with `counterctl "
                "retire` first, then listed as retired.",
                "",
                "| family | lag | freshness | alerts |",
                "| --- | --- | --- | --- |",
                *(
                    f"| `{f.name}` | {f.lag} | {f.freshness} | {channels[f.name].describe()} |"
                    for f in families
                ),
                *(
                    f"| `{b.name or '?'}` | entry does not load | - | "
                    f"{Channels.for_alerts(b.alerts, env).describe()} |"
                    for b in broken
                ),
                *(
                    ["", f"**The families YAML does not load**: {config_problem}"]
                    if config_problem
                    else []
                ),
            ]
        ),
        default_args={"owner": "counters", "retries": 1, "retry_delay": timedelta(seconds=30)},
    ) as dag:
        # under the 5-minute schedule: a hung alert channel fails this run, not the next
        @task(
            task_id=FRESHNESS_TASK,
            retry_policy=RETRY_POLICY,
            execution_timeout=timedelta(minutes=4),
            multiple_outputs=False,
        )
        def check_freshness() -> Encoded[FreshnessSummary]:
            tasks = _tasks()
            return tasks.encode(
                tasks.check_freshness(
                    families,
                    channels,
                    get_current_context(),
                    broken=broken,
                    config=config,
                    config_problem=config_problem,
                )
            )

        check_freshness()
    return dag


METADATA_CLEANUP_DAG_ID = "counters_metadata_cleanup"
METADATA_CLEANUP_SCHEDULE = "17 3 * * *"
"""Daily, at a quiet minute (not on the hour, where other daily DAGs start)."""


def build_metadata_cleanup_dag() -> DAG:
    """``counters_metadata_cleanup``: daily, ``airflow db clean`` of the metadata older than
    ``$COUNTERS_METADATA_RETENTION_DAYS`` (default 14): minute runs of 100 families write about
    720k task-instance rows a day (five a run)."""
    with DAG(
        dag_id=METADATA_CLEANUP_DAG_ID,
        description="Delete Airflow metadata (runs, task instances, XComs, logs) past retention",
        schedule=METADATA_CLEANUP_SCHEDULE,
        start_date=DEFAULT_START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["counters", "maintenance"],
        doc_md=(
            "### Airflow metadata retention\n\n"
            "Daily: `airflow db clean --clean-before-timestamp <now - retention> --skip-archive "
            "--yes --error-on-cleanup-failure` over every metadata table (dag runs, task "
            "instances, XComs, logs, asset events, ...; Airflow keeps each DAG's latest "
            "scheduled run). Retention: `COUNTERS_METADATA_RETENTION_DAYS` (default 14). The "
            "task needs the metadata DB as the worker's host configures it (see docs/airflow.md, "
            "Metadata retention); where workers have no access, pause this DAG and run the same "
            "command on a schedule beside the scheduler."
        ),
        # a failed cleanup (its log says what the CLI said) is done by the next day's run
        default_args={"owner": "counters", "retries": 0},
    ) as dag:

        @task(multiple_outputs=False)
        def clean_metadata() -> Encoded[metadata.MetadataCleaned]:
            return encode(metadata.clean_metadata())

        clean_metadata()
    return dag


def metadata_cleanup_dags() -> dict[str, DAG]:
    """The maintenance DAG (nothing when a worker parses for another DAG)."""
    if get_parsing_context().dag_id not in (None, METADATA_CLEANUP_DAG_ID):
        return {}
    return {METADATA_CLEANUP_DAG_ID: build_metadata_cleanup_dag()}


EXAMPLE_FAMILY_ENV = "COUNTERS_EXAMPLE_FAMILY"
DEFAULT_EXAMPLE_FAMILY = "trades"


def example_dag_id(family: Family) -> str:
    return f"counters_example_after_{family.name}"


def build_example_downstream_dag(family: Family) -> DAG:
    """An example consumer: a DAG scheduled on the family's compact table (an Asset), which
    runs after each of the family's runs that committed something and reports what they
    folded (``triggering_asset_events``); idle runs do not start it."""
    compacted = assets.compact_asset(family)
    with DAG(
        dag_id=example_dag_id(family),
        description=f"Example: runs after family {family.name} was compacted",
        schedule=[compacted],
        start_date=DEFAULT_START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["counters", "example"],
        doc_md=f"""\
### Example: after `{family.name}` was compacted

Scheduled on the asset `{compacted.uri}` (the family's compact table), which
`{family.dag_id}` updates when a run committed something (not after an idle or a no-op run).
Replace this task with your own (an export, a report, a cache refresh): the triggering events'
`extra` name the runs, their epochs and what they folded. Other DAGs schedule on the same
asset with `schedule=[Asset("{compacted.uri}")]`.
""",
        default_args={"owner": family.owner, "retries": RETRIES, "retry_delay": RETRY_DELAY},
    ) as dag:

        @task(multiple_outputs=False)
        def report_compaction() -> Encoded[assets.CompactedRuns]:
            """Sum what the triggering runs folded (from the asset events' ``extra``)."""
            events = get_current_context()["triggering_asset_events"][compacted]
            summary = assets.CompactedRuns.of(family.name, (event.extra for event in events))
            log.info("%s compacted: %s", family.name, summary)
            return encode(summary)

        report_compaction()
    return dag


def example_dags() -> dict[str, DAG]:
    """The example consumer of ``$COUNTERS_EXAMPLE_FAMILY`` (default ``trades``), when the
    families YAML has that family (a team's own YAML without it gets no example DAG)."""
    name = os.environ.get(EXAMPLE_FAMILY_ENV) or DEFAULT_EXAMPLE_FAMILY
    try:
        families, _errors = _load()
    except ConfigError:
        return {}
    family = next((f for f in families if f.name == name), None)
    if family is None:
        return {}
    wanted = get_parsing_context().dag_id
    if wanted not in (None, example_dag_id(family)):
        return {}
    return {example_dag_id(family): build_example_downstream_dag(family)}


def _load() -> tuple[list[Family], dict[str, str]]:
    return load_families_leniently(config_path())


def family_dags() -> dict[str, DAG]:
    """The compaction DAGs of the good families (only the one a worker asks for, when
    Airflow parses to run a task). A file that cannot be read at all gives no DAGs here:
    ``check_config`` reports it."""
    try:
        families, _errors = _load()
    except ConfigError:
        return {}
    wanted = get_parsing_context().dag_id
    return {
        f.dag_id: build_compaction_dag(f)
        for f in sorted(families, key=lambda f: f.name)
        if wanted is None or wanted == f.dag_id
    }


def freshness_dags() -> dict[str, DAG]:
    """The freshness DAG, whatever the YAML holds: with the families that load, the entries
    that do not (their families are found in the cluster and alert), or, when the file does
    not load at all, none (its task then fails, alerting the default channels)."""
    wanted = get_parsing_context().dag_id
    if wanted not in (None, FRESHNESS_DAG_ID):
        return {}
    problem: str | None = None
    try:
        families, _errors = _load()
        broken = broken_entries(config_path())
    except ConfigError as exc:
        families, broken, problem = [], [], str(exc)
    return {
        FRESHNESS_DAG_ID: build_freshness_dag(
            sorted(families, key=lambda f: f.name), broken=broken, config_problem=problem
        )
    }


def check_config() -> None:
    """Raise one ``ConfigError`` naming every broken family entry (an import error in the UI)."""
    _families, errors = _load()
    if errors:
        names = ", ".join(sorted(errors))
        details = "\n".join(f"- {name}: {message}" for name, message in sorted(errors.items()))
        raise ConfigError(
            f"{len(errors)} counter famil{'y' if len(errors) == 1 else 'ies'} could not be "
            f"loaded from {config_path()} ({names}); the other families' DAGs are loaded.\n"
            f"{details}"
        )
