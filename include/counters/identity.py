"""A family's identity: what its tables were first committed with, recorded once, checked by
every step that reads or writes its checkpoints.

A counter's checkpoint is found by its position (the shard and bucket of its token) and read
by what the YAML says the tables are (kind, retention, columns). A YAML that changed after the
first commit (shards, kind, tables), a worker whose YAML differs from the scheduler's, or a
second family on the same tables would read checkpoints at the wrong place or by the wrong
rule: counters would be folded again from a base that does not count what was counted. So the
first commit records, per table, the family that owns it and its identity (a lightweight
transaction: of two first commits one records), and every run, on every shard, and every
operator command that commits is refused while its family's identity differs, naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from cassandra import InvalidRequest

from .config import Family
from .core import BUCKETS, bucket_of, to_text
from .schema import TABLES_TABLE, SchemaError, check_table_options, keyspace_metadata
from .store import MOVING, Ledger, Store, TableOwner

IDENTITY_FIELDS = (
    "kind",
    "retention",
    "raw_table",
    "fold_table",
    "compact_table",
    "shards",
    "buckets",
    "columns",
    "compact_columns",
)
"""What the checkpoints depend on. Everything else (lag, schedule, consistency, discovery,
sweeps, alerts) may change between runs."""
LEDGER_SAMPLE = 256
"""Ledger rows whose positions are checked against the shard count of a family whose identity
was never recorded (committed by a version before it)."""


class IdentityMismatch(SchemaError):
    """The YAML differs from what the family's tables were first committed with."""


def family_identity(family: Family) -> dict[str, Any]:
    """The identity a family's YAML gives it (``IDENTITY_FIELDS``), as JSON values."""
    return {
        "family": family.name,
        "keyspace": family.keyspace,
        "kind": family.kind.value,
        "retention": family.effective_retention.value,
        "raw_table": family.raw_table,
        "fold_table": family.fold_table,
        "compact_table": family.compact_table,
        "shards": family.shards,
        "buckets": BUCKETS,
        "columns": family.columns.model_dump(mode="json"),
        "compact_columns": family.compact_columns.model_dump(mode="json"),
    }


def encode(identity: dict[str, Any]) -> str:
    return json.dumps(identity, sort_keys=True, separators=(",", ":"))


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The identity fields whose values differ (a field the record lacks is not compared)."""
    return [f for f in IDENTITY_FIELDS if f in recorded and recorded[f] != current.get(f)]


def _fix(field: str, recorded: Any, family: Family) -> str:
    if field == "shards":
        return (
            f"set 'shards: {recorded}' back, or move the ledger with `counterctl reshard "
            f"--family {family.name} --shards {family.shards}`"
        )
    shown = json.dumps(recorded) if isinstance(recorded, dict | list) else recorded
    return (
        f"set '{field}: {shown}' back; it cannot change once counters were committed (declare "
        "a new family with new tables instead)"
    )


def refusal(family: Family, table: str, owner: TableOwner, current: dict[str, Any]) -> str:
    """Why a run of ``family`` is refused by the recorded owner of ``table`` ('' if it is not)."""
    where = f"{family.keyspace}.{table}"
    when = f" (recorded {to_text(owner.recorded_at)} by {owner.recorded_by})"
    if owner.recorded_at is None:
        when = ""
    if owner.family != family.name:
        return (
            f"family {family.name!r}: table {where} belongs to family {owner.family!r}{when}: "
            "two families on one table would each count its rows; give this family its own "
            "tables. Nothing was read or changed."
        )
    recorded = json.loads(owner.identity)
    under_way = recorded.get("resharding")
    if under_way:
        return (
            f"family {family.name!r}: a reshard from {under_way['from']} to {under_way['to']} "
            f"shards is under way; finish it with `counterctl reshard --family {family.name} "
            f"--shards {under_way['to']}`. Nothing was read or changed."
        )
    diffs = differences(recorded, current)
    if not diffs:
        return ""
    parts = [
        f"field '{f}' is {json.dumps(current.get(f))} in the YAML but "
        f"{json.dumps(recorded[f])} since the first commit ({_fix(f, recorded[f], family)})"
        for f in diffs
    ]
    return (
        f"family {family.name!r}: its tables were first committed with another configuration"
        f"{when}: " + "; ".join(parts) + ". Nothing was read or changed."
    )


def check_family(
    store: Store, *, record: bool, run_id: str = "", once_per_run: bool = False
) -> None:
    """Everything that must hold before a step reads or writes a family's checkpoints: its
    tables' options (``schema.option_problems``), that its commits are serialised wherever they
    run (``serial_problem``), and its identity (``check_identity``). ``record``: the caller may
    commit (its first commit records the identity). ``once_per_run``: the steps of one run on
    one ``Store`` (the plan, then each shard a task compacts) share one check; a commit is
    still conditioned on its ledger partition's shard count, and a step that may record checks
    again unless every table was already recorded."""
    if once_per_run and run_id and store.owners.checked_run is not None:
        checked_id, covers_record = store.owners.checked_run
        if checked_id == run_id and (covers_record or not record):
            return
    store.owners.checked_run = None  # a check that fails below leaves nothing to skip the next one
    session = store.statements.session
    check_table_options(session, store.family)
    problem = serial_problem(
        store.family, replication_dcs(session, store.family.keyspace), local_dc(session)
    )
    if problem:
        raise SchemaError(problem)
    recorded = check_identity(store, record=record, run_id=run_id)
    store.owners.checked_run = (run_id, record or recorded) if run_id else None


def serial_problem(family: Family, dcs: set[str], here: str | None) -> str | None:
    """Why the family's commits would not be serialised, or None. Pure. A ``LOCAL_*``
    consistency commits with ``LOCAL_SERIAL``, a Paxos round among one data center's replicas:
    compactors in two data centers could both win a compare-and-set on the same bucket. So a
    keyspace replicated to several data centers needs the one that compacts named
    (``compaction_dc``), and only processes in it may compact."""
    if not family.consistency.value.startswith("LOCAL_") or len(dcs) <= 1:
        return None
    where = ", ".join(sorted(dcs))
    if family.compaction_dc is None:
        return (
            f"family {family.name!r}: consistency {family.consistency.value} commits with "
            f"LOCAL_SERIAL, which does not serialise compactors in different data centers, and "
            f"keyspace {family.keyspace} is replicated to {where}: set 'compaction_dc' to the "
            "one data center whose workers compact it, or use consistency QUORUM or EACH_QUORUM "
            "(commits with SERIAL across data centers). Nothing was read or changed."
        )
    if family.compaction_dc not in dcs:
        return (
            f"family {family.name!r}: compaction_dc is {family.compaction_dc!r}, which keyspace "
            f"{family.keyspace} is not replicated to ({where}). Nothing was read or changed."
        )
    if here != family.compaction_dc:
        return (
            f"family {family.name!r} compacts in data center {family.compaction_dc!r} "
            f"(compaction_dc) and this process's local data center is {here!r}: run it on a "
            f"worker in {family.compaction_dc!r} (CASSANDRA_LOCAL_DC, or the connection's "
            "local_dc). Nothing was read or changed."
        )
    return None


def replication_dcs(session: Any, keyspace: str) -> set[str]:
    """The data centers a keyspace's replicas are in, read from ``system_schema`` on every
    check (one request): the driver's copy, without schema events, would keep a replication
    changed since it was read (a data center added) for the life of the process. The driver is
    also made to know the keyspace (token-aware routing needs its replication)."""
    from cassandra import DriverException

    keyspace_metadata(session, keyspace)
    every_dc = {host.datacenter for host in session.cluster.metadata.all_hosts() if host.datacenter}
    try:
        row = session.execute(
            "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = %s",
            (keyspace,),
        ).one()
    except DriverException:  # unread: every data center, the answer that refuses the most
        return every_dc
    return dcs_of(dict(row[0]) if row is not None else {}, every_dc)


def dcs_of(replication: dict[str, str], every_dc: set[str]) -> set[str]:
    """The data centers of a keyspace's replication map (pure): a ``NetworkTopologyStrategy``'s
    data centers with a factor above 0; every data center for any other strategy, which places
    replicas around the ring whatever their data center (and for a keyspace not found)."""
    if not replication.get("class", "").endswith("NetworkTopologyStrategy"):
        return set(every_dc)
    return {
        dc
        for dc, factor in replication.items()
        if dc not in ("class", "replication_factor") and factor.isdigit() and int(factor) > 0
    }


def local_dc(session: Any) -> str | None:
    """The data center the driver treats as local (its DC-aware policy's)."""
    from cassandra.cluster import EXEC_PROFILE_DEFAULT

    policy = session.cluster.profile_manager.profiles[EXEC_PROFILE_DEFAULT].load_balancing_policy
    while policy is not None:
        if getattr(policy, "local_dc", None):
            return policy.local_dc
        policy = getattr(policy, "_child_policy", None)
    return None


def check_partition(store: Store, shard: int, bucket: int, ledger: Ledger) -> None:
    """Refuse to work a ledger partition committed under another shard count, or fenced by a
    reshard under way (its commits would not apply: say why instead of retrying)."""
    family = store.family
    if ledger.shards is None or ledger.shards == family.shards:
        return
    if ledger.shards == MOVING:
        raise IdentityMismatch(
            f"family {family.name!r}: ledger partition {shard}/{bucket} is being moved by a "
            f"reshard under way; finish it with `counterctl reshard --family {family.name} "
            "--shards N`. Nothing more was changed."
        )
    raise IdentityMismatch(
        f"family {family.name!r}: ledger partition {shard}/{bucket} belongs to "
        f"{ledger.shards} shards and the YAML says {family.shards}: "
        f"{_fix('shards', ledger.shards, family)}. Nothing more was changed."
    )


def check_identity(store: Store, *, record: bool, run_id: str = "") -> bool:
    """Refuse (``IdentityMismatch``) a family whose YAML differs from what its tables were
    first committed with, or whose tables another family owns. ``record``: the caller may
    commit, and records the identity where none is yet (its first commit). Returns whether
    every table's identity was already recorded."""
    family = store.family
    current = family_identity(family)
    try:
        owners = store.owners.table_owners()
    except InvalidRequest as exc:
        if TABLES_TABLE not in str(exc):
            raise
        raise SchemaError(
            f"family {family.name!r}: table {family.keyspace}.{TABLES_TABLE} is missing (this "
            f"version records each family's identity there): run `counterctl init --family "
            f"{family.name}`. Nothing was read or changed."
        ) from None
    for table, owner in owners.items():
        reason = refusal(family, table, owner, current)
        if reason:
            raise IdentityMismatch(reason)
    missing = [t for t in family.tables if t not in owners]
    if not missing:
        return True
    _check_unrecorded(store)
    if not record:
        return False
    for table in missing:
        recorded = store.owners.claim_table(table, encode(current), run_id)
        if recorded is not None:  # another first commit recorded it meanwhile
            reason = refusal(family, table, recorded, current)
            if reason:
                raise IdentityMismatch(reason)
    return True


def _check_unrecorded(store: Store) -> None:
    """A family committed by a version that did not record identities: its shard count is
    checked against what it left (the shard count of its first finished run, and where its
    ledger holds counters)."""
    family = store.family
    shards = store.state.family_state().shards
    if shards is not None and shards != family.shards:
        raise IdentityMismatch(
            f"family {family.name!r}: field 'shards' is {family.shards} in the YAML but the "
            f"family's ledger was written with {shards} shards (a counter's checkpoint is found "
            f"by its shard, so it would not be found and its rows would be counted again); "
            f"{_fix('shards', shards, family)}. Nothing was read or changed."
        )
    positions = store.ledger.ledger_positions(LEDGER_SAMPLE)
    tokens = [(shard, bucket, store.keys.token(counter)) for shard, bucket, counter in positions]
    if all(bucket_of(token, family.shards) == (s, b) for s, b, token in tokens):
        return
    written = written_shards(tokens)
    said = f"{written} shards" if written else "another shard count"
    raise IdentityMismatch(
        f"family {family.name!r}: field 'shards' is {family.shards} in the YAML but the "
        f"family's ledger was written with {said} (a counter's checkpoint is found by its "
        f"shard, so it would not be found and its rows would be counted again); "
        f"{_fix('shards', written or '<the earlier count>', family)}. Nothing was read or changed."
    )


def written_shards(tokens: list[tuple[int, int, int]], most: int = 256) -> int | None:
    """The shard count that puts every ``(shard, bucket, token)`` where it was found."""
    for shards in range(1, most + 1):
        if all(bucket_of(token, shards) == (s, b) for s, b, token in tokens):
            return shards
    return None
