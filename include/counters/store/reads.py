"""The read rule: a counter's value, exact while runs copy and delete (nothing here writes)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..config import Family
from ..core import (
    Key,
)
from ..errors import EngineError
from .keys import Keys
from .ledger import LedgerTable
from .raw import RawTable

log = logging.getLogger(__name__)

READ_ATTEMPTS = 8
"""Rounds a read takes at most while runs keep moving its counters' copies (a run moves a
counter's copy once; a read round takes milliseconds)."""
READ_HINT_S = 60.0
"""How long the epoch a counter was read at serves as the next read's first bound: the raw read
after a stale bound also reads the rows (or tombstones) of the folds since."""
READ_HINTS = 100_000
"""Counters whose last read epoch a store keeps."""


class Reader:
    """The read rule over the tables it reads: the raw rows (and a unique family's set) and
    the readers' compact copies. ``Store`` makes one as ``store.reader``; it keeps the epochs
    counters were last read at (``READ_HINT_S``)."""

    def __init__(self, family: Family, keys: Keys, raw: RawTable, ledger: LedgerTable):
        self.family = family
        self.keys = keys
        self.raw = raw
        self.ledger = ledger
        self._read_hints: dict[Key, tuple[float, Any, Any]] = {}

    def read_values(self, counters: Sequence[Key]) -> dict[Key, tuple[int, datetime | None, int]]:
        """The seed's read rule for many counters, exact while runs copy and delete: (compact
        value, epoch, newer rows' sum; their count for a rows family; their distinct members for
        a unique family that are not counted yet).

        A run deletes a counter's rows, and marks a unique family's members counted, only after
        the copy that counts them was written and read back. So every read the value depends on
        (the rows after an epoch; for a unique family the counted marks of their members), made
        before a read of the copy that finds that same epoch written by the same commit, saw no
        delete and no mark of a later commit, and the value is that copy's plus those rows (the
        commit too: a commit that folds part of a late backlog lowers the epoch, possibly back
        to the one the rows were read after). A copy that moved in between (a run committed
        meanwhile) is read against again, at its new epoch. Every
        kind follows this one rule (a family that keeps its rows would be exact without the
        second read of the copy: a cold read takes one request more, a warm one none). The
        epoch a counter was last read at, and its copy's commit, are kept a minute
        (``READ_HINT_S``) as the next read's first bound: a repeated read takes the raw read and the
        copy's, as the rule itself does, and a moved copy one more."""
        keys = list(dict.fromkeys(counters))
        now = time.monotonic()
        bounds: dict[Key, tuple[Any, Any]] = {}  # (epoch, the copy's commit)
        cold: list[Key] = []
        for counter in keys:
            hint = self._read_hints.get(counter)
            if hint is not None and now - hint[0] < READ_HINT_S:
                bounds[counter] = hint[1:]
            else:
                cold.append(counter)
        bounds.update((c, (b.epoch, b.commit)) for c, b in self.ledger.read_bases(cold).items())
        out: dict[Key, tuple[int, datetime | None, int]] = {}
        todo = keys
        for _attempt in range(READ_ATTEMPTS):
            newer = self.raw.read_newer(todo, {c: bounds[c][0] for c in todo})
            marked = self.raw.read_marked(newer)  # before the settling read, as the rows are
            for counter, base in self.ledger.read_bases(todo).items():
                if base.settles(*bounds[counter]):
                    measured = base.measure(newer[counter], marked.get(counter, frozenset()))
                    out[counter] = (base.value, self.keys.epoch_time(base.epoch), measured)
                    self._hint(counter, base.epoch, base.commit)
                else:
                    bounds[counter] = (base.epoch, base.commit)
            todo = [c for c in todo if c not in out]
            if not todo:
                return out
        raise EngineError(
            f"family {self.family.name!r}: the compact rows of {len(todo)} counter(s) moved "
            f"at each of {READ_ATTEMPTS} reads (e.g. {todo[0]}): too many runs at once; read again"
        )

    def read_epochs(self, counters: Sequence[Key]) -> dict[Key, datetime | None]:
        """Each counter's compacted epoch as its copy says (None before its first commit): the
        horizon behind which a late row is not read until a run folds it."""
        keys = list(dict.fromkeys(counters))
        return {c: self.keys.epoch_time(b.epoch) for c, b in self.ledger.read_bases(keys).items()}

    def _hint(self, counter: Key, epoch: Any, commit: Any) -> None:
        if len(self._read_hints) >= READ_HINTS:
            self._read_hints.clear()  # rare; a cleared hint costs one read of the copy
        self._read_hints[counter] = (time.monotonic(), epoch, commit)
