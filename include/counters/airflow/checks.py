"""The conservation rules of a run as a Great Expectations suite, with Data Docs per family.

The engine's ``verify_run`` evaluates the same rules in plain Python
(``core.evaluate_commit_checks``); GX runs them again over a DataFrame of the run's commit
records (one row per counter the run committed or cleaned up) and keeps the evidence: a
validation result and an HTML page per run.

Both must pass. GX and pandas are imported inside the functions: they cost seconds, and only the
``verify`` task needs them.
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

from ..core import CheckOutcome, CommitRecord, format_key, utc_naive

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
GX_DIR_ENV = "COUNTERS_GX_DIR"
GX_KEEP_ENV = "COUNTERS_GX_KEEP"
DEFAULT_KEEP = 200
"""Validation results (and their pages) kept per family; older ones are pruned each run."""

RECORD_COLUMNS = (
    "counter",
    "commit_id",
    "base_value",
    "folded_sum",
    "new_value",
    "new_epoch",
    "current_commit_id",
    "current_value",
    "current_epoch",
)
AMOUNT_COLUMNS = ("base_value", "folded_sum", "new_value")


def gx_root(family: str, base: str | os.PathLike[str] | None = None) -> Path:
    """The family's GX project folder: ``$COUNTERS_GX_DIR/<family>`` (default ``var/gx``).

    One project per family, so verify tasks of different families never write the same
    GX config file at once (one family's runs do not overlap: ``max_active_runs=1``).
    """
    root = Path(base or os.environ.get(GX_DIR_ENV) or PROJECT_ROOT / "var" / "gx")
    return root / family


# --- the frame --------------------------------------------------------------------------


def _epoch_value(value: Any) -> datetime | None:
    """Epochs are timestamps, or (rows families) time UUIDs: compare them by their time."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return utc_naive(value)
    if getattr(value, "version", None) == 1:
        from cassandra.util import datetime_from_uuid1

        return utc_naive(datetime_from_uuid1(value))
    raise TypeError(f"unexpected epoch value {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def records_frame(records: Sequence[CommitRecord]) -> pd.DataFrame:
    """One row per counter: the columns of ``CommitRecord`` plus derived ``same_commit`` (the
    compact row still carries this run's commit), ``expected_value`` (value before + sum
    folded) and ``total_drift`` (compact value now - value before - sum folded).

    Amounts become ``int64`` when every value is an integer; otherwise the column stays
    ``object`` and the "amounts are integers" expectation names the rows. Nullable amounts
    (``current_value``) stay Python ints in an ``object`` column: exact at any size.
    """
    import pandas as pd

    def ints(values: list[Any]) -> pd.Series:
        exact = all(_is_int(v) for v in values)
        return pd.Series(values, dtype="int64" if exact else "object")

    def epochs(values: list[Any]) -> pd.Series:
        return pd.Series([_epoch_value(v) for v in values], dtype="datetime64[ms]")

    def texts(values: list[Any]) -> pd.Series:
        return pd.Series([None if v is None else str(v) for v in values], dtype="object")

    frame = pd.DataFrame(
        {
            "counter": pd.Series([format_key(r.counter) for r in records], dtype="object"),
            "commit_id": texts([r.commit_id for r in records]),
            "base_value": ints([r.base_value for r in records]),
            "folded_sum": ints([r.folded_sum for r in records]),
            "new_value": ints([r.new_value for r in records]),
            "new_epoch": epochs([r.new_epoch for r in records]),
            "current_commit_id": texts([r.current_commit_id for r in records]),
            "current_value": pd.Series([r.current_value for r in records], dtype="object"),
            "current_epoch": epochs([r.current_epoch for r in records]),
        },
        columns=list(RECORD_COLUMNS),
    )
    # The compact row still carries the commit this run logged (else a later run moved on).
    frame["same_commit"] = pd.Series(
        [r.commit_id is not None and str(r.commit_id) == str(r.current_commit_id) for r in records],
        dtype="bool",
    )
    expected = [
        r.base_value + r.folded_sum if _is_int(r.base_value) and _is_int(r.folded_sum) else None
        for r in records
    ]
    frame["expected_value"] = ints(expected)
    # What readers see now minus what they saw before plus what was folded in, per counter.
    frame["total_drift"] = pd.Series(
        [
            cur - base - folded
            if same and _is_int(cur) and _is_int(base) and _is_int(folded)
            else None
            for same, cur, base, folded in zip(
                frame["same_commit"],
                [r.current_value for r in records],
                [r.base_value for r in records],
                [r.folded_sum for r in records],
                strict=True,
            )
        ],
        dtype="object",
    )
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
    """The suite. Every rule is critical: a failure fails the run before anything is deleted."""
    import great_expectations.expectations as gxe
    from great_expectations.expectations.row_conditions import Column

    # only the counters whose compact row still carries this run's commit
    same_commit = {"row_condition": Column("same_commit") == True}  # noqa: E712 (GX condition)

    def rule(check: str, description: str, expectation: Any, describe: str = "") -> Rule:
        expectation.meta = {"check": check}
        expectation.description = description
        expectation.severity = "critical"
        return Rule(check, description, expectation, describe)

    return [
        rule(
            "compact_row_present",
            "every counter the run logged has a compact row",
            gxe.ExpectColumnValuesToNotBeNull(column="current_commit_id"),
            "{counter}: compact row missing (expected value {new_value})",
        ),
        rule(
            "compact_value_equals_before_plus_folded",
            "the compact value is the value before plus the sum folded in",
            gxe.ExpectColumnPairValuesToBeEqual(
                column_A="current_value", column_B="new_value", **same_commit
            ),
            "{counter}: compact value {current_value} (expected {new_value} = "
            "{base_value} + {folded_sum})",
        ),
        rule(
            "compact_epoch_as_committed",
            "the compact epoch is the epoch the run committed",
            gxe.ExpectColumnPairValuesToBeEqual(
                column_A="current_epoch", column_B="new_epoch", **same_commit
            ),
            "{counter}: compact epoch {current_epoch} (expected {new_epoch})",
        ),
        rule(
            "logged_arithmetic_is_consistent",
            "the run's log adds up: new value = value before + sum folded",
            gxe.ExpectColumnPairValuesToBeEqual(column_A="new_value", column_B="expected_value"),
            "{counter}: logged {base_value} + {folded_sum} != {new_value}",
        ),
        rule(
            "epoch_never_regresses",
            "the epoch advanced: no compact epoch is older than the one this run committed",
            gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A="current_epoch",
                column_B="new_epoch",
                or_equal=True,
                ignore_row_if="either_value_is_missing",
            ),
            "{counter}: compact epoch {current_epoch} < {new_epoch}",
        ),
        *(
            rule(
                f"{column}_is_integer",
                f"{column} is a non-null integer (the engine refuses NULL increments)",
                expectation,
                "{counter}: " + column + " = {" + column + "}",
            )
            for column in AMOUNT_COLUMNS
            for expectation in (
                gxe.ExpectColumnValuesToNotBeNull(column=column),
                gxe.ExpectColumnValuesToBeOfType(column=column, type_="int64"),
            )
        ),
        rule(
            "family_total_conserved",
            "the family total readers see up to the epoch is unchanged: sum over the counters "
            "of (compact value now - value before - sum folded) is 0 (late rows folded in are "
            "reported separately)",
            gxe.ExpectColumnSumToBeBetween(
                column="total_drift", min_value=0, max_value=0, **same_commit
            ),
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
        lines.append(rule.describe.format(**row) if rule.describe else str(row["counter"]))
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
    if expectation_result.success:
        return CheckOutcome(rule.check, True, True, rule.description)
    counters = tuple(_failed_rows(frame, rule, result))
    if exception:
        detail = f"could not be evaluated: {exception}"
    elif "unexpected_count" in result:
        detail = f"{result['unexpected_count']} counter(s) fail: {rule.description}"
    else:
        detail = f"observed {result.get('observed_value')!r}: {rule.description}"
    return CheckOutcome(rule.check, False, True, detail, counters)


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def prune(root: Path, suite: str, keep: int) -> int:
    """Keep the newest ``keep`` validation results of ``suite`` (and their pages)."""
    store = root / "gx" / "uncommitted" / "validations" / suite
    site = root / "gx" / "uncommitted" / "data_docs" / "local_site" / "validations" / suite
    if not store.is_dir():
        return 0
    runs = sorted(
        (p for p in store.glob("*/*") if p.is_dir()), key=lambda p: (p.name, p.parent.name)
    )
    removed = 0
    for path in runs[: max(0, len(runs) - keep)]:
        relative = path.relative_to(store)
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(site / relative, ignore_errors=True)
        for parent in (path.parent, (site / relative).parent):
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        removed += 1
    return removed


def validate_records(
    family: str,
    run_id: str,
    records: Sequence[CommitRecord],
    *,
    base_dir: str | os.PathLike[str] | None = None,
    keep: int | None = None,
) -> SuiteReport:
    """Run the suite over the run's records in the family's file-mode GX project.

    Writes a validation result and updates the family's Data Docs (``index.html`` plus one page
    per run); keeps the newest ``keep`` results (``$COUNTERS_GX_KEEP``, default 200).
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    frame = records_frame(records)
    root = gx_root(family, base_dir)
    keep = keep if keep is not None else int(os.environ.get(GX_KEEP_ENV) or DEFAULT_KEEP)
    suite_name = f"counters_{family}"
    the_rules = rules()
    with _locked(root):
        context = gx.get_context(mode="file", project_root_dir=str(root))
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        source = context.data_sources.add_or_update_pandas(name="counters")
        asset = next((a for a in source.assets if a.name == "commit_records"), None)
        asset = asset or source.add_dataframe_asset(name="commit_records")
        batch = next((b for b in asset.batch_definitions if b.name == "run"), None)
        batch = batch or asset.add_batch_definition_whole_dataframe("run")
        suite = gx.ExpectationSuite(name=suite_name)
        for rule in the_rules:
            suite.add_expectation(rule.expectation)
        suite = context.suites.add_or_update(suite)
        definition = context.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=suite_name, data=batch, suite=suite)
        )
        checkpoint = context.checkpoints.add_or_update(
            gx.Checkpoint(
                name=suite_name,
                validation_definitions=[definition],
                actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs")],
                result_format={"result_format": "COMPLETE"},
            )
        )
        prune(root, suite_name, max(keep - 1, 0))
        run = checkpoint.run(
            batch_parameters={"dataframe": frame},
            run_id=gx.RunIdentifier(run_name=_safe(run_id), run_time=datetime.now(UTC)),
        )
        identifier, validation = next(iter(run.run_results.items()))
        pages = context.get_docs_sites_urls(resource_identifier=identifier)
    by_check = {rule.check: rule for rule in the_rules}
    outcomes = [
        _outcome(frame, by_check[result.expectation_config.meta["check"]], result)
        for result in validation.results
    ]
    merged = _merge_outcomes(outcomes)
    index_page = root / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    return SuiteReport(
        success=bool(validation.success),
        outcomes=merged,
        result=validation.to_json_dict(),
        docs_index=index_page if index_page.exists() else None,
        docs_page=(pages[0].get("site_url") if pages else None),
        statistics=dict(validation.statistics),
    )


def _merge_outcomes(outcomes: Sequence[CheckOutcome]) -> list[CheckOutcome]:
    """One outcome per check name (a check may be several expectations)."""
    merged: dict[str, CheckOutcome] = {}
    for outcome in outcomes:
        seen = merged.get(outcome.name)
        if seen is None or (seen.success and not outcome.success):
            merged[outcome.name] = outcome
    return list(merged.values())
