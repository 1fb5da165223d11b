"""An upgrade on the real node: tables, ledger, run log, resets and audit rows written by an
earlier version of this project, then this version running on them.

The earlier version is commit ``OLD_VERSION`` of this repository (the last before the
ledger's ``pending_low_ms``), extracted with ``git archive`` and run in a subprocess with its
own ``include`` on ``PYTHONPATH``: its ``counterctl`` (``counters.cli``, in that process)
creates the tables, compacts, resets and reads; its write API records the increments. What it
leaves differs from what this version writes: the ledger's checkpoint in separate columns (no
``state`` cell, no ``pending_low_ms``, no ``origin_ms``), the run log's counted keys as JSON
(not key bytes), the audit trail in ``counters_audit`` (one partition per family, not by
month), and a reset known only by its checkpoint (epoch at the point, value 0). This
version's ``counterctl init`` then upgrades the tables, and its runs carry on: readers exact
before, at every point of the first runs and after; a commit the old version made but never
cleaned up (it crashed) deleted once; the old resets respected; the old audit rows read with
the new ones.

~20 s for both tests at a load of 3.5 on 2 cores, ~50 s at 9: two dozen schema changes in
a keyspace of its own (the old version creates its tables as it created them, the shared ones
included) and its drop, two processes of the old version, and the first Great Expectations
validation of the session when no test ran one before.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tarfile
import textwrap
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from io import BytesIO
from pathlib import Path

import pytest
from click.testing import CliRunner
from counters import engine
from counters.cli import cli
from counters.client import CounterClient, Increment
from counters.config import Catalog, load_catalog
from counters.connection import Connection
from counters.core import utc_aware
from counters.schema import LEGACY_AUDIT_TABLE
from counters.store import Store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
OLD_VERSION = "243df4d"
"""verify: recount each commit above its earliest counted row (2026-11-24), the parent of the
ledger's ``pending_low_ms`` (433c153), before the run log's key bytes (ca04f9c), the ledger's
``state`` cell (f7e1bd9), the audit trail by month (13151dd) and reset points (``origin_ms``)."""

OLD_SCRIPT = textwrap.dedent(
    """
    # Runs under the old version's package: its CLI for each "cli" step, its write API for
    # "record", and a run that dies at a point ("crash": the last step; the process exits 75).
    import json, os, sys
    from datetime import datetime
    from counters import engine
    from counters.cli import cli
    from counters.client import CounterClient, Increment
    from counters.config import load_catalog
    from counters.connection import connect
    from counters.store import Store
    import counters

    assert counters.__file__.startswith(os.environ["PYTHONPATH"]), counters.__file__

    config, steps = sys.argv[1], json.loads(sys.argv[2])
    catalog = load_catalog(config)
    conn = None
    for step in steps:
        if "cli" in step:
            try:
                cli.main(["--config", config, *step["cli"]], prog_name="counterctl")
            except SystemExit as exc:
                if exc.code:
                    raise
            continue
        conn = conn or connect()
        family = catalog.get(step["family"])
        if "record" in step:
            CounterClient(conn, family).record(
                Increment((c,), n, datetime.fromisoformat(t), (a, v))
                for c, n, t, a, v in step["record"]
            )
        elif "crash" in step:
            class Died(BaseException):
                pass

            def fault(point):
                if point == step["crash"]:
                    raise Died(point)

            try:
                engine.run_family(
                    Store(conn, family),
                    datetime.fromisoformat(step["epoch"]),
                    step["run_id"],
                    fault=fault,
                )
            except Died:
                sys.stdout.flush()
                os._exit(75)
            raise SystemExit("the run did not reach " + step["crash"])
    """
)


@pytest.fixture(scope="module")
def old_include(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The old version's ``include`` (its package and nothing else), from git."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", OLD_VERSION, "include/counters"],
        check=True,
        capture_output=True,
    ).stdout
    root = tmp_path_factory.mktemp("old_version")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return root / "include"


def run_old(old_include: Path, config: Path, steps: list[dict], crashes: bool = False) -> str:
    """The old version in a process of its own, as an operator of that release ran it."""
    env = {**os.environ, "PYTHONPATH": str(old_include)}
    env.pop("COUNTERS_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-c", OLD_SCRIPT, str(config), json.dumps(steps)],
        env=env,
        cwd=old_include,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == (75 if crashes else 0), done.stdout + done.stderr
    return done.stdout


@dataclass
class Upgraded:
    """What the old version left, after this version's ``counterctl init``: the families (an
    increments one, a rows one), their stores and clients, the truth of every counter, the
    times runs used and the id of the run that died."""

    old_include: Path
    config: Path
    catalog: Catalog
    stores: dict[str, Store]
    clients: dict[str, CounterClient]
    truth: dict[str, dict[str, int]]
    t0: datetime
    e2: datetime
    e3: datetime
    old_runs: list[str]
    dead_run: str
    audit_rows_moved: dict[str, int]

    @property
    def increments(self) -> str:
        return self.catalog.families[0].name

    @property
    def rows(self) -> str:
        return self.catalog.families[1].name


@pytest.fixture(scope="module")
def upgrade_keyspace(conn: Connection) -> Iterator[str]:
    """A keyspace of its own: the old version creates its shared tables (audit, lease, family
    state, table owners) as it created them, not as this version's tests have them."""
    keyspace = f"t_upgrade_{secrets.token_hex(3)}"
    conn.session.execute(
        f"CREATE KEYSPACE {keyspace} WITH replication = "
        "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    yield keyspace
    conn.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=300)


@pytest.fixture(scope="module")
def upgraded(
    conn: Connection,
    upgrade_keyspace: str,
    old_include: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Upgraded:
    """The old version: ``counterctl init``, increments by its
    write API, a run of each family, a reset of an increments counter and of a rows counter,
    the rows family's next run, and the increments family's next run dying after its commits
    were verified and before their cleanup (the rows it counted left, its commits in the
    ledger). Then this version's ``counterctl init``: the new columns, the audit rows moved
    into month partitions."""
    keyspace = upgrade_keyspace
    suffix = keyspace.removeprefix("t_upgrade_")
    now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    t0 = now - timedelta(days=1)
    incs, rows_family = f"inc_{suffix}", f"rows_{suffix}"
    config = tmp_path_factory.mktemp("upgrade") / "families.yaml"
    config.write_text(
        f"""families:
  - name: {incs}
    kind: increments
    keyspace: {keyspace}
    raw_table: raw_{suffix}
    compact_table: compact_{suffix}
    lag: 1m
    shards: 2
  - name: {rows_family}
    kind: rows
    keyspace: {keyspace}
    raw_table: orders_{suffix}
    compact_table: order_counts_{suffix}
    columns:
      key: location
      time: placed_at
    lag: 1m
    shards: 1
"""
    )
    conn.session.execute(  # a rows family's raw table is the application's
        f"CREATE TABLE {keyspace}.orders_{suffix} (location text, placed_at timestamp, "
        "order_id int, PRIMARY KEY ((location), placed_at, order_id))"
    )

    # the data, by time: the truth is what each counter counts after its reset point
    e1, reset_at, e2, e3 = (t0 + timedelta(minutes=m) for m in (10, 15, 20, 30))
    old_events = [
        (counter, amount, iso(t0 + timedelta(minutes=minute, seconds=second)), "w", i)
        for i, (counter, amount, minute, second) in enumerate(
            [
                ("a", 5, 1, 0),
                ("a", 7, 12, 0),
                ("a", 11, 17, 30),
                ("b", 2, 3, 0),
                ("b", 3, 9, 59),
                ("c", 100, 18, 0),
                ("r", 1_000, 2, 0),
                ("r", 2_000, 14, 0),
                ("r", 40, 15, 0),  # at the reset point: consumed by it
                ("r", 300, 16, 0),
                ("r", 4, 19, 0),
            ]
        )
    ]
    truth = {incs: {"a": 23, "b": 5, "c": 100, "r": 304, "n": 0}}
    orders = [("x", 1), ("x", 9), ("x", 16), ("x", 19), ("y", 2), ("y", 12), ("y", 15)]
    orders += [("y", 17), ("y", 18), ("y", 25)]
    truth[rows_family] = {"x": 4, "y": 3}  # y: reset at 15, its rows after it: 17, 18, 25
    insert_order = conn.session.prepare(
        f"INSERT INTO {keyspace}.orders_{suffix} (location, placed_at, order_id) VALUES (?, ?, ?)"
    )
    for i, (location, minute) in enumerate(orders):
        conn.session.execute(insert_order, (location, t0 + timedelta(minutes=minute), i))

    old_runs = [f"old-{suffix}-1", f"oldr-{suffix}-1", f"oldr-{suffix}-2"]
    dead_run = f"old-{suffix}-2"
    run_old(
        old_include,
        config,
        [
            {"cli": ["init"]},
            {"family": incs, "record": old_events},
            {"cli": ["compact", "--family", incs, "--epoch", iso(e1), "--run-id", old_runs[0]]},
            {
                "cli": [
                    "compact",
                    "--family",
                    rows_family,
                    "--epoch",
                    iso(e1),
                    "--run-id",
                    old_runs[1],
                ]
            },
            {"cli": ["reset", "--family", incs, "--at", iso(reset_at), "r"]},
            {"cli": ["reset", "--family", rows_family, "--at", iso(reset_at), "y"]},
            {
                "cli": [
                    "compact",
                    "--family",
                    rows_family,
                    "--epoch",
                    iso(e2),
                    "--run-id",
                    old_runs[2],
                ]
            },
            {"family": incs, "crash": "cleanup_read_log", "epoch": iso(e2), "run_id": dead_run},
        ],
        crashes=True,
    )
    catalog = load_catalog(config)
    runs_table = f"{keyspace}.compact_{suffix}_runs"
    old_records = list(conn.session.execute(f"SELECT run_id, keys FROM {runs_table}"))
    assert {r.run_id for r in old_records} >= {old_runs[0], dead_run}
    assert all(  # what the old version left: the counted keys as JSON
        zlib.decompress(r.keys).startswith(b"[[") for r in old_records
    ), old_records[:1]
    ledger = conn.session.execute(f"SELECT * FROM {keyspace}.compact_{suffix}_ledger").one()
    assert "state" not in ledger._fields and "origin_ms" not in ledger._fields
    left = conn.session.execute(  # the dead run's counted row: never deleted
        f"SELECT count(*) FROM {keyspace}.raw_{suffix} WHERE type = 'c'"
    ).one()[0]
    assert left == 1

    upgrade = CliRunner().invoke(cli, ["--config", str(config), "init", "--json"])
    assert upgrade.exit_code == 0, upgrade.output
    moved = {d["family"]: d["audit_rows_moved"] for d in json.loads(upgrade.stdout)}
    stores = {f.name: Store(conn, f) for f in catalog.families}
    return Upgraded(
        old_include,
        config,
        catalog,
        stores,
        {name: CounterClient(conn, s.family, s) for name, s in stores.items()},
        truth,
        t0,
        e2,
        e3,
        old_runs,
        dead_run,
        moved,
    )


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds")


class ExactReaders:
    """Reads every counter of a family at every point a run reaches (its fault hook) and keeps
    each value that is not the truth: no write lands during the run, so a reader's value must
    be the true one at every point."""

    def __init__(self, client: CounterClient, truth: dict[str, int]):
        self.client = client
        self.truth = truth
        self.points: list[str] = []
        self.wrong: list[tuple[str, str, int, int]] = []

    def read(self, point: str) -> None:
        for value in self.client.read_many(list(self.truth)):
            counter = str(value.counter[0])
            if value.value != self.truth[counter]:
                self.wrong.append((point, counter, value.value, self.truth[counter]))

    def __call__(self, point: str) -> None:
        self.points.append(point)
        self.read(point)


def test_an_increments_family_carries_on_from_an_earlier_version(
    conn: Connection, upgraded: Upgraded
) -> None:
    """Readers exact before this version's first run, at every point of the dead run's retry
    (its Airflow retry: the same run id and epoch; its commits in the old run log's JSON) and
    of the next run (with increments this version's write API recorded meanwhile), and after;
    the old reset held; every counted row deleted, once; the old audit rows, moved by month,
    read with this version's."""
    name, t0 = upgraded.increments, upgraded.t0
    store, client, truth = upgraded.stores[name], upgraded.clients[name], upgraded.truth[name]
    readers = ExactReaders(client, truth)
    readers.read("before the first run")
    assert not readers.wrong, readers.wrong

    retry = engine.run_family(
        store, upgraded.e2, upgraded.dead_run, fault=readers, now=upgraded.e2 + timedelta(minutes=5)
    )
    assert retry.outcome == "success", retry.message
    assert not readers.wrong, readers.wrong[:10]
    new_events = [("a", 1_000_000, 21), ("n", 9, 22), ("r", 50, 29), ("b", -2, 25)]
    client.record(
        Increment((c,), n, utc_aware(t0 + timedelta(minutes=m)), ("new", m))
        for c, n, m in new_events
    )
    for c, n, _m in new_events:
        truth[c] += n
    summary = engine.run_family(
        store, upgraded.e3, f"new-{name}", fault=readers, now=upgraded.e3 + timedelta(minutes=5)
    )
    assert summary.outcome == "success", summary.message
    assert {"commit", "copy", "verify", "cleanup_delete"} <= set(readers.points)
    readers.read("after")
    assert not readers.wrong, readers.wrong[:10]

    # a reader still on the old version's library (an application not upgraded yet): exact too
    read = run_old(
        upgraded.old_include,
        upgraded.config,
        [{"cli": ["read", "--family", name, "--json", *truth]}],
    )
    assert {v["counter"]: v["value"] for v in json.loads(read)} == truth

    family = store.family
    for counter in truth:  # every counted row deleted: none left at or below the epoch
        rows = conn.session.execute(
            f"SELECT modify_time FROM {family.keyspace}.{family.raw_table} WHERE type = %s",
            (counter,),
        )
        assert [r.modify_time for r in rows if r.modify_time <= upgraded.e3] == [], counter

    assert upgraded.audit_rows_moved[name] == 2  # the old run and the old reset
    audit = {r["run_id"]: r for r in store.audit.page(50)}
    first = audit[upgraded.old_runs[0]]
    assert (first["outcome"], first["rows_folded"], first["sum_folded"]) == ("success", 4, 1_010)
    reset = [r for r in audit.values() if r["outcome"] == "reset"]
    assert len(reset) == 1 and "counter r reset from 3344 to 0" in reset[0]["message"], reset
    assert audit[upgraded.dead_run]["outcome"] == "success"
    assert audit[f"new-{name}"]["outcome"] == "success"
    legacy = conn.session.execute(  # left there if younger than the move's margin: copies
        f"SELECT run_id FROM {family.keyspace}.{LEGACY_AUDIT_TABLE} WHERE family = %s", (name,)
    )
    assert {r.run_id for r in legacy} <= set(audit)


def test_a_rows_family_holds_a_reset_an_earlier_version_made(
    conn: Connection, upgraded: Upgraded
) -> None:
    """A rows counter reset by the old version (its value counts the rows after the reset
    point; the rows before it are the application's, kept) read exactly before, at every
    point of this version's first run (a sweep: it recounts each counter from its reset
    point) and after; ``reconcile`` finds no difference; the old audit rows read."""
    name = upgraded.rows
    store, truth = upgraded.stores[name], upgraded.truth[name]
    readers = ExactReaders(upgraded.clients[name], truth)
    readers.read("before the first run")
    assert not readers.wrong, readers.wrong
    summary = engine.run_family(
        store, upgraded.e3, f"new-{name}", fault=readers, now=upgraded.e3 + timedelta(minutes=5)
    )
    assert summary.outcome == "success", summary.message
    assert summary.plan.sweep
    readers.read("after")
    assert not readers.wrong, readers.wrong[:10]
    assert engine.reconcile(store, repair=False) == []

    assert upgraded.audit_rows_moved[name] == 3  # two runs and a reset
    audit = {r["run_id"]: r["outcome"] for r in store.audit.page(50)}
    assert [audit[run] for run in upgraded.old_runs[1:]] == ["success", "success"]
    assert audit[f"new-{name}"] == "success"
