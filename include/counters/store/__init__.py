"""Every CQL statement of a family, prepared once, executed with bounded concurrency.

The engine and the client library call these; nothing else in the project writes CQL for a
family's tables. Identifiers come from the validated config and are quoted; values are bound.
One module per concern (``base``: statements, batching, keys; ``records``: the small types
they return; ``raw``, ``touched``, ``ledger``, ``runlog``, ``control`` with ``auditlog``,
``moves``, ``reads``); ``Store`` composes them, the one object callers get. A table moved
to its own object is an attribute of it, over the same statements core: ``store.runs``
(the run log, ``RunLogTable``), ``store.control`` (``ControlTable``), ``store.audit``
(``AuditLog``).
"""

from __future__ import annotations

from ..config import Family
from ..connection import Connection
from ..schema import RawLayout
from .auditlog import AuditLog
from .base import (
    BATCH_BYTES,
    CAS_WRITE_UNKNOWN,
    COMMIT_CHUNK,
    COPY_BATCH_PARTITIONS,
    DEFAULT_CONCURRENCY,
    DELETE_BATCH_ROWS,
    FIRST_WRITE_WINS,
    IN_CHUNK,
    IN_KEY_TYPES,
    PACKED_TYPES,
    PLAIN_KEY_TYPES,
    READ_ATTEMPTS,
    READ_HINT_S,
    READ_HINTS,
    ROW_BYTES,
    ROWS_PER_BATCH,
    RUN_LOG_FETCH,
    SCAN_FETCH,
    SCAN_SPLITS,
    MillisTimestampType,
    StoreBase,
    batch_too_large,
    bind,
    consistency_of,
    millis_timestamps,
    normal_key,
    outcome_unknown,
    pending_flags_of,
    serial_consistency_of,
)
from .control import ControlTable
from .ledger import LedgerTable
from .moves import ReshardMoves
from .raw import RawTable
from .reads import Reader
from .records import (
    COMMIT_KEYS_V2,
    EMPTY_READ_BASE,
    MOVING,
    NO_KEYS,
    CommitRecord,
    Copy,
    FamilyState,
    Ledger,
    Quarantined,
    ReadBase,
    TableOwner,
    Touched,
    pack_commit_keys,
    unpack_commit_keys,
)
from .runlog import RunLogTable
from .touched import IndexTable


class Store(ReshardMoves):
    """I/O for one family. Cheap to create; statements are prepared on first use.

    Tables composed over the statements core (the rest still mixed in): ``runs``, the run
    log; ``control``, quarantine, leases, family state and table owners; ``audit``, the
    audit trail."""

    def __init__(
        self,
        conn: Connection,
        family: Family,
        layout: RawLayout | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
    ):
        super().__init__(conn, family, layout, concurrency)
        self.raw = RawTable(self)
        self.index = IndexTable(self)
        self.ledger = LedgerTable(self)
        self.runs = RunLogTable(self)
        self.control = ControlTable(self)
        self.audit = AuditLog(self)
        self.reader = Reader(self, self.raw, self.ledger)


__all__ = [
    "BATCH_BYTES",
    "CAS_WRITE_UNKNOWN",
    "COMMIT_CHUNK",
    "COMMIT_KEYS_V2",
    "COPY_BATCH_PARTITIONS",
    "DEFAULT_CONCURRENCY",
    "DELETE_BATCH_ROWS",
    "EMPTY_READ_BASE",
    "FIRST_WRITE_WINS",
    "IN_CHUNK",
    "IN_KEY_TYPES",
    "MOVING",
    "NO_KEYS",
    "PACKED_TYPES",
    "PLAIN_KEY_TYPES",
    "READ_ATTEMPTS",
    "READ_HINTS",
    "READ_HINT_S",
    "ROWS_PER_BATCH",
    "ROW_BYTES",
    "RUN_LOG_FETCH",
    "SCAN_FETCH",
    "SCAN_SPLITS",
    "AuditLog",
    "CommitRecord",
    "ControlTable",
    "Copy",
    "FamilyState",
    "IndexTable",
    "Ledger",
    "LedgerTable",
    "MillisTimestampType",
    "Quarantined",
    "RawTable",
    "ReadBase",
    "Reader",
    "RunLogTable",
    "Store",
    "StoreBase",
    "TableOwner",
    "Touched",
    "batch_too_large",
    "bind",
    "consistency_of",
    "millis_timestamps",
    "normal_key",
    "outcome_unknown",
    "pack_commit_keys",
    "pending_flags_of",
    "serial_consistency_of",
    "unpack_commit_keys",
]
