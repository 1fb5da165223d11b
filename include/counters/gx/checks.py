"""The conservation rules of a run as a Great Expectations suite, validated in memory.

Before anything is deleted, the engine recounts on the server (``GROUP BY`` over each token
range) the raw rows each commit counted, reads the committed ledger rows and the readers'
copies back, and quarantines any counter that does not add up (``core.check_committed``). What
it found is kept per bucket as ``core.Evidence``: what the commits claim (rows and sum folded,
rows and sum counted) beside what Cassandra recounted, and what the readers' copies held before
the commit (read by key, not through the fold) and after it. GX validates those rows
(the same rules as ``core.evaluate_evidence``); ``evidence.keep`` stores each run's result.

The suite and its validation definition live in an ephemeral (in-memory) GX context built once
per process: the preload builds it and validates once (``warm``) in the process that forks the
task processes, so a task only validates. No GX file project, no Data Docs per run: the UI
renders a run's page from its stored result when someone opens it.

GX and pandas are imported inside the functions: they cost seconds, and only the ``verify`` step
needs them.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..config import CHECKOUT
from ..core import CheckOutcome, Evidence

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

PROJECT_ROOT = CHECKOUT

EVIDENCE_COLUMNS = (
    "shard",
    "bucket",
    "counters",
    "rows_folded",
    "sum_folded",
    "value_delta",
    "pending_rows",
    "pending_sum",
    "recount_rows",
    "recount_sum",
    "late_arrivals",
    "quarantined",
    "readers_before",
    "readers_after",
)
AMOUNT_COLUMNS = (
    "sum_folded",
    "value_delta",
    "pending_sum",
    "recount_sum",
    "readers_before",
    "readers_after",
)


# --- the frame --------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def evidence_frame(evidence: Sequence[Evidence]) -> pd.DataFrame:
    """One row per bucket the run committed to (``core.Evidence``), plus ``where`` (its shard
    and bucket, for messages) and ``drift`` (value change - sum folded).

    Amounts become ``int64`` when every value is an integer that fits; otherwise the column
    stays ``object`` (exact Python ints) and the "is an integer" expectation names the rows.
    A value that is not an integer at all (None, a float, a bool) is held as its ``repr``: GX
    skips a null in a column-map expectation, and a text is never an ``int64``, so the one
    type expectation per column names a missing amount too (no not-null expectation beside it).
    """
    import pandas as pd

    def ints(values: list[Any]) -> pd.Series:
        if all(_is_int(v) and -(2**63) <= v < 2**63 for v in values):
            return pd.Series(values, dtype="int64")
        return pd.Series([v if _is_int(v) else repr(v) for v in values], dtype="object")

    rows = [e.as_dict() for e in evidence]
    frame = pd.DataFrame(
        {column: ints([r[column] for r in rows]) for column in EVIDENCE_COLUMNS},
        columns=list(EVIDENCE_COLUMNS),
    )
    frame["where"] = pd.Series(
        [f"shard {r['shard']} bucket {r['bucket']}" for r in rows], dtype="object"
    )
    frame["drift"] = ints([r["value_delta"] - r["sum_folded"] for r in rows])
    return frame


# --- the suite --------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One expectation, the check name it reports under, and how to describe a failed row."""

    check: str
    description: str
    expectation: Any
    describe: str = ""


def rules() -> list[Rule]:
    """The suite. Every rule but the quarantine count is critical: a failure fails the run
    before anything is deleted."""
    import great_expectations.expectations as gxe

    def rule(
        check: str, description: str, expectation: Any, describe: str = "", critical: bool = True
    ) -> Rule:
        expectation.meta = {"check": check, "critical": critical}  # "rule": its index, below
        expectation.description = description
        expectation.severity = "critical" if critical else "warning"
        return Rule(check, description, expectation, describe)

    the_rules = [
        rule(
            "value_change_equals_folded_sum",
            "in every bucket, the readers' copies (read by key before the commit, read back "
            "after it) moved by exactly the sum folded in",
            gxe.ExpectColumnPairValuesToBeEqual(column_A="value_delta", column_B="sum_folded"),
            "{where}: readers' copies moved by {value_delta} (from {readers_before} to "
            "{readers_after}), sum folded {sum_folded}",
        ),
        rule(
            "recount_equals_counted_rows",
            "the server's recount of the raw rows at or below the epoch finds exactly the rows "
            "the commits counted (late arrivals set aside)",
            gxe.ExpectColumnPairValuesToBeEqual(column_A="recount_rows", column_B="pending_rows"),
            "{where}: recount {recount_rows} row(s), commits counted {pending_rows}",
        ),
        rule(
            "recount_equals_counted_rows",
            "the server's recount sums to exactly what the commits counted",
            gxe.ExpectColumnPairValuesToBeEqual(column_A="recount_sum", column_B="pending_sum"),
            "{where}: recount sums to {recount_sum}, commits counted {pending_sum}",
        ),
        *(
            rule(
                f"{column}_is_integer",
                f"{column} is a non-null integer",
                gxe.ExpectColumnValuesToBeOfType(column=column, type_="int64"),
                "{where}: " + column + " = {" + column + "}",
            )
            for column in AMOUNT_COLUMNS
        ),
        rule(
            "family_total_conserved",
            "the family total readers see up to the epoch is unchanged: over all buckets, the "
            "value changes add up to the sum folded in",
            gxe.ExpectColumnSumToBeBetween(column="drift", min_value=0, max_value=0),
        ),
        rule(
            "no_counter_quarantined",
            "no counter was quarantined (a quarantined counter is kept out of compaction, none "
            "of its rows deleted, until an operator releases it; the run alerts)",
            gxe.ExpectColumnSumToBeBetween(column="quarantined", min_value=0, max_value=0),
            critical=False,
        ),
    ]
    for index, built in enumerate(the_rules):  # a result names its rule: checks share names
        built.expectation.meta["rule"] = index
    return the_rules


# --- running it -------------------------------------------------------------------------


@dataclass
class SuiteReport:
    """What the suite found, as engine-style outcomes, plus the evidence."""

    success: bool
    outcomes: list[CheckOutcome]
    result: dict[str, Any]
    """the validation result (``to_json_dict``): ``evidence.keep`` stores it, the UI renders
    its Data Docs page from it"""
    statistics: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = ""
    """the suite's fingerprint (``_suite_fingerprint``): audit rows name the suite with it"""

    def failure_lines(self) -> list[str]:
        return [
            f"{o.name}: {o.detail} [{'; '.join(o.counters[:5])}]"
            for o in self.outcomes
            if o.critical and not o.success
        ]


def _failed_rows(frame: pd.DataFrame, rule: Rule, result: dict[str, Any]) -> list[str]:
    indexes = result.get("unexpected_index_list") or []
    lines = []
    for index in indexes[:50]:
        row = frame.loc[index].to_dict()
        row = {k: ("-" if _missing(v) else v) for k, v in row.items()}
        lines.append(rule.describe.format(**row) if rule.describe else str(row["where"]))
    return lines


def _missing(value: Any) -> bool:
    try:
        import pandas as pd

        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _outcome(frame: pd.DataFrame, rule: Rule, expectation_result: Any) -> CheckOutcome:
    result = expectation_result.result or {}
    exception = (expectation_result.exception_info or {}).get("exception_message")
    critical = bool(rule.expectation.meta.get("critical", True))
    if expectation_result.success:
        return CheckOutcome(rule.check, True, critical, rule.description)
    counters = tuple(_failed_rows(frame, rule, result))
    if exception:
        detail = f"could not be evaluated: {exception}"
    elif "unexpected_count" in result:
        detail = f"{result['unexpected_count']} bucket(s) fail: {rule.description}"
    else:
        detail = f"observed {result.get('observed_value')!r}: {rule.description}"
    return CheckOutcome(rule.check, False, critical, detail, counters)


def run_name(run_id: str) -> str:
    """The GX run name (and stored folder's suffix) of an Airflow run id."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)


def _suite_fingerprint(the_rules: Sequence[Rule]) -> str:
    """Identifies the suite's expectations (a new version of the rules): audit rows name it."""
    import hashlib
    import json

    text = json.dumps(
        [r.expectation.configuration.to_json_dict() for r in the_rules], sort_keys=True, default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


QUIET_LOGGERS = ("great_expectations", "great_expectations.data_context.types.base")
"""Loggers held at WARNING: GX logs INFO lines as it is imported and per context, and every
task log line is handled three times (task process, supervisor file, the executor's stdout
copy). The second sets its own level as it is imported."""


@dataclass
class _Suite:
    """A family's validation definition in the process's context, and its rules."""

    definition: Any
    rules: list[Rule]
    fingerprint: str


@dataclass
class _Gx:
    """The process's ephemeral (in-memory) GX context: its pandas batch definition and each
    family's suite, built once per process (in the preload, for every forked task)."""

    context: Any
    batch: Any
    suites: dict[str, _Suite] = field(default_factory=dict)


_gx: _Gx | None = None
_building = threading.RLock()
"""One build of the context or of a family's suite at a time in a process: ``prepare`` builds
them in a thread beside the run, which validates in its own."""


def quiet() -> None:
    """No thread and no chatter: tqdm's monitor thread (started by the first progress bar,
    even a disabled one) would not survive a fork, and GX's INFO lines cost every task."""
    import importlib

    importlib.import_module("tqdm").tqdm.monitor_interval = 0  # tqdm ships no type stubs
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _context() -> _Gx:
    """The process's GX context: an ephemeral one writes no file, so nothing per run touches
    disk but the result ``evidence.keep`` stores."""
    global _gx
    with _building:
        if _gx is None:
            os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
            import great_expectations as gx
            from great_expectations.data_context.types.base import ProgressBarsConfig

            quiet()  # after the imports: one of GX's modules sets its logger's level

            context = gx.get_context(mode="ephemeral")
            context.variables.progress_bars = ProgressBarsConfig(globally=False)
            source = context.data_sources.add_pandas(name="counters")
            asset = source.add_dataframe_asset(name="conservation_evidence")
            _gx = _Gx(context, asset.add_batch_definition_whole_dataframe("run"))
        return _gx


def _suite(family: str) -> _Suite:
    """The family's suite (``counters_<family>``) and validation definition, built once per
    process; the rules are the same for every family, the name tells the results apart."""
    with _building:
        gx_state = _context()
        known = gx_state.suites.get(family)
        if known is not None:
            return known
        import great_expectations as gx

        the_rules = rules()
        fingerprint = _suite_fingerprint(the_rules)  # before GX gives the expectations ids
        name = f"counters_{family}"
        suite = gx.ExpectationSuite(name=name, meta={"rules": fingerprint})
        for rule in the_rules:
            suite.add_expectation(rule.expectation)
        suite = gx_state.context.suites.add(suite)
        definition = gx_state.context.validation_definitions.add(
            gx.ValidationDefinition(name=name, data=gx_state.batch, suite=suite)
        )
        gx_state.suites[family] = _Suite(definition, the_rules, fingerprint)
        return gx_state.suites[family]


def prepare(family: str) -> threading.Thread:
    """Build the context and ``family``'s suite in a thread of their own, started now:
    ``counterctl compact`` calls it once its shards are compacting in their processes, where
    its own process only waits. GX's import costs a process seconds of CPU; built here, the run
    no longer waits for it between its compact and cleanup steps. ``validate_evidence`` waits
    for the build (``_building``); an error here is left for it to raise. Join the thread
    before the process ends."""

    def build() -> None:
        try:
            _suite(family)
        except Exception:  # validate_evidence builds again, and raises it
            log.debug("GX suite of family %s not built ahead of the run", family, exc_info=True)

    thread = threading.Thread(target=build, name=f"gx-prepare-{family}", daemon=True)
    thread.start()
    return thread


WARM_UP_FAMILY = "warm-up"
"""The suite ``warm`` validates once under (no family's name: names have no ``-``)."""


def warm(families: Sequence[str] = ()) -> list[str]:
    """Build the context and validate one bucket of evidence, so a process forked afterwards
    (a task) finds GX ready, and build each of ``families``' suites (a task would spend about
    a twentieth of its run building its family's); returns the names of threads this left
    running (none expected: a forked child would not have them)."""
    before = {t.ident for t in threading.enumerate()}
    sample = Evidence(
        shard=0,
        bucket=0,
        counters=1,
        rows_folded=1,
        sum_folded=1,
        value_delta=1,
        pending_rows=1,
        pending_sum=1,
        recount_rows=1,
        recount_sum=1,
        late_arrivals=0,
        quarantined=0,
        readers_before=0,
        readers_after=1,
    )
    validate_evidence(WARM_UP_FAMILY, "warm_up", [sample])
    for family in families:
        _suite(family)
    return [t.name for t in threading.enumerate() if t.ident not in before]


def validate_evidence(family: str, run_id: str, evidence: Sequence[Evidence]) -> SuiteReport:
    """Run the family's suite over the run's evidence in the process's in-memory GX context.

    Nothing is written: the caller stores ``result`` (``evidence.keep``), from which the UI
    renders the Data Docs page when someone opens it.
    """
    suite = _suite(family)
    frame = evidence_frame(evidence)
    validation = _validate(suite, frame, run_id)
    outcomes = [
        _outcome(frame, suite.rules[result.expectation_config.meta["rule"]], result)
        for result in validation.results
    ]
    evaluated = {result.expectation_config.meta["rule"] for result in validation.results}
    if evaluated != set(range(len(suite.rules))):  # fail closed: a rule GX did not evaluate
        missing = sorted(set(range(len(suite.rules))) - evaluated)
        outcomes.append(
            CheckOutcome(
                "gx_suite_complete",
                False,
                True,
                f"GX evaluated {len(evaluated)} of the suite's {len(suite.rules)} rules; not "
                f"evaluated: {', '.join(suite.rules[i].check for i in missing)}",
            )
        )
    merged = _merge_outcomes(outcomes)
    return SuiteReport(
        success=all(o.success for o in merged if o.critical),
        outcomes=merged,
        result=validation.to_json_dict(),
        statistics=dict(validation.statistics),
        fingerprint=suite.fingerprint,
    )


_one_validation = threading.Lock()


@contextmanager
def _configurations_kept() -> Iterator[None]:
    """While one validation runs, each expectation's ``configuration`` built once, not each
    time GX asks: GX's property rebuilds it from the pydantic model on every read (``dict()``,
    a regex per read, a new ``ExpectationConfiguration``), ~90 reads per expectation per
    validation, about half of it. The expectations GX validates are built for this validation
    and only read; each is held until the validation ends (so no id is reused). One
    validation at a time in a process (the lock): the swap is GX's class attribute."""
    from great_expectations.expectations.expectation import Expectation

    with _one_validation:
        built = Expectation.__dict__["configuration"]
        kept: dict[int, tuple[Any, Any]] = {}

        def configuration(self: Any) -> Any:
            held = kept.get(id(self))
            if held is None:
                held = kept[id(self)] = (self, built.fget(self))
            return held[1]

        # GX types it a read-only property of its own; ours returns the same objects
        Expectation.configuration = property(configuration)  # type: ignore[assignment,method-assign]
        try:
            yield
        finally:
            Expectation.configuration = built  # type: ignore[method-assign]


def _validate(suite: _Suite, frame: pd.DataFrame, run_id: str) -> Any:
    """What GX's ``ValidationDefinition.run`` does, less its round trip through the context's
    stores each run: it re-reads and compares the suite and the definition (``is_fresh``), then
    serializes the result into the in-memory results store, which had to be emptied again. Both
    were built in this process and never change; ``evidence.keep`` stores the result. That was
    5-20 % of a validation (measured, on a loaded machine). The result and its ``meta`` are
    those ``run`` returns (``tests/dags/test_checks_suite.py`` compares them)."""
    import great_expectations as gx
    from great_expectations.constants import DATAFRAME_REPLACEMENT_STR
    from great_expectations.validator.v1_validator import Validator

    definition = suite.definition
    validator = Validator(
        batch_definition=definition.batch_definition,
        batch_parameters={"dataframe": frame},
        result_format="COMPLETE",
    )
    with _configurations_kept():
        result = validator.validate_expectation_suite(definition.suite, None)
    run = gx.RunIdentifier(run_name=run_name(run_id), run_time=datetime.now(UTC))
    result.meta["validation_id"] = definition.id
    result.meta["checkpoint_id"] = None
    result.meta["run_id"] = run
    result.meta["validation_time"] = run.run_time
    result.meta["batch_parameters"] = {"dataframe": DATAFRAME_REPLACEMENT_STR}
    return result


def _merge_outcomes(outcomes: Sequence[CheckOutcome]) -> list[CheckOutcome]:
    """One outcome per check name (a check may be several expectations)."""
    merged: dict[str, CheckOutcome] = {}
    for outcome in outcomes:
        seen = merged.get(outcome.name)
        if seen is None or (seen.success and not outcome.success):
            merged[outcome.name] = outcome
    return list(merged.values())
