"""Reads for people: the read API and the UI's bounded reads (nothing here writes)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..config import Kind
from ..connection import BULK_PROFILE
from ..core import (
    Key,
)
from ..errors import EngineError

if TYPE_CHECKING:
    pass

from .auditlog import AuditLog
from .base import (
    READ_ATTEMPTS,
    READ_HINT_S,
    READ_HINTS,
    StoreBase,
)
from .control import ControlTable
from .records import (
    EMPTY_READ_BASE,
    Quarantined,
    ReadBase,
    unpack_commit_keys,
)

log = logging.getLogger(__name__)


class Reads(StoreBase):
    control: ControlTable
    """The control tables (``store.control``), made by ``Store``."""
    audit: AuditLog
    """The audit trail (``store.audit``), made by ``Store``."""

    # --- bounded reads for the UI (nothing here writes) -----------------------------------

    def read_audit_range(
        self, limit: int, since: datetime | None = None, before: datetime | None = None
    ) -> list[dict[str, Any]]:
        """Audit rows with ``since <= started_at < before`` (naive UTC; open ends when None),
        newest first, at most ``limit``: a slice of each month partition until ``limit`` is
        met. The next page is ``before`` = the last row's ``started_at``."""
        return self.audit.page(limit, since, before)

    def read_quarantine_sample(self, limit: int) -> list[Quarantined]:
        """Up to ``limit`` quarantined counters of the whole family in one bounded read (the
        table is small; a count beyond ``limit`` is not needed to see that something is)."""
        statement = self.prepare(
            "quarantine_sample", "SELECT {key}, reason, run_id, detail FROM {quarantine} LIMIT ?"
        )
        width = len(self.layout.key)
        self.requests[self.phase] += 1
        return [
            Quarantined(tuple(r[:width]), *r[width:])
            for r in self.session.execute(statement, (limit,), execution_profile=BULK_PROFILE)
        ]

    def quarantined_entry(self, counter: Key) -> Quarantined | None:
        """The counter's quarantine entry, if it is quarantined (one point read)."""
        statement = self.prepare(
            "quarantine_one",
            "SELECT reason, run_id, detail FROM {quarantine} WHERE shard = ? AND {key_where}",
        )
        self.requests[self.phase] += 1
        row = self.session.execute(
            statement, (self.bucket(counter)[0], *counter), execution_profile=BULK_PROFILE
        ).one()
        return Quarantined(counter, *row) if row else None

    def runs_with_counter(self, run_ids: Sequence[str], counter: Key) -> set[str]:
        """Which of these runs committed ``counter``: one read of each run's log for the
        counter's bucket (the run log is kept two weeks)."""
        statement = self.prepare(
            "runs_bucket",
            "SELECT keys FROM {runs} WHERE run_id = ? AND shard = ? AND bucket = ?",
        )
        shard, bucket = self.bucket(counter)
        encode, _decode = self._key_codec()
        wanted = encode(counter)
        results = self._concurrent(statement, [(run_id, shard, bucket) for run_id in run_ids])
        return {
            run_id
            for run_id, result in zip(run_ids, results, strict=True)
            if any(
                entry[0] == wanted
                for (blob,) in result
                if blob is not None
                for entry in unpack_commit_keys(blob, self.key_codec)
            )
        }

    # --- read API -------------------------------------------------------------------------

    def read_values(self, counters: Sequence[Key]) -> dict[Key, tuple[int, datetime | None, int]]:
        """The seed's read rule for many counters, exact while runs copy and delete: (compact
        value, epoch, newer rows' sum; their count for a rows family; their distinct members for
        a unique family that are not counted yet).

        A run deletes a counter's rows, and marks a unique family's members counted, only after
        the copy that counts them was written and read back. So every read the value depends on
        (the rows after an epoch; for a unique family the counted marks of their members), made
        before a read of the copy that finds that same epoch, saw no delete and no mark of a
        later commit, and the value is that copy's plus those rows. A copy that moved in
        between (a run committed meanwhile) is read against again, at its new epoch. Every
        kind follows this one rule (a family that keeps its rows would be exact without the
        second read of the copy: a cold read takes one request more, a warm one none). The
        epoch a counter was last read at is kept a minute (``READ_HINT_S``) as the next read's
        first bound: epochs only move forward, so a repeated read takes the raw read and the
        copy's, as the rule itself does."""
        keys = list(dict.fromkeys(counters))
        now = time.monotonic()
        bounds: dict[Key, Any] = {}
        cold: list[Key] = []
        for counter in keys:
            hint = self._read_hints.get(counter)
            if hint is not None and now - hint[0] < READ_HINT_S:
                bounds[counter] = hint[1]
            else:
                cold.append(counter)
        bounds.update((c, b.epoch) for c, b in self._read_bases(cold).items())
        out: dict[Key, tuple[int, datetime | None, int]] = {}
        todo = keys
        for _attempt in range(READ_ATTEMPTS):
            newer = self._read_newer(todo, bounds)
            marked = self._read_marked(newer)  # before the settling read, as the rows are
            for counter, base in self._read_bases(todo).items():
                if base.has_epoch(bounds[counter]):
                    measured = base.measure(newer[counter], marked.get(counter, frozenset()))
                    out[counter] = (base.value, self.epoch_time(base.epoch), measured)
                    self._hint(counter, base.epoch)
                else:
                    bounds[counter] = base.epoch
            todo = [c for c in todo if c not in out]
            if not todo:
                return out
        raise EngineError(
            f"family {self.family.name!r}: the compact rows of {len(todo)} counter(s) moved at "
            f"each of {READ_ATTEMPTS} reads (e.g. {todo[0]}): too many runs at once; read again"
        )

    def read_epochs(self, counters: Sequence[Key]) -> dict[Key, datetime | None]:
        """Each counter's compacted epoch as its copy says (None before its first commit): the
        horizon behind which a late row is not read until a run folds it."""
        keys = list(dict.fromkeys(counters))
        return {c: self.epoch_time(b.epoch) for c, b in self._read_bases(keys).items()}

    def _hint(self, counter: Key, epoch: Any) -> None:
        if len(self._read_hints) >= READ_HINTS:
            self._read_hints.clear()  # rare; a cleared hint costs one read of the copy
        self._read_hints[counter] = (time.monotonic(), epoch)

    def _read_marked(self, newer: dict[Key, Any]) -> dict[Key, frozenset[Any]]:
        """A unique family's newer members that an earlier cleanup marked counted, per counter
        (one request per counter with newer members, concurrent); nothing for other kinds."""
        wanted = [(c, sorted(m, key=repr)) for c, m in newer.items() if isinstance(m, set) and m]
        if not wanted:
            return {}
        statement = self.prepare(
            "set_counted",
            "SELECT {member}, counted FROM {set} WHERE {key_where} AND {member} IN ?",
        )
        results = self._concurrent(statement, [(*c, members) for c, members in wanted])
        return {
            c: frozenset(member for member, counted in result if counted)
            for (c, _members), result in zip(wanted, results, strict=True)
        }

    def _read_bases(self, counters: Sequence[Key]) -> dict[Key, ReadBase]:
        """Each counter's compact row as a reader's base (value, stored epoch, and for a unique
        family the members it already counts); an empty base where there is none."""
        unique = self.family.kind is Kind.UNIQUE
        if unique:
            statement = self.prepare(
                "compact_value_pending",
                "SELECT {value}, {epoch}, pending FROM {compact} WHERE {key_where}",
            )
        else:
            statement = self.prepare(
                "compact_value", "SELECT {value}, {epoch} FROM {compact} WHERE {key_where}"
            )
        out: dict[Key, ReadBase] = {}
        for counter, result in zip(counters, self._concurrent(statement, counters), strict=True):
            row = result.one()
            if row is None:
                out[counter] = EMPTY_READ_BASE
                continue
            members = frozenset(key[1] for key in (row[2] or ())) if unique else frozenset()
            out[counter] = ReadBase(row[0] or 0, row[1], members)  # (first_time, member) keys
        return out

    def _read_newer(self, counters: Sequence[Key], bounds: dict[Key, Any]) -> dict[Key, Any]:
        """What each counter's rows after its base's epoch add: their sum (varint: an int column
        cannot wrap), their count for a rows family, their members for a unique family."""
        unique = self.family.kind is Kind.UNIQUE
        if unique:  # members, counted distinct: a clock-behind winner leaves two rows
            measure = "{member}"
        elif self.layout.increment is None:
            measure = "count(*)"
        else:
            measure = "sum(CAST({increment} AS varint))"
        newer = self.prepare(
            "raw_newer", f"SELECT {measure} FROM {{raw}} WHERE {{key_where}} AND {{time}} > ?"
        )
        everything = self.prepare("raw_all", f"SELECT {measure} FROM {{raw}} WHERE {{key_where}}")
        requests = [
            (newer, (*c, bounds[c])) if bounds[c] is not None else (everything, c) for c in counters
        ]
        out: dict[Key, Any] = {}
        for counter, result in zip(counters, self._run(requests), strict=True):
            out[counter] = {r[0] for r in result} if unique else result.one()[0] or 0
        return out
