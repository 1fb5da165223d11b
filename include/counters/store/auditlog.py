"""The audit trail's reads and writes: a family's rows in month partitions, read across them.

``counters_audit_by_month`` keeps a family's rows in one partition per month
(``PRIMARY KEY ((family, month), started_at, run_id)``), so a row a minute stays at ~44,640
rows a partition however many years the family runs. ``counters_audit_months`` lists the months
a family has rows in; every read walks those partitions newest first with the same limits as
before (``status.MAX_PAGE`` rows a request), and an export streams them page by page.

Versions before kept a family's whole trail in one partition of ``counters_audit``;
``upgrade`` moves those rows (``counterctl init`` calls it).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from cassandra.query import UNSET_VALUE

from .. import schema
from ..audit import MAP_COLUMNS, Action, month_of, month_overlaps, stamped
from ..core import EARLIEST, from_text, to_micros, utc_naive
from .statements import Cql, declare

if TYPE_CHECKING:
    from ..audit import Provenance
    from .statements import Statements

log = logging.getLogger(__name__)
LEGACY_TABLE = schema.LEGACY_AUDIT_TABLE
LEGACY_RESET = re.compile(r"counter (?P<counter>.+) reset from -?\d+ to 0 at (?P<point>\S+) \(")
"""A reset's message as versions before the ledger's ``origin_ms`` wrote it."""

PAGE_ROWS = 1000
"""Rows per request when a read streams (the driver's page) or the upgrade copies."""
LATEST = datetime(9999, 12, 31)
UPGRADE_MARGIN = timedelta(seconds=60)
"""The upgrade deletes the legacy rows written before its start minus this margin (a write
still in flight that long has timed out): a row an older version writes during the move
survives the delete and is moved by the next ``counterctl init``."""
LEGACY_COLUMNS = (
    "family",
    "started_at",
    "run_id",
    "kind",
    "outcome",
    "dry_run",
    "epoch_before",
    "epoch_after",
    "counters",
    "rows_folded",
    "sum_folded",
    "late_rows",
    "late_sum",
    "max_lateness_ms",
    "conflicts",
    "rows_deleted",
    "checks",
    "durations",
    "message",
)
"""The columns of ``counters_audit`` as versions before the month partitions wrote them."""


class AuditUpgradeError(RuntimeError):
    """A moved row did not read back as it was: the move stops, nothing is deleted."""


def _encode(column: str, value: Any) -> Any:
    import json

    if column not in MAP_COLUMNS and isinstance(value, dict | list):
        return json.dumps(value, default=str, sort_keys=True)
    return value


@dataclass(frozen=True)
class UpgradeState:
    cut_micros: int | None
    cursor: datetime | None
    copied: int
    finished_at: datetime | None


class AuditLog:
    """A family's audit trail (cheap to create; statements are prepared once per ``Store``)."""

    STATEMENTS = declare(
        audit_write=Cql("INSERT INTO {audit} ({columns}) VALUES ({marks})"),
        audit_range=Cql(
            "SELECT * FROM {audit} WHERE family = ? AND month = ? "
            "AND started_at >= ? AND started_at < ? LIMIT ?"
        ),
        audit_stream=Cql(
            "SELECT * FROM {audit} WHERE family = ? AND month = ? "
            "AND started_at >= ? AND started_at < ?"
        ),
        audit_month_add=Cql("INSERT INTO {audit_months} (family, month) VALUES (?, ?)"),
        audit_archive_add=Cql(
            "UPDATE {audit} SET archive = archive + ? WHERE family = ? AND month = ? AND "
            "started_at = ? AND run_id = ?"
        ),
        audit_archives=Cql(
            "SELECT started_at, run_id, archive FROM {audit} WHERE family = ? AND month = ? AND "
            "started_at >= ? AND started_at < ?"
        ),
        audit_months=Cql("SELECT month FROM {audit_months} WHERE family = ?"),
        audit_upgrade_read=Cql(
            "SELECT cut_micros, cursor, copied, finished_at FROM {audit_upgrade} WHERE family = ?"
        ),
        audit_upgrade_write=Cql(
            "UPDATE {audit_upgrade} SET cut_micros = ?, cursor = ?, copied = ?, finished_at = ? "
            "WHERE family = ?"
        ),
        audit_legacy_resets=Cql(
            "SELECT outcome, message FROM {audit_legacy} WHERE family = ? ORDER BY started_at ASC"
        ),
        audit_legacy_any=Cql("SELECT started_at FROM {audit_legacy} WHERE family = ? LIMIT 1"),
        audit_legacy_scan=Cql(
            "SELECT * FROM {audit_legacy} WHERE family = ? AND started_at >= ? ORDER BY "
            "started_at ASC"
        ),
        audit_legacy_delete=Cql("DELETE FROM {audit_legacy} USING TIMESTAMP ? WHERE family = ?"),
        audit_upgrade_check=Cql(
            "SELECT * FROM {audit} WHERE family = ? AND month = ? AND started_at >= ? AND "
            "started_at <= ?"
        ),
        audit_upgrade_begin=Cql("UPDATE {audit_upgrade} SET started_at = ? WHERE family = ?"),
    )

    def __init__(self, statements: Statements):
        self.statements = statements
        self.family = statements.family
        self.provenance: Provenance | None = None
        """Who started the changes this store makes (written into its audit rows)."""
        self._months_written: set[str] = set()

    @property
    def family_name(self) -> str:
        return self.family.name

    # --- writes ------------------------------------------------------------------------------

    def _add_month(self, month: str) -> None:
        """List the month before its first row, so a reader walking the months finds every
        row; once per process and month."""
        if month in self._months_written:
            return
        statement = self.statements.prepared(self, "audit_month_add")
        self.statements.execute(statement, (self.family_name, month))
        self._months_written.add(month)

    def _insert(self, row: Mapping[str, Any]) -> tuple[Any, list[Any]]:
        """The INSERT of a row; a None column is left unset (no tombstone)."""
        columns = list(row)
        statement = self.statements.prepared(
            self,
            "audit_write",
            columns=", ".join(columns),
            marks=", ".join("?" for _ in columns),
        )
        return statement, [UNSET_VALUE if v is None else _encode(c, v) for c, v in row.items()]

    def write(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write one row (``RunOutcome.audit_row`` or ``audit.operator_record``), stamped
        with who wrote it (``provenance``), the code version and the configuration hash;
        returns it as written."""
        row = stamped(record, self.family, self.provenance, self.statements.conn.settings.username)
        self._add_month(row["month"])
        self.statements.execute(*self._insert(row))
        return row

    def record_archive(
        self, started_at: datetime, run_id: str, manifests: Mapping[str, str]
    ) -> None:
        """Add archive manifests (file name -> ``archive.Manifest`` as text) to the ``archive``
        map of a run's audit row, before the run deletes the rows they hold. Written ahead of
        the rest of the row, which the run writes when it ends (its INSERT leaves ``archive``
        unset, so these entries stay); a run that never ends leaves a row naming its files."""
        if not manifests:
            return
        month = month_of(started_at)
        self._add_month(month)
        statement = self.statements.prepared(self, "audit_archive_add")
        self.statements.execute(
            statement, (dict(manifests), self.family_name, month, started_at, run_id)
        )

    # --- reads -------------------------------------------------------------------------------

    def archives(
        self, since: datetime | None = None, before: datetime | None = None
    ) -> Iterator[tuple[datetime, str, dict[str, str]]]:
        """``(started_at, run_id, archive map)`` of every row of ``[since, before)`` whose run
        archived rows, newest first, a page at a time."""
        low, high = utc_naive(since) if since else EARLIEST, utc_naive(before) if before else LATEST
        statement = self.statements.prepared(self, "audit_archives")
        for month in self.months(since, before):
            bound = statement.bind((self.family_name, month, low, high))
            bound.fetch_size = PAGE_ROWS
            result = self.statements.execute(bound)
            while True:
                for started_at, run_id, archive in result.current_rows:
                    if archive:
                        yield started_at, run_id, dict(archive)
                if not result.has_more_pages:
                    break
                self.statements.next_page(result)

    def months(self, since: datetime | None = None, before: datetime | None = None) -> list[str]:
        """The family's months (``YYYY-MM``) that hold any time of ``[since, before)``, newest
        first: one small partition."""
        statement = self.statements.prepared(self, "audit_months")
        return [
            row.month
            for row in self.statements.execute(statement, (self.family_name,))
            if month_overlaps(row.month, since, before)
        ]

    def _range_statement(self, limited: bool) -> Any:
        return self.statements.prepared(self, "audit_range" if limited else "audit_stream")

    def page(
        self, limit: int, since: datetime | None = None, before: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` rows with ``since <= started_at < before`` (naive UTC; open ends
        when None), newest first: one request per month partition until ``limit`` is met."""
        low, high = utc_naive(since) if since else EARLIEST, utc_naive(before) if before else LATEST
        statement = self._range_statement(limited=True)
        rows: list[dict[str, Any]] = []
        for month in self.months(since, before):
            if len(rows) >= limit:
                break
            found = self.statements.execute(
                statement, (self.family_name, month, low, high, limit - len(rows))
            )
            rows.extend(row._asdict() for row in found)
        return rows

    def stream(
        self,
        since: datetime | None = None,
        before: datetime | None = None,
        page_rows: int = PAGE_ROWS,
    ) -> Iterator[dict[str, Any]]:
        """Every row of ``[since, before)``, newest first, read ``page_rows`` at a time (the
        driver's paging within a month partition): an export of any length holds one page in
        memory."""
        if page_rows < 1:
            raise ValueError(f"page_rows must be at least 1, got {page_rows}")
        low, high = utc_naive(since) if since else EARLIEST, utc_naive(before) if before else LATEST
        statement = self._range_statement(limited=False)
        for month in self.months(since, before):
            bound = statement.bind((self.family_name, month, low, high))
            bound.fetch_size = page_rows
            result = self.statements.execute(bound)
            while True:
                for row in result.current_rows:
                    yield row._asdict()
                if not result.has_more_pages:
                    break
                self.statements.next_page(result)

    # --- the upgrade from one partition per family ----------------------------------------

    def _upgrade_state(self) -> UpgradeState | None:
        statement = self.statements.prepared(self, "audit_upgrade_read")
        row = self.statements.execute(statement, (self.family_name,)).one()
        return None if row is None else UpgradeState(row[0], row[1], int(row[2] or 0), row[3])

    def _save_upgrade_state(self, state: UpgradeState, started: bool = False) -> None:
        statement = self.statements.prepared(self, "audit_upgrade_write")
        self.statements.execute(
            statement,
            (state.cut_micros, state.cursor, state.copied, state.finished_at, self.family_name),
        )
        if started:
            begun = self.statements.prepared(self, "audit_upgrade_begin")
            self.statements.execute(begun, (datetime.now(UTC), self.family_name))

    def legacy_resets(self) -> list[tuple[str, datetime]]:
        """The resets the family's rows of ``counters_audit`` record, ``(counter as
        format_key wrote it, point)`` from each reset row's message, oldest first: versions
        before the ledger's ``origin_ms`` kept a reset's point only in the checkpoint, until
        the counter's next commit. Empty once the rows are moved (``upgrade``)."""
        if not schema.has_table(self.statements.session, self.family.keyspace, LEGACY_TABLE):
            return []
        select = self.statements.prepared(self, "audit_legacy_resets")
        bound = select.bind((self.family_name,))
        bound.fetch_size = PAGE_ROWS
        found = []
        for outcome, message in self.statements.execute(bound):
            hit = LEGACY_RESET.match(message or "") if outcome == "reset" else None
            if hit:
                found.append((hit["counter"], from_text(hit["point"])))
        return found

    def _legacy_rows_left(self) -> bool:
        statement = self.statements.prepared(self, "audit_legacy_any")
        return self.statements.execute(statement, (self.family_name,)).one() is not None

    def upgrade(
        self,
        page_rows: int = PAGE_ROWS,
        after_page: Callable[[int], None] | None = None,
        margin: timedelta = UPGRADE_MARGIN,
    ) -> int:
        """Move the family's rows of ``counters_audit`` (one partition per family, versions
        before) into the month partitions; returns how many rows this call moved.

        Oldest first, a page at a time: each page is written, read back and compared column
        by column, and only then is the cursor (the page's last ``started_at``) saved, so a
        crash resumes at the cursor (rows at it are written again: the same key, the same
        row). When every row is moved, the legacy partition is deleted with a timestamp of the
        move's start (on this host's clock, as an older version stamps its rows) minus ``margin``: a
        row an older version wrote meanwhile (or in the margin before) stays and the next call
        moves it. A family already moved costs two small reads. ``after_page(moved)`` is
        called after each page (tests crash there)."""
        session = self.statements.session
        keyspace = self.family.keyspace
        if not schema.has_table(session, keyspace, schema.LEGACY_AUDIT_TABLE):
            return 0
        state = self._upgrade_state()
        if state is None or state.finished_at is not None:
            if not self._legacy_rows_left():
                if state is None:
                    self._save_upgrade_state(UpgradeState(None, None, 0, datetime.now(UTC)), True)
                return 0
            # on this host's clock, as the older versions that may still write legacy rows
            # stamp theirs (their driver's default timestamps): on the cluster's, a host behind
            # it would cut after a row an older version writes during the move, and delete it
            # unmoved. A row left is moved by the next call.
            cut = to_micros(datetime.now(UTC) - margin)
            state = UpgradeState(cut, None, 0, None)
            self._save_upgrade_state(state, started=True)
        select = self.statements.prepared(self, "audit_legacy_scan")
        bound = select.bind((self.family_name, state.cursor or EARLIEST))
        bound.fetch_size = page_rows
        result = self.statements.execute(bound)
        moved = 0
        while True:
            page = [row._asdict() for row in result.current_rows]
            if page:
                self._move_page(page)
                cursor = max(utc_naive(row["started_at"]) for row in page)
                state = UpgradeState(state.cut_micros, cursor, state.copied + len(page), None)
                self._save_upgrade_state(state)
                moved += len(page)
                if after_page is not None:
                    after_page(moved)
            if not result.has_more_pages:
                break
            self.statements.next_page(result)
        delete = self.statements.prepared(self, "audit_legacy_delete")
        self.statements.execute(delete, (state.cut_micros, self.family_name))
        self._save_upgrade_state(
            UpgradeState(state.cut_micros, state.cursor, state.copied, datetime.now(UTC))
        )
        log.info(
            "family %s: %d audit row(s) moved from %s (%d in all)",
            self.family_name,
            moved,
            schema.LEGACY_AUDIT_TABLE,
            state.copied,
        )
        return moved

    def _move_page(self, page: list[dict[str, Any]]) -> None:
        """Write a page of legacy rows into their months and check each reads back equal."""
        by_month: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in page:
            by_month[month_of(row["started_at"])].append(row)
        for month in by_month:
            self._add_month(month)
        writes = []
        for month, rows in by_month.items():
            for row in rows:
                legacy = {c: row.get(c) for c in LEGACY_COLUMNS}
                action = Action.RESET if legacy["outcome"] == "reset" else Action.COMPACT
                writes.append(self._insert({**legacy, "month": month, "action": action.value}))
        self.statements.run(writes)
        check = self.statements.prepared(self, "audit_upgrade_check")
        for month, rows in by_month.items():
            low = min(utc_naive(r["started_at"]) for r in rows)
            high = max(utc_naive(r["started_at"]) for r in rows)
            found = {
                (utc_naive(r.started_at), r.run_id): r._asdict()
                for r in self.statements.execute(check, (self.family_name, month, low, high))
            }
            for row in rows:
                copy = found.get((utc_naive(row["started_at"]), row["run_id"]))
                different = (
                    [c for c in LEGACY_COLUMNS if copy.get(c) != row.get(c)] if copy else ["row"]
                )
                if different:
                    raise AuditUpgradeError(
                        f"family {self.family_name!r}: audit row {row['run_id']!r} started at "
                        f"{row['started_at']} did not read back from {schema.AUDIT_TABLE} "
                        f"(month {month}; differs in {different}); nothing of "
                        f"{schema.LEGACY_AUDIT_TABLE} was deleted, run `counterctl init` again"
                    )
