"""Adversarial review of round 42 (the Store composed by tables, the typed RunPlan across XCom,
ShardJob, one time format): each test reproduces a finding on the real node and asserts the
correct behaviour."""

from __future__ import annotations

import secrets
from datetime import timedelta

import pytest
from counters import engine
from counters.schema import SchemaError

pytestmark = pytest.mark.integration


def test_an_idle_dry_run_leaves_the_family_epoch_where_it_was(make_family, t0):
    """A dry run writes nothing (``counterctl compact --dry-run``, the DAG's ``dry_run``
    param). An idle plan (nothing touched, nothing quarantined, no sweep due) advanced the
    family's compacted epoch inside ``plan_run`` whether or not the run was a dry run: the
    dry run moved the epoch every later run is planned against, while its audit row said it
    moved nothing."""
    _family, store, _client = make_family(shards=1)
    before = t0 - timedelta(days=1)
    # no sweep due (the last one is ahead of the runs' clock), nothing touched: idle
    store.state.advance_family_epoch(before, "setup", swept_at=t0 + timedelta(days=2))
    epoch = t0 + timedelta(minutes=1)
    dry = engine.run_family(store, epoch, dry_run=True, now=epoch + timedelta(minutes=5))
    assert dry.plan.idle and dry.plan.dry_run
    assert store.state.family_epoch() == before, "the dry run moved the compacted epoch"
    real = engine.run_family(store, epoch, now=epoch + timedelta(minutes=5))
    assert real.outcome == "idle" and store.state.family_epoch() == epoch


def _timeuuid_table(conn, keyspace: str) -> str:
    """An existing raw table whose time column is a timeuuid, with an increment column."""
    table = f"ticks_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE TABLE {keyspace}.{table} (k text, at timeuuid, id int, amount bigint, "
        "PRIMARY KEY ((k), at, id))"
    )
    return table


def test_an_increments_family_on_a_timeuuid_time_column_is_refused(
    conn, engine_keyspace, make_family
):
    """The schema check took a timeuuid time column for every kind, but only a rows family
    (counted by server-side slices) is consistent with it: an increments family folds each row
    by its time in milliseconds (``toUnixTimestamp``) while its recount and the readers' bound
    split at the epoch's first timeuuid tick, and its readers bind the copy's timestamp epoch
    to the timeuuid column. On the node, after one run, every read of such a counter failed
    (a timestamp bound to a timeuuid). Refused at init and at every step, naming the field."""
    table = _timeuuid_table(conn, engine_keyspace)
    with pytest.raises(SchemaError, match=r"columns\.time 'at' is a timeuuid"):
        make_family(raw_table=table, columns={"key": "k", "time": "at", "increment": "amount"})
