"""The conservation rules of a run as a Great Expectations suite, with Data Docs per family.

Before anything is deleted, the engine recounts on the server (``GROUP BY`` over each token
range) the raw rows each commit counted, reads the committed ledger rows and the readers'
copies back, and quarantines any counter that does not add up (``core.check_committed``). What
it found is kept per bucket as ``core.Evidence``: what the commits claim (rows and sum folded,
rows and sum counted) beside what Cassandra recounted, and what the readers' copies held before
the commit (read by key, not through the fold) and after it. GX validates those rows
(the same rules as ``core.evaluate_evidence``) and keeps the evidence: a validation result and
an HTML page per run.

GX and pandas are imported inside the functions: they cost seconds, and only the ``verify`` task
needs them.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import CheckOutcome, Evidence

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
GX_DIR_ENV = "COUNTERS_GX_DIR"
GX_KEEP_ENV = "COUNTERS_GX_KEEP"
DEFAULT_KEEP = 200
"""Validation results (and their pages) kept per family; older ones are pruned each run."""

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


def gx_root(family: str, base: str | os.PathLike[str] | None = None) -> Path:
    """The family's GX project folder: ``$COUNTERS_GX_DIR/<family>`` (default ``var/gx``).

    One project per family, so verify tasks of different families never write the same
    GX config file at once (one family's runs do not overlap: ``max_active_runs=1``).
    """
    root = Path(base or os.environ.get(GX_DIR_ENV) or PROJECT_ROOT / "var" / "gx")
    return root / family


# --- the frame --------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def evidence_frame(evidence: Sequence[Evidence]) -> pd.DataFrame:
    """One row per bucket the run committed to (``core.Evidence``), plus ``where`` (its shard
    and bucket, for messages) and ``drift`` (value change - sum folded).

    Amounts become ``int64`` when every value is an integer that fits; otherwise the column
    stays ``object`` (exact Python ints) and the "is an integer" expectation names the rows.
    """
    import pandas as pd

    def ints(values: list[Any]) -> pd.Series:
        exact = all(_is_int(v) and -(2**63) <= v < 2**63 for v in values)
        return pd.Series(values, dtype="int64" if exact else "object")

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
        expectation.meta = {"check": check, "critical": critical}
        expectation.description = description
        expectation.severity = "critical" if critical else "warning"
        return Rule(check, description, expectation, describe)

    return [
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
                expectation,
                "{where}: " + column + " = {" + column + "}",
            )
            for column in AMOUNT_COLUMNS
            for expectation in (
                gxe.ExpectColumnValuesToNotBeNull(column=column),
                gxe.ExpectColumnValuesToBeOfType(column=column, type_="int64"),
            )
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


# --- running it -------------------------------------------------------------------------


@dataclass
class SuiteReport:
    """What the suite found, as engine-style outcomes, plus the evidence."""

    success: bool
    outcomes: list[CheckOutcome]
    result: dict[str, Any]
    docs_index: Path | None = None
    docs_page: str | None = None
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


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_name(run_id: str) -> str:
    """The GX run name (and Data Docs folder) of an Airflow run id."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)


def prune(root: Path, suite: str, keep: int, slack: int = 0) -> int:
    """Keep the newest ``keep`` validation results of ``suite`` (and their pages), once there
    are more than ``keep + slack`` (pruning makes the index stale: it is then rebuilt, so it is
    done every ``slack`` runs, not every run)."""
    store = root / "gx" / "uncommitted" / "validations" / suite
    site = root / "gx" / "uncommitted" / "data_docs" / "local_site" / "validations" / suite
    if not store.is_dir():
        return 0
    runs = sorted(
        (p for p in store.glob("*/*") if p.is_dir()), key=lambda p: (p.name, p.parent.name)
    )
    removed = 0
    if len(runs) <= keep + slack:
        return 0
    for path in runs[: max(0, len(runs) - keep)]:
        relative = path.relative_to(store)
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(site / relative, ignore_errors=True)
        for parent in (path.parent, (site / relative).parent):
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        removed += 1
    return removed


INDEX_EVERY_ENV = "COUNTERS_GX_INDEX_EVERY_S"
DEFAULT_INDEX_EVERY_S = 600
"""How old the Data Docs index may get before a run rebuilds it (a failed run always does).
Each run stores its validation result and renders its own page (~0.25 CPU-s); the index lists
every kept result and costs more the more there are, so minute runs do not rebuild it."""


def _suite_fingerprint(the_rules: Sequence[Rule]) -> str:
    """Identifies the suite's expectations: the stored GX objects are rewritten only when it
    changes (a new version of the rules), not every run."""
    import hashlib
    import json

    text = json.dumps(
        [r.expectation.configuration.to_json_dict() for r in the_rules], sort_keys=True, default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _definition(context: Any, suite_name: str, the_rules: Sequence[Rule]) -> Any:
    """The family's validation definition, created (or rewritten) only when missing or when
    the rules changed: writing the GX objects costs more than validating."""
    import great_expectations as gx

    fingerprint = _suite_fingerprint(the_rules)
    try:
        definition = context.validation_definitions.get(suite_name)
        if (definition.suite.meta or {}).get("rules") == fingerprint:
            return definition
    except Exception:  # missing (first run) or unreadable: write it afresh
        pass
    source = context.data_sources.add_or_update_pandas(name="counters")
    asset = next((a for a in source.assets if a.name == "conservation_evidence"), None)
    asset = asset or source.add_dataframe_asset(name="conservation_evidence")
    batch = next((b for b in asset.batch_definitions if b.name == "run"), None)
    batch = batch or asset.add_batch_definition_whole_dataframe("run")
    suite = gx.ExpectationSuite(name=suite_name, meta={"rules": fingerprint})
    for rule in the_rules:
        suite.add_expectation(rule.expectation)
    suite = context.suites.add_or_update(suite)
    return context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=suite_name, data=batch, suite=suite)
    )


def _index_due(index_page: Path, every_s: float) -> bool:
    try:
        return datetime.now(UTC).timestamp() - index_page.stat().st_mtime >= every_s
    except OSError:
        return True


def validate_evidence(
    family: str,
    run_id: str,
    evidence: Sequence[Evidence],
    *,
    base_dir: str | os.PathLike[str] | None = None,
    keep: int | None = None,
    build_index: bool | None = None,
) -> SuiteReport:
    """Run the suite over the run's evidence in the family's file-mode GX project.

    Stores a validation result and renders its Data Docs page; rebuilds the index
    (``index.html``, every kept result) when the run failed, when ``build_index`` says so, or
    when it is older than ``$COUNTERS_GX_INDEX_EVERY_S`` (600 s). Keeps the newest ``keep``
    results (``$COUNTERS_GX_KEEP``, default 200).
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    frame = evidence_frame(evidence)
    root = gx_root(family, base_dir)
    keep = keep if keep is not None else int(os.environ.get(GX_KEEP_ENV) or DEFAULT_KEEP)
    every_s = float(os.environ.get(INDEX_EVERY_ENV) or DEFAULT_INDEX_EVERY_S)
    suite_name = f"counters_{family}"
    the_rules = rules()
    fingerprint = _suite_fingerprint(the_rules)  # before GX gives the expectations ids
    index_page = root / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    with _locked(root):
        context = gx.get_context(mode="file", project_root_dir=str(root))
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        definition = _definition(context, suite_name, the_rules)
        removed = prune(root, suite_name, max(keep - 1, 0), slack=keep // 10)
        validation = definition.run(
            batch_parameters={"dataframe": frame},
            result_format="COMPLETE",
            run_id=gx.RunIdentifier(run_name=run_name(run_id), run_time=datetime.now(UTC)),
        )
        identifier = _result_identifier(context, suite_name, validation)
        index = (
            build_index
            if build_index is not None
            else not validation.success or bool(removed) or _index_due(index_page, every_s)
        )
        context.build_data_docs(resource_identifiers=[identifier], build_index=index)
        pages = context.get_docs_sites_urls(resource_identifier=identifier)
    by_check = {rule.check: rule for rule in the_rules}
    outcomes = [
        _outcome(frame, by_check[result.expectation_config.meta["check"]], result)
        for result in validation.results
    ]
    merged = _merge_outcomes(outcomes)
    return SuiteReport(
        success=all(o.success for o in merged if o.critical),
        outcomes=merged,
        result=validation.to_json_dict(),
        docs_index=index_page if index_page.exists() else None,
        docs_page=(pages[0].get("site_url") if pages else None),
        statistics=dict(validation.statistics),
        fingerprint=fingerprint,
    )


def _result_identifier(context: Any, suite_name: str, validation: Any) -> Any:
    """The stored result's key (a validation definition's run returns the result, not it)."""
    run_name = validation.meta["run_id"].run_name
    keys = [
        k
        for k in context.validation_results_store.list_keys()
        if k.expectation_suite_identifier.name == suite_name and k.run_id.run_name == run_name
    ]
    return max(keys, key=lambda k: str(k.run_id.run_time))


def build_data_docs(family: str, base_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """Rebuild a family's whole Data Docs site (index and every kept page), e.g. before
    showing it; None when the family has no GX project yet."""
    root = gx_root(family, base_dir)
    if not (root / "gx").is_dir():
        return None
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx

    with _locked(root):
        gx.get_context(mode="file", project_root_dir=str(root)).build_data_docs()
    index_page = root / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    return index_page if index_page.exists() else None


def _merge_outcomes(outcomes: Sequence[CheckOutcome]) -> list[CheckOutcome]:
    """One outcome per check name (a check may be several expectations)."""
    merged: dict[str, CheckOutcome] = {}
    for outcome in outcomes:
        seen = merged.get(outcome.name)
        if seen is None or (seen.success and not outcome.success):
            merged[outcome.name] = outcome
    return list(merged.values())
