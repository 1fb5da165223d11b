"""Every CQL statement of a family, prepared once, executed with bounded concurrency.

The engine and the client library call these; nothing else in the project writes CQL for a
family's tables. Identifiers come from the validated config and are quoted; values are bound.
``Store`` is a container with no base class and no behaviour of its own. It holds:

- ``store.statements`` (``Statements``, module ``statements``): preparing, running and
  batching statements, the session, the raw layout, and every request counted in the
  ``phase`` its thread is in (``with store.statements.phase("cleanup"): ...``);
- ``store.keys`` (``Keys``, module ``keys``): tokens, shards, buckets, key and JSON codecs,
  packing of raw rows, epochs as stored;
- one object per table over those two, each owning every statement on its table, a
  reshard's moves included, declared once by name in its class's ``STATEMENTS`` (listed in
  docs/data-model.md by ``catalog``): ``store.raw`` (``RawTable``: raw rows and a unique
  family's set),
  ``store.index`` (``IndexTable``: the touched marks), ``store.ledger`` (``LedgerTable``: the
  ledger and the readers' copies), ``store.runs`` (``RunLogTable``: the run log),
  the control tables, module ``control``: ``store.state`` (``StateTable``: the family's
  epoch, sweep, shard count and retirement), ``store.owners`` (``OwnersTable``: the tables'
  owners, and ``checked_run``), ``store.lease`` (``LeaseTable``: the shards' leases) and
  ``store.quarantine`` (``QuarantineTable``: quarantined counters); and ``store.audit``
  (``AuditLog``, and the ``provenance`` it writes);
- ``store.reader`` (``Reader``): the read rule over the tables it reads.

The small types they return are in ``records``. Besides these the store says what it is for,
read-only: ``family``, ``conn``, ``layout``. A caller says which object it uses:
``store.ledger.commit_bucket(...)``, ``store.keys.bucket(c)``, ``store.statements.requests``.
"""

from __future__ import annotations

from typing import Self

from ..config import Family
from ..connection import Connection
from ..schema import RawLayout
from .auditlog import AuditLog
from .control import LeaseTable, OwnersTable, QuarantineTable, StateTable, known_families
from .keys import PACKED_TYPES, PLAIN_KEY_TYPES, Keys, normal_key
from .ledger import SCAN_REFUSED_TTL_S, LedgerTable
from .raw import RawTable
from .reads import READ_ATTEMPTS, READ_HINT_S, READ_HINTS, Reader
from .records import (
    COMMIT_KEYS_V2,
    EMPTY_READ_BASE,
    MOVING,
    NO_KEYS,
    CommitRecord,
    Copy,
    FamilyState,
    KnownFamily,
    Ledger,
    Quarantined,
    ReadBase,
    RunFigures,
    TableOwner,
    Touched,
    pack_commit_keys,
    pending_flags_of,
    unpack_commit_keys,
)
from .runlog import RunLogTable
from .statements import (
    BATCH_BYTES,
    CAS_WRITE_UNKNOWN,
    COMMIT_CHUNK,
    COPY_BATCH_PARTITIONS,
    DEFAULT_CONCURRENCY,
    DELETE_BATCH_ROWS,
    FIRST_WRITE_WINS,
    IN_CHUNK,
    IN_KEY_TYPES,
    NODE_REQUEST_BYTES,
    REQUEST_BYTES,
    REQUEST_MARGIN,
    ROW_BYTES,
    ROWS_PER_BATCH,
    RUN_LOG_FETCH,
    SCAN_FETCH,
    SCAN_SPLITS,
    MillisTimestampType,
    Statements,
    batch_too_large,
    bind,
    bounded,
    consistency_of,
    fits_one_request,
    millis_timestamps,
    outcome_unknown,
    request_too_large,
    serial_consistency_of,
    value_bytes,
)
from .touched import IndexTable


class Store:
    """I/O for one family. Cheap to create; statements are prepared on first use.

    A container, no behaviour of its own: ``statements`` (``Statements``: preparing, running,
    batching, counting requests by ``phase``), ``keys`` (``Keys``: tokens, shards, buckets,
    codecs, packing, epochs) and the tables over them, ``raw``, ``index``, ``ledger``,
    ``runs``, ``state``, ``owners``, ``lease``, ``quarantine``, ``audit``, and ``reader``, the
    read rule. Besides them it says what
    it is for, read-only: ``family``, ``conn`` and ``layout``; everything else is reached
    through the object that holds it (``store.keys.bucket(c)``,
    ``store.statements.requests``)."""

    def __init__(
        self,
        conn: Connection,
        family: Family,
        layout: RawLayout | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
    ):
        self.statements = Statements(conn, family, layout, concurrency)
        self.keys = Keys(self.statements)
        self.raw = RawTable(self.statements, self.keys)
        self.index = IndexTable(self.statements, self.keys)
        self.ledger = LedgerTable(self.statements, self.keys)
        self.runs = RunLogTable(self.statements, self.keys)
        self.state = StateTable(self.statements)
        self.owners = OwnersTable(self.statements)
        self.lease = LeaseTable(self.statements)
        self.quarantine = QuarantineTable(self.statements, self.keys, self.state, self.owners)
        self.audit = AuditLog(self.statements)
        self.reader = Reader(family, self.keys, self.raw, self.ledger)

    @property
    def family(self) -> Family:
        """The family this store reads and writes."""
        return self.statements.family

    @property
    def conn(self) -> Connection:
        """The connection its statements run on."""
        return self.statements.conn

    @property
    def layout(self) -> RawLayout:
        """The family's raw table layout (read from the schema on first use)."""
        return self.statements.layout

    def with_shards(self, shards: int) -> Self:
        """This store for the same family at another shard count (a reshard's old count)."""
        family = self.family.model_copy(update={"shards": shards})
        statements = self.statements
        return type(self)(
            statements.conn, family, statements.layout_if_read, statements.concurrency
        )


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
    "NODE_REQUEST_BYTES",
    "NO_KEYS",
    "PACKED_TYPES",
    "PLAIN_KEY_TYPES",
    "READ_ATTEMPTS",
    "READ_HINTS",
    "READ_HINT_S",
    "REQUEST_BYTES",
    "REQUEST_MARGIN",
    "ROWS_PER_BATCH",
    "ROW_BYTES",
    "RUN_LOG_FETCH",
    "SCAN_FETCH",
    "SCAN_REFUSED_TTL_S",
    "SCAN_SPLITS",
    "AuditLog",
    "CommitRecord",
    "Copy",
    "FamilyState",
    "IndexTable",
    "Keys",
    "KnownFamily",
    "LeaseTable",
    "Ledger",
    "LedgerTable",
    "MillisTimestampType",
    "OwnersTable",
    "QuarantineTable",
    "Quarantined",
    "RawTable",
    "ReadBase",
    "Reader",
    "RunFigures",
    "RunLogTable",
    "StateTable",
    "Statements",
    "Store",
    "TableOwner",
    "Touched",
    "batch_too_large",
    "bind",
    "bounded",
    "consistency_of",
    "fits_one_request",
    "known_families",
    "millis_timestamps",
    "normal_key",
    "outcome_unknown",
    "pack_commit_keys",
    "pending_flags_of",
    "request_too_large",
    "serial_consistency_of",
    "unpack_commit_keys",
    "value_bytes",
]
