"""Moving a family to another shard count, exactly (``counterctl reshard``).

A counter's checkpoint lives in the ledger partition of its shard and bucket, which depend on
the shard count; so do its quarantine entry, its index mark and the run log's record of the
keys its last commit counted. A new shard count moves each of them to its new place, row by
row, each move one logged batch (the row at its new place and its deletion at the old one).
Runs are kept out meanwhile, twice over: the family's identity says a reshard is under way
(every run and operator command refuses it), and each old ledger partition is fenced first (its
``shards`` static set to ``store.MOVING`` under its head's compare-and-set, which every commit is
conditioned on), so a run that started before cannot commit into it. A crash leaves a reshard
that the same command finishes: every step is idempotent (a row already at its new place is
where a new count puts it, and is not moved again).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .core import BUCKETS, bucket_of, shard_of
from .errors import EngineError
from .identity import IdentityMismatch, check_identity, encode, family_identity
from .schema import SchemaError
from .store import Store


@dataclass(frozen=True)
class Resharded:
    family: str
    shards_before: int
    shards_after: int
    checkpoints_moved: int
    records_moved: int
    quarantined_moved: int
    marks_moved: int


def reshard(
    store: Store, shards: int, *, progress: Callable[[str], None] | None = None
) -> Resharded:
    """Move the family's ledger, run-log records, quarantine and index to ``shards`` shards.
    ``store`` is the family as its YAML says (its other identity fields must match the
    recorded ones); set ``shards`` in the YAML to the new count once this returns."""
    say = progress or (lambda _m: None)
    family = store.family
    if not 1 <= shards <= 256:
        raise EngineError(f"family {family.name!r}: --shards must be 1..256, got {shards}")
    before, recorded = _recorded_shards(store, shards)
    if before == shards and "resharding" not in recorded:
        return Resharded(family.name, before, shards, 0, 0, 0, 0)
    moving = {**recorded, "resharding": {"from": before, "to": shards}}
    _record(store, recorded, moving)
    say(f"fencing {before * BUCKETS} ledger partition(s) of {before} shard(s)")
    for shard in range(before):
        for bucket in range(BUCKETS):
            store.ledger.fence_bucket(shard, bucket)
    moved = records = 0
    for shard in range(before):
        say(f"moving the checkpoints of shard {shard}")
        for bucket in range(BUCKETS):
            m, r = _move_bucket(store, shard, bucket, shards)
            moved, records = moved + m, records + r
    for shard in range(max(before, shards)):
        for bucket in range(BUCKETS):
            if shard < shards:
                store.ledger.open_bucket(shard, bucket, shards)
            else:
                store.ledger.drop_bucket(shard, bucket)
    say("moving quarantine entries and index marks")
    quarantined = _move_quarantine(store, before, shards)
    marks = _move_marks(store, before, shards)
    done = {k: v for k, v in moving.items() if k != "resharding"}
    done["shards"] = shards
    _record(store, moving, done)
    store.state.record_shards(shards)
    return Resharded(family.name, before, shards, moved, records, quarantined, marks)


@dataclass(frozen=True)
class ReshardPlan:
    family: str
    shards_before: int
    shards_after: int
    checkpoints: int
    """Checkpoints in the ledger."""
    checkpoints_to_move: int
    """Of them, those the new count puts in another partition."""
    under_way: bool
    """A reshard to ``shards_after`` was interrupted; running it finishes it."""


def plan_reshard(store: Store, shards: int) -> ReshardPlan:
    """What ``reshard`` would move, read only (``counterctl reshard --dry-run`` and its
    confirmation): the same refusals, then every ledger partition read, nothing written."""
    family = store.family
    if not 1 <= shards <= 256:
        raise EngineError(f"family {family.name!r}: --shards must be 1..256, got {shards}")
    before, recorded = _recorded_shards(store, shards, record=False)
    under_way = "resharding" in recorded
    total = moving = 0
    for shard in range(before):
        for bucket in range(BUCKETS):
            for counter, _row in store.ledger.ledger_rows(shard, bucket):
                total += 1
                if bucket_of(store.keys.token(counter), shards) != (shard, bucket):
                    moving += 1
    return ReshardPlan(family.name, before, shards, total, moving, under_way)


def _recorded_shards(
    store: Store, shards: int, *, record: bool = True
) -> tuple[int, dict[str, Any]]:
    """The shard count the family's tables were committed with, and the recorded identity
    (recorded now from the ledger if an older version committed without one; with ``record``
    false, nothing is recorded and a family without one gets an empty identity)."""
    family = store.family
    owners = store.owners.table_owners()
    if not owners:  # committed by an older version, or never: check the rest, then record
        written = _written(store)
        check_identity(store.with_shards(written), record=record, run_id="reshard")
        if not record:
            return written, {}
        owners = store.owners.table_owners()
    recorded: dict[str, Any] = {}
    for table, owner in owners.items():
        if owner.family != family.name:
            raise IdentityMismatch(
                f"family {family.name!r}: table {family.keyspace}.{table} belongs to family "
                f"{owner.family!r}; nothing to reshard. Nothing was changed."
            )
        identity = json.loads(owner.identity)
        if recorded and identity != recorded:
            raise SchemaError(
                f"family {family.name!r}: its tables record different identities ({table}); "
                "finish the reshard that was under way with its own --shards"
            )
        recorded = identity
    under_way = recorded.get("resharding")
    if under_way and under_way["to"] != shards:
        raise IdentityMismatch(
            f"family {family.name!r}: a reshard from {under_way['from']} to {under_way['to']} "
            f"shards is under way; finish it first: counterctl reshard --family {family.name} "
            f"--shards {under_way['to']}"
        )
    current = family_identity(family)
    for field in ("kind", "retention", "raw_table", "fold_table", "compact_table", "columns"):
        if field in recorded and recorded[field] != current[field]:
            raise IdentityMismatch(
                f"family {family.name!r}: field {field!r} differs from what its tables were "
                f"first committed with ({json.dumps(recorded[field])}); a reshard moves shards "
                "only. Nothing was changed."
            )
    before = under_way["from"] if under_way else int(recorded["shards"])
    return before, recorded


def _written(store: Store) -> int:
    from .identity import written_shards

    positions = [(s, b, store.keys.token(c)) for s, b, c in store.ledger.ledger_positions(256)]
    found = written_shards(positions) if positions else None
    return found or store.state.family_state().shards or store.family.shards


def _record(store: Store, expected: dict[str, Any], identity: dict[str, Any]) -> None:
    for table in store.family.tables:
        if not store.owners.replace_identity(table, encode(expected), encode(identity)):
            raise SchemaError(
                f"family {store.family.name!r}: the identity of {table} changed meanwhile (another "
                "reshard?); run the command again. Nothing more was changed."
            )


def _move_bucket(store: Store, shard: int, bucket: int, shards: int) -> tuple[int, int]:
    """Move the checkpoints of one old partition that a count of ``shards`` puts elsewhere, each
    with its commit's record of counted keys first (a later fold reads it at the new place)."""
    moved = records = 0
    for counter, row in store.ledger.ledger_rows(shard, bucket):
        place = bucket_of(store.keys.token(counter), shards)
        if place == (shard, bucket):
            continue  # already where the new count puts it
        checkpoint = store.ledger.row_checkpoint(row)
        if store.runs.copy_commit_record(checkpoint, counter, (shard, bucket), place):
            records += 1
        store.ledger.move_ledger_row(counter, row, (shard, bucket), place)
        moved += 1
    return moved, records


def _move_quarantine(store: Store, before: int, shards: int) -> int:
    """Move the quarantine entries of ``before`` shards to their shard under ``shards``; how
    many moved."""
    moved = 0
    for shard in range(before):
        for counter, entry in store.quarantine.quarantine_entries(shard):
            to = shard_of(store.keys.token(counter), shards)
            if to != shard:
                store.quarantine.move_quarantine_entry(counter, entry, shard, to)
                moved += 1
    return moved


def _move_marks(store: Store, before: int, shards: int) -> int:
    """Move the index marks of ``before`` shards to their partition under ``shards``, each
    with its server write time; how many moved."""
    moved = 0
    for shard in range(before):
        for bucket in range(BUCKETS):
            for counter, minutes, written in store.index.marks_to_move(shard, bucket):
                to = bucket_of(store.keys.token(counter), shards)
                if to != (shard, bucket):
                    store.index.move_mark(counter, minutes, written, (shard, bucket), to)
                    moved += 1
    return moved
