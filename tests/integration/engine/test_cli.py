"""counterctl end to end: exit codes and one-line reasons (real node, CliRunner)."""

from __future__ import annotations

import json
import secrets
import threading
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from counters.cli import cli
from counters.core import utc_aware

from .helpers import aware

pytestmark = pytest.mark.integration


@pytest.fixture
def families_file(tmp_path, engine_keyspace):
    suffix = secrets.token_hex(3)
    path = tmp_path / "families.yaml"
    path.write_text(
        f"""families:
  - name: cli_{suffix}
    keyspace: {engine_keyspace}
    raw_table: raw_{suffix}
    compact_table: compact_{suffix}
    lag: 1m
    shards: 2
"""
    )
    return path, f"cli_{suffix}", f"raw_{suffix}"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_every_command_has_help():
    for name, command in cli.commands.items():
        assert command.help, f"counterctl {name} has no help text"
        assert invoke(name, "--help").exit_code == 0


def test_init_write_compact_read_audit(families_file, conn, engine_keyspace, monkeypatch):
    from counters.gx import checks

    path, family, raw = families_file
    assert invoke("--config", path, "init").exit_code == 0
    past = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=10)
    conn.session.execute(
        f"INSERT INTO {engine_keyspace}.{raw} (type, modify_time, actor, version, increment) "
        "VALUES ('IBM', %s, 'a', 1, 1000)",
        (past,),
    )
    prepared: list[str] = []
    real_prepare = checks.prepare

    def prepare(name: str) -> threading.Thread:
        prepared.append(name)
        return real_prepare(name)

    monkeypatch.setattr(checks, "prepare", prepare)
    result = invoke("--config", path, "compact", "--family", family, "--workers", 2, "--json")
    assert result.exit_code == 0, result.output
    # its process only waits while its shard processes (2) compact: it builds the family's GX
    # suite then, not between the compact and the cleanup steps (GX's import costs seconds)
    assert prepared == [family]
    summary = json.loads(result.stdout)  # the log (GX's warnings under pytest) on stderr
    # a row written straight into the raw table (no index mark) is found by the first run's
    # sweep: the default discovery sees every writer
    assert summary["outcome"] == "success" and summary["sweep"]
    assert (summary["counters_committed"], summary["rows_folded"]) == (1, 1)
    assert summary["requests"]  # requests per phase, for the benchmark
    read = invoke("--config", path, "read", "--family", family, "IBM")
    assert read.exit_code == 0 and read.output.startswith("IBM\t1000\t(compact 1000 @"), read.output
    held = invoke("--config", path, "quarantine", "--family", family)
    assert held.exit_code == 0 and "0 counter(s) quarantined" in held.output
    audit = invoke("--config", path, "audit", "--family", family, "--limit", "5")
    assert audit.exit_code == 0 and "success" in audit.output


def test_again_is_a_noop_exit_0(families_file):
    path, family, _ = families_file
    invoke("--config", path, "init")
    epoch = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    assert invoke("--config", path, "compact", "--family", family, "--epoch", epoch).exit_code == 0
    again = invoke("--config", path, "compact", "--family", family, "--epoch", epoch)
    assert again.exit_code == 0 and "nothing to do" in again.output


@pytest.mark.parametrize(
    ("yaml_line", "message"),
    [
        ("    lag: 0s", "field 'lag': lag must be > 0"),
        ("    lag: [", "malformed YAML"),
    ],
)
def test_bad_config_exit_2_names_field(families_file, yaml_line, message):
    path, family, _ = families_file
    text = path.read_text().replace("    lag: 1m", yaml_line)
    path.write_text(text)
    result = invoke("--config", path, "compact", "--family", family)
    assert result.exit_code == 2
    assert message in result.output


def test_unknown_family_exit_2(families_file):
    path, family, _ = families_file
    result = invoke("--config", path, "compact", "--family", "nope")
    assert result.exit_code == 2
    assert "unknown family 'nope'" in result.output and family in result.output


def test_missing_tables_exit_2(families_file):
    path, family, _raw = families_file
    result = invoke("--config", path, "compact", "--family", family)
    assert result.exit_code == 2
    assert "raw table" in result.output and "does not exist" in result.output


def test_future_epoch_exit_2(families_file):
    path, family, _ = families_file
    invoke("--config", path, "init")
    result = invoke(
        "--config", path, "compact", "--family", family, "--epoch", datetime.now(UTC).isoformat()
    )
    assert result.exit_code == 2 and "later than now - lag" in result.output


def test_null_increment_quarantines_exit_4_deletes_nothing_of_it(
    families_file, conn, engine_keyspace
):
    path, family, raw = families_file
    invoke("--config", path, "init")
    from counters.client import CounterClient
    from counters.config import load_catalog
    from counters.connection import connect

    fam = load_catalog(path).get(family)
    with connect() as c:
        client = CounterClient(c, fam)
        at = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=10)
        client.increment("IBM", 5, at=aware(at), actor="a", version=1)
        client.increment("IBM", 7, at=aware(at), actor="a", version=2)
    conn.session.execute(
        f"UPDATE {engine_keyspace}.{raw} SET increment = null WHERE type = 'IBM' "
        "AND modify_time = %s AND actor = 'a' AND version = 2",
        (at,),
    )
    result = invoke("--config", path, "compact", "--family", family)
    assert result.exit_code == 4
    assert "1 counter(s) quarantined" in result.output and "IBM" in result.output
    rows = conn.session.execute(f"SELECT count(*) FROM {engine_keyspace}.{raw}").one()[0]
    assert rows == 2
    held = invoke("--config", path, "quarantine", "--family", family)
    assert held.exit_code == 0 and "IBM\tbad_rows" in held.output


def test_lease_held_exit_3(families_file, conn):
    path, family, _ = families_file
    invoke("--config", path, "init")
    from counters.config import load_catalog
    from counters.store import Store

    store = Store(conn, load_catalog(path).get(family))
    assert store.lease.acquire_lease(0, "someone-else", 60) is None
    result = invoke("--config", path, "compact", "--family", family)
    assert result.exit_code == 3 and "held by run 'someone-else'" in result.output
    store.lease.release_lease(0, "someone-else")


def test_unreachable_cassandra_exit_5(families_file, monkeypatch):
    path, family, _ = families_file
    monkeypatch.setenv("CASSANDRA_PORT", "1")
    result = invoke("--config", path, "read", "--family", family, "IBM")
    assert result.exit_code == 5 and "cannot reach Cassandra" in result.output


# --- reset and reshard: dry runs and confirmation ----------------------------------------


def everything(store) -> dict:
    """Every row a reset or a reshard could change: the ledger of every partition the family
    may use, the compact and raw tables, the identity records and the audit trail."""
    f = store.family
    session = store.statements.session
    return {
        "ledger": [
            (shard, bucket, counter, sorted(row.items()))
            for shard in range(8)
            for bucket in range(16)
            for counter, row in store.ledger.ledger_rows(shard, bucket)
        ],
        "compact": sorted(session.execute(f"SELECT * FROM {f.keyspace}.{f.compact_table}")),
        "raw": sorted(session.execute(f"SELECT * FROM {f.keyspace}.{f.raw_table}")),
        "owners": store.owners.table_owners(),
        "audit": store.audit.page(50),
    }


@pytest.fixture
def compacted(families_file, conn):
    """A family of 40 counters, compacted once, with 3 newer rows of IBM."""
    from counters.client import CounterClient, Increment
    from counters.config import load_catalog
    from counters.store import Store

    path, family, _ = families_file
    assert invoke("--config", path, "init").exit_code == 0
    fam = load_catalog(path).get(family)
    client = CounterClient(conn, fam)
    past = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=30)
    client.record(
        [Increment((f"c{i}",), i + 1, utc_aware(past), ("w", i)) for i in range(40)]
        + [Increment(("IBM",), 10, utc_aware(past), ("w", 100))]
    )
    epoch = (past + timedelta(minutes=1)).isoformat()
    assert invoke("--config", path, "compact", "--family", family, "--epoch", epoch).exit_code == 0
    client.record(
        [
            Increment(("IBM",), 5, utc_aware(past + timedelta(minutes=2 + i)), ("w", 200 + i))
            for i in range(3)
        ]
    )
    return path, family, Store(conn, fam), client


def test_reset_dry_run_changes_nothing_and_says_what_it_would_do(compacted):
    path, family, store, client = compacted
    before = everything(store)
    result = invoke("--config", path, "reset", "--family", family, "--dry-run", "--json", "IBM")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert (plan["value_before"], plan["rows_consumed"], plan["already_done"]) == (25, 3, False)
    assert plan["dry_run"] is True
    assert everything(store) == before and client.read("IBM") == 25
    # and the reset itself, with --yes, does what the dry run said
    done = invoke("--config", path, "reset", "--family", family, "--yes", "--json", "IBM")
    assert done.exit_code == 0, done.output
    result = json.loads(done.output)
    assert (result["value_before"], result["rows_consumed"], result["dry_run"]) == (25, 3, False)
    assert client.read("IBM") == 0


def test_a_reset_declined_at_the_prompt_changes_nothing(compacted, monkeypatch):
    from counters.cli import common as cli_module

    path, family, store, client = compacted
    monkeypatch.setattr(cli_module, "stdin_is_terminal", lambda: True)
    before = everything(store)
    result = CliRunner().invoke(
        cli, ["--config", str(path), "reset", "--family", family, "IBM"], input="n\n"
    )
    assert result.exit_code == 1 and "reset IBM from 25 to 0" in result.output, result.output
    assert "Aborted" in result.output
    assert everything(store) == before and client.read("IBM") == 25
    accepted = CliRunner().invoke(
        cli, ["--config", str(path), "reset", "--family", family, "IBM"], input="y\n"
    )
    assert accepted.exit_code == 0 and client.read("IBM") == 0, accepted.output


def test_reshard_dry_run_changes_nothing_and_counts_what_moves(compacted):
    path, family, store, client = compacted
    before = everything(store)
    values = {c.counter: c.value for c in client.read_many([f"c{i}" for i in range(40)])}
    result = invoke(
        "--config", path, "reshard", "--family", family, "--shards", "5", "--dry-run", "--json"
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert (plan["shards_before"], plan["shards_after"], plan["checkpoints"]) == (2, 5, 41)
    assert 0 < plan["checkpoints_to_move"] < 41 and plan["dry_run"] is True
    assert everything(store) == before
    # the reshard moves exactly what the dry run counted
    done = invoke(
        "--config", path, "reshard", "--family", family, "--shards", "5", "--yes", "--json"
    )
    assert done.exit_code == 0, done.output
    moved = json.loads(done.output)
    assert moved["checkpoints_moved"] == plan["checkpoints_to_move"]
    assert set(moved) == set(plan), "reshard --json: one key set with and without --dry-run"
    assert (plan["checkpoints_moved"], moved["dry_run"]) == (0, False)
    resharded = store.with_shards(5)
    from counters.client import CounterClient

    after = CounterClient(store.conn, resharded.family, resharded)
    assert {c.counter: c.value for c in after.read_many([f"c{i}" for i in range(40)])} == values


def test_a_compaction_whose_gx_suite_fails_deletes_nothing_and_audits_failed(
    families_file, conn, engine_keyspace, tmp_path, monkeypatch
):
    """counterctl compact runs the GX suite as the DAG does: a rule of the suite that fails
    (the engine's own checks pass) fails the run before its cleanup, with one audit row."""
    from counters.config import load_catalog
    from counters.store import Store

    from tests.gx_rules import add_failing_rule

    path, name, raw = families_file
    monkeypatch.setenv("COUNTERS_GX_RESULTS", str(tmp_path / "gx-results"))
    assert invoke("--config", path, "init").exit_code == 0
    past = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=10)
    for version in (1, 2, 3):
        conn.session.execute(
            f"INSERT INTO {engine_keyspace}.{raw} (type, modify_time, actor, version, increment) "
            "VALUES ('IBM', %s, 'a', %s, 100)",
            (past + timedelta(seconds=version), version),
        )
    failing = add_failing_rule(monkeypatch)

    result = CliRunner().invoke(cli, ["--config", str(path), "compact", "--family", name])

    assert result.exit_code == 4, result.output  # a failed check
    assert failing in result.output and "nothing was deleted" in result.output, result.output
    left = conn.session.execute(f"SELECT count(*) FROM {engine_keyspace}.{raw}").one()[0]
    assert left == 3  # the cleanup never ran
    store = Store(conn, load_catalog(path).get(name))
    assert store.state.family_epoch() is None  # the epoch did not advance
    (row,) = store.audit.page(5)
    checks = json.loads(row["checks"])
    assert row["outcome"] == "failed" and row["rows_deleted"] == 0
    assert checks[failing].startswith("FAIL"), checks
    assert checks["gx:recount_equals_counted_rows"] == "pass", checks
    assert all(v == "pass" for k, v in checks.items() if not k.startswith("gx:")), checks
    assert failing in row["message"] and "nothing was deleted" in row["message"]
    assert row["gx_suite"] and (tmp_path / "gx-results" / name).is_dir()
    assert row["gx_result"].removeprefix("file://").startswith(str(tmp_path / "gx-results"))


def test_a_timestamp_key_given_with_an_offset_or_micros_names_its_utc_counter(
    tmp_path, conn, engine_keyspace
):
    """A timestamp key column's value given to the CLI is read as the table holds it (naive UTC
    to the ms; an offset honoured, no offset UTC): every form of one instant names the one
    counter, so the second reset below is the first one again. Before, an offset form reset
    under its own text (its own reset id) and a microsecond form was refused with a message
    about a commit the ledger did not hold. A value that is no time names the column and says
    what form to pass."""
    from counters.client import CounterClient
    from counters.config import load_catalog

    suffix = secrets.token_hex(3)
    conn.session.execute(
        f"CREATE TABLE {engine_keyspace}.raw_{suffix} (day timestamp, modify_time timestamp, "
        "actor text, version bigint, increment bigint, "
        "PRIMARY KEY ((day), modify_time, actor, version))"
    )
    path = tmp_path / "families.yaml"
    family = f"ts_{suffix}"
    path.write_text(
        f"""families:
  - name: {family}
    keyspace: {engine_keyspace}
    raw_table: raw_{suffix}
    compact_table: compact_{suffix}
    lag: 1m
    shards: 2
    columns:
      key: [day]
"""
    )
    assert invoke("--config", path, "init").exit_code == 0
    client = CounterClient(conn, load_catalog(path).get(family))
    day = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)
    client.increment((day,), 5, at=datetime.now(UTC) - timedelta(minutes=30))
    at = (datetime.now(UTC) - timedelta(minutes=5)).replace(second=0, microsecond=0)
    reset = ["--config", path, "reset", "--family", family, "--yes", "--json", "--at"]
    first = invoke(*reset, at.isoformat(), "2026-11-25T10:00:00+01:00")
    assert first.exit_code == 0, first.output
    done = json.loads(first.output)
    assert (done["counter"], done["value_before"], done["already_done"]) == (
        "2026-11-25 09:00:00",
        5,
        False,
    )
    again = invoke(*reset, at.isoformat(), "2026-11-25T09:00:00.000400Z")
    assert again.exit_code == 0, again.output
    repeated = json.loads(again.output)
    assert repeated["already_done"] is True and repeated["reset_id"] == done["reset_id"]
    assert client.read((day,)) == 0
    wrong = invoke(*reset, at.isoformat(), "2026-11-25T25:00")
    assert wrong.exit_code == 2
    assert "key column 'day' (timestamp): cannot parse '2026-11-25T25:00'" in wrong.output
    assert "e.g. 2026-11-22T10:00:00.000Z" in wrong.output
