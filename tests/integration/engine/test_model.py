"""Model-based test: random writes, retries, late writes, crashes and overlapping runs against the
real node, for every family kind, checked against a plain-Python oracle."""

from __future__ import annotations

import itertools
import os
import secrets
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime, timedelta

import pytest
from cassandra.util import uuid_from_time
from counters import engine
from counters.client import CounterClient, Increment
from counters.core import epoch_for, utc_aware
from counters.reshard import reshard
from counters.store import Store
from hypothesis import HealthCheck, Phase, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from .conftest import Crash
from .helpers import StalledRun, aware, forget_table_owners, rows_at_or_below

pytestmark = pytest.mark.integration

COUNTERS = ["IBM", "AAPL", "MSFT", "GOOG"]
POINTS = ["read_raw", *engine.FAULT_POINTS]  # read_raw twice: the stale-commit window
DAY = date(2026, 3, 29)
OVERLAP_POINTS = tuple(p for p in engine.FAULT_POINTS if p not in ("lease", "discover"))
"""Where the overlap rule's run A stalls: from its first read of a bucket on (it runs without a
lease, and a stall before any read is no overlap). Each kind keeps the points it reaches."""


@dataclass(frozen=True)
class Overlap:
    """What one step of the overlap rule did: where run A stalled, whether it waited there
    for all of run B (a real overlap), and how each run ended."""

    kind: str
    point: str
    overlapped: bool
    stalled: str
    rival: str


class Increments:
    """Oracle: the sum of distinct increments. A write is an increment row."""

    kind = "increments"
    overlap_points = tuple(p for p in OVERLAP_POINTS if p != "cleanup_mark")  # unique only

    def __init__(self, make_family, shards):
        self.shards = shards
        self.base, store, _client = make_family(shards=shards)
        self.layout = store.layout  # every example's family on these tables: checked once

    def family(self, make_family, name, shards):
        return make_family(
            name=name,
            raw_table=self.base.raw_table,
            compact_table=self.base.compact_table,
            shards=shards,
            layout=self.layout,
        )

    def key(self, counter):
        return (counter,)

    def write(self, machine, counter, amount, at, ident):
        event = Increment((counter,), amount, utc_aware(at), ("w", ident))
        machine.client.record([event])
        machine.oracle[counter] += amount
        return event

    def write_new(self, machine, counter, amount, at, ident):
        """A write that is sure to be a row no run has folded yet (every increment is)."""
        return self.write(machine, counter, amount, at, ident)

    def retry(self, machine, event):
        machine.client.record([event])

    def foreign(self, machine, counter, amount, at, ident):
        """Seed 004's own writer: a plain CQL INSERT, no index mark, the driver's timestamp.
        Only a sweep finds it. (It is never retried after its row was folded and deleted:
        such a retry would count again, the documented limit of writers outside the API.)"""
        f = machine.family
        machine.store.statements.session.execute(
            f"INSERT INTO {f.keyspace}.{f.raw_table} (type, modify_time, actor, version, "
            "increment) VALUES (%s, %s, 'foreign', %s, %s)",
            (counter, at, ident, amount),
        )
        machine.oracle[counter] += amount

    def settle(self, machine):
        pass

    def check_rows(self, machine, epoch):
        for counter in machine.counters:
            assert rows_at_or_below(machine.store, (counter,), epoch) == 0


class Rows:
    """Oracle: the number of distinct business rows (seed 003's orders); rows never deleted."""

    kind = "rows"
    # a kept family's cleanup deletes nothing: it returns before marking or deleting
    overlap_points = tuple(p for p in OVERLAP_POINTS if p not in ("cleanup_mark", "cleanup_delete"))

    def __init__(self, make_family, shards):
        self.shards = shards
        self.table = f"orders_{secrets.token_hex(3)}"
        self.layout = None  # the first example's family creates the tables; later ones reuse
        make_family.session.execute(
            f"CREATE TABLE {make_family.keyspace}.{self.table} (location text, day date, "
            "at timeuuid, order_id int, PRIMARY KEY ((location, day), at, order_id))"
        )

    def family(self, make_family, name, shards):
        family, store, client = make_family(
            name=name,
            kind="rows",
            raw_table=self.table,
            compact_table=f"{self.table}_counts",
            shards=shards,
            columns={"key": ["location", "day"], "time": "at"},
            layout=self.layout,
        )
        self.layout = store.layout
        self.insert = store.statements.session.prepare(
            f"INSERT INTO {family.keyspace}.{self.table} (location, day, at, order_id) "
            "VALUES (?, ?, ?, ?)"
        )
        return family, store, client

    def key(self, counter):
        return (counter, DAY)

    def write(self, machine, counter, amount, at, ident):
        del amount
        row = (counter, DAY, uuid_from_time(at), ident)
        machine.store.statements.session.execute(self.insert, row)
        machine.oracle[counter] += 1
        return row

    def write_new(self, machine, counter, amount, at, ident):
        """A new order (every order id is)."""
        return self.write(machine, counter, amount, at, ident)

    def retry(self, machine, row):
        machine.store.statements.session.execute(self.insert, row)  # the same row: no new order

    def settle(self, machine):
        # rows written behind a checkpoint: caught by a sweep (every run, discovery scan) and
        # by reconcile (docs/correctness.md)
        engine.reconcile(machine.store, repair=True)

    def check_rows(self, machine, epoch):
        f = machine.family
        total = sum(
            machine.store.statements.session.execute(
                f"SELECT count(*) FROM {f.keyspace}.{self.table} WHERE location = %s AND day = %s",
                (counter, DAY),
            ).one()[0]
            for counter in machine.counters
        )
        assert total == sum(machine.oracle.values())  # no business row lost


class Unique:
    """Oracle: the set of distinct members (seed 000); writers race, crash, run behind."""

    kind = "unique"
    overlap_points = OVERLAP_POINTS

    def __init__(self, make_family, shards):
        self.shards = shards
        self.base, store, _client = make_family(
            kind="unique",
            raw_table=f"set_{secrets.token_hex(3)}",
            shards=shards,
            columns={"key": "meeting", "member": "user"},
        )
        self.layout = store.layout  # every example's family on these tables: checked once

    def family(self, make_family, name, shards):
        return make_family(
            name=name,
            kind="unique",
            raw_table=self.base.raw_table,
            shards=shards,
            compact_table=self.base.compact_table,
            columns={"key": "meeting", "member": "user"},
            layout=self.layout,
        )

    def key(self, counter):
        return (counter,)

    def write(self, machine, counter, amount, at, ident):
        member = f"u{amount % 7}"  # a small pool: many repeats
        if ident % 5 == 0:  # a writer that crashes between the member and its derived row
            machine.store.raw.add_member((counter,), member, at)
        else:
            machine.client.add_member(counter, member, at=aware(at))
        machine.members[counter].add(member)
        machine.oracle[counter] = len(machine.members[counter])
        return (counter, member, at)

    def write_new(self, machine, counter, amount, at, ident):
        """A member never seen before, through the write API: a derived row for the next run
        to fold (a repeated member adds none, and a crashed writer leaves no mark)."""
        del amount
        member = f"new{ident}"
        machine.client.add_member(counter, member, at=aware(at))
        machine.members[counter].add(member)
        machine.oracle[counter] = len(machine.members[counter])
        return (counter, member, at)

    def retry(self, machine, event):
        counter, member, at = event
        machine.client.add_member(counter, member, at=aware(at + timedelta(seconds=30)))

    def settle(self, machine):
        engine.reconcile(machine.store, repair=True)  # heals the crashed writers

    def check_rows(self, machine, epoch):
        assert engine.reconcile(machine.store) == []


class Readers:
    """Readers of the example's counters while a run goes on: one in a thread, looping, and one
    at every point the run reaches (the fault hook). A run changes what a reader sees of a
    counter at most once (its commit's copy), so every value read must be the one read before
    the run or the one read after it: a read outside them is a wrong read."""

    def __init__(self, machine, steps: Counter | None = None):
        self.machine = machine
        self.steps = steps if steps is not None else Counter()
        self.client = CounterClient(machine.store.conn, machine.family, Store(
            machine.store.conn, machine.family, machine.store.layout
        ))  # fmt: skip
        self.keys = [machine.adapter.key(c) for c in machine.counters]
        self.seen: list[dict[str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.errors: list[BaseException] = []

    def read(self) -> dict[str, int]:
        return {v.counter[0]: v.value for v in self.client.read_many(self.keys)}

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                self.seen.append(self.read())
        except BaseException as exc:
            self.errors.append(exc)

    def __enter__(self) -> Readers:
        self.before = self.read()
        self.thread.start()
        return self

    def at_point(self, point: str) -> None:
        del point
        self.seen.append(self.read())

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive() and not self.errors, self.errors
        after = self.read()
        wrong = [
            (counter, value, self.before[counter], after[counter])
            for read in self.seen
            for counter, value in read.items()
            if value not in (self.before[counter], after[counter])
        ]
        event(f"reads during a run: {'some' if self.seen else 'none'}")
        self.steps["reads during runs"] += len(self.seen)
        assert not wrong, f"reads outside (before, after) during a run: {wrong[:5]}"


class _Factory:
    """``make_family`` plus what the Rows adapter needs to create its business table."""

    def __init__(self, make_family, session, keyspace):
        self._make = make_family
        self.session = session
        self.keyspace = keyspace

    def __call__(self, **kw):
        return self._make(**kw)


def run_model(
    make_family,
    t0,
    adapter_class,
    overlaps: list[Overlap],
    steps: Counter,
    examples: int | None = None,
    drains: bool = False,
    name: str | None = None,
):
    """Examples share one set of tables per shard count (a fresh table set per example would
    exhaust the node's heap); each example gets its own family name and counters. Every step
    of the overlap rule appends what it did to ``overlaps``; ``steps`` counts the reads checked
    during runs and the shard changes. ``drains``: a fold carries a few rows only (the test
    caps it), so the last runs drain the backlog, every value checked after each of them.
    ``name``: the families' names (default the kind's; family names are the session's, as the
    keyspace is)."""
    ids = itertools.count()
    adapters = {}

    class CompactionMachine(RuleBasedStateMachine):
        @initialize(shards=st.integers(1, 3))
        def setup(self, shards):
            example = next(ids)
            if shards not in adapters:
                adapters[shards] = adapter_class(make_family, shards)
            self.adapter = adapters[shards]
            self.family, self.store, self.client = self.adapter.family(
                make_family, f"m_{name or adapter_class.kind}_{example}", shards
            )
            forget_table_owners(self.store)  # the tables are shared, the family is new
            self.clock: datetime = t0
            self.counters = [f"{c}{example}" for c in COUNTERS]
            self.oracle = dict.fromkeys(self.counters, 0)
            self.members = {c: set() for c in self.counters}
            self.events = []
            self.crashed_runs = []

        def _run(self, epoch, **kw):
            try:
                return engine.run_family(self.store, epoch, now=self.clock, **kw)
            except engine.LeaseHeld:
                return None

        @rule(
            index=st.integers(0, len(COUNTERS) - 1),
            amount=st.integers(-50, 100),
            offset=st.integers(-240, 20),
        )
        def write(self, index, amount, offset):
            """A write; a negative offset far enough back is a late write (clock behind)."""
            at = self.clock + timedelta(seconds=offset)
            self.events.append(
                self.adapter.write(self, self.counters[index], amount, at, next(ids))
            )

        @precondition(lambda self: hasattr(self.adapter, "foreign"))
        @rule(
            index=st.integers(0, len(COUNTERS) - 1),
            amount=st.integers(-50, 100),
            offset=st.integers(-240, 20),
        )
        def foreign_write(self, index, amount, offset):
            """A writer that bypasses the write API (plain CQL, no mark), on time or late."""
            at = self.clock + timedelta(seconds=offset)
            self.adapter.foreign(self, self.counters[index], amount, at, next(ids))

        @precondition(lambda self: self.events)
        @rule(data=st.data())
        def retry(self, data):
            """A writer retries an earlier write: never a second count."""
            self.adapter.retry(self, data.draw(st.sampled_from(self.events)))

        @rule(seconds=st.integers(20, 150))
        def advance(self, seconds):
            self.clock += timedelta(seconds=seconds)

        @rule(
            point=st.none() | st.sampled_from(POINTS),
            nth=st.integers(1, 3),
            chunk=st.integers(1, 3),
            lease=st.booleans(),
        )
        def compact(self, point, nth, chunk, lease):
            epoch = epoch_for(self.clock, self.family.lag)
            run_id = f"r{next(ids)}"
            hits = []

            with Readers(self, steps) as readers:

                def crash(p):
                    readers.at_point(p)
                    if p == point:
                        hits.append(p)
                        if len(hits) == nth:
                            raise Crash(p)

                try:
                    self._run(
                        epoch, run_id=run_id, commit_chunk=chunk, use_lease=lease, fault=crash
                    )
                except Crash:
                    self.crashed_runs.append((run_id, epoch))

        @rule()
        def retry_crashed_run(self):
            """Airflow retries the crashed task: same run id, same epoch. Always enabled (a
            no-op without a crashed run): whether a run crashed depends on the node, and a
            precondition on it made Hypothesis' data generation flaky."""
            if not self.crashed_runs:
                return
            run_id, epoch = self.crashed_runs.pop()
            self._run(epoch, run_id=run_id)

        @rule(
            point=st.sampled_from(adapter_class.overlap_points),
            amount=st.integers(1, 9),
            later=st.booleans(),
        )
        def overlap(self, point, amount, later):
            """Run A stalls at ``point``; meanwhile late writes land on every counter and run B
            runs to the end (no lease: a stale lease holder and its successor). The window that
            matters most is A stalled between its raw read and its commit. The step proves it
            overlapped (A waited at ``point`` for all of B) and says so (``event``), and
            records it in ``overlaps`` for the test's summary."""
            at = self.clock - timedelta(seconds=30)
            for counter in self.counters:  # new rows for A to fold: A has a commit to make
                self.events.append(self.adapter.write_new(self, counter, amount, at, next(ids)))
            self.clock += timedelta(minutes=2)
            epoch = epoch_for(self.clock, self.family.lag)

            def run_a(fault):
                run_id = f"A{next(ids)}"
                return engine.run_family(
                    self.store, epoch, run_id, now=self.clock, use_lease=False, fault=fault
                )

            with StalledRun(point, run_a, bound_s=120) as a:
                a.start()
                for index in range(len(COUNTERS)):
                    self.write(index, amount + index, -200)
                if later:
                    self.clock += timedelta(minutes=1)
                b = self._run(
                    epoch_for(self.clock, self.family.lag),
                    run_id=f"B{next(ids)}",
                    use_lease=False,
                    commit_chunk=1,
                )
                waited = a.waiting
                a.release()
            step = Overlap(
                adapter_class.kind,
                point,
                overlapped=waited and a.overlapped,
                stalled=a.outcome(),
                rival=b.outcome if b is not None else "lease held",
            )
            overlaps.append(step)
            event(f"overlap at {point}: {'overlapped' if step.overlapped else 'did not overlap'}")
            note(f"{step}")
            assert step.overlapped, f"run A did not wait at {point} for all of run B: {step}"
            assert a.error is None and a.summary.outcome == "success", step
            # past "finish" A has moved the family's epoch: B at that same epoch has nothing to do
            assert step.rival == ("noop" if point == "finish" and not later else "success"), step

        @rule(shards=st.integers(1, 3), die_after=st.none() | st.integers(0, 6))
        def change_shards(self, shards, die_after):
            """The YAML's shard count changes. A run at the new count without a reshard is
            refused, changing nothing; `counterctl reshard` moves every checkpoint (dying part
            way, then run again, if ``die_after`` says so), and runs go on at the new count."""
            if shards == self.family.shards:
                return
            before = Readers(self).read()
            epoch = epoch_for(self.clock, self.family.lag)
            if self.store.owners.table_owners():  # committed already: its count is recorded
                with pytest.raises(engine.IdentityMismatch, match="shards"):
                    engine.run_family(self.store.with_shards(shards), epoch, now=self.clock)
            if die_after is not None:
                dying = self.store.with_shards(self.family.shards)
                move, moved = dying.ledger.move_ledger_row, []

                def move_then_die(*args, **kwargs):
                    if len(moved) == die_after:
                        raise Crash("reshard")
                    moved.append(1)
                    return move(*args, **kwargs)

                dying.ledger.move_ledger_row = move_then_die
                try:
                    reshard(dying, shards)
                except Crash:
                    event("reshard died part way")
                    steps["reshards that died"] += 1
            reshard(self.store, shards)
            self._use_shards(shards)
            assert Readers(self).read() == before  # a reshard changes no value
            event("shards changed")
            steps["reshards"] += 1

        def _use_shards(self, shards):
            self.store = self.store.with_shards(shards)
            self.family = self.store.family
            self.client = CounterClient(self.store.conn, self.family, self.store)

        def teardown(self):
            if not hasattr(self, "store"):
                return
            if self.family.shards != self.adapter.shards:  # later examples share these tables
                reshard(self.store, self.adapter.shards)
                self._use_shards(self.adapter.shards)
            self.clock += timedelta(hours=1)
            epoch = epoch_for(self.clock, self.family.lag)
            self.adapter.settle(self)
            keys = [self.adapter.key(c) for c in self.counters]
            for _run in range(60 if drains else 1):
                engine.run_family(self.store, epoch, now=self.clock, use_lease=False)
                values = {v.counter[0]: v.value for v in self.client.read_many(keys)}
                assert values == self.oracle
                if not drains or not any(rows_at_or_below(self.store, k, epoch) for k in keys):
                    break
                self.clock += timedelta(minutes=1)
                epoch = epoch_for(self.clock, self.family.lag)
            self.adapter.check_rows(self, epoch)

    CompactionMachine.TestCase.settings = settings(
        max_examples=examples or int(os.environ.get("MODEL_EXAMPLES", "25")),
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        # examples share tables, so a replay is not bit-identical: report the first failure
        # as found instead of shrinking into a FlakyStrategyDefinition
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        database=None,
    )
    return CompactionMachine


@pytest.mark.parametrize("adapter", [Increments, Rows, Unique], ids=lambda a: a.kind)
def test_model_exact_totals_under_crashes_retries_late_writes_and_overlap(
    make_family, conn, engine_keyspace, t0, adapter
):
    """The state machine of a kind: writes, late writes, runs crashed at every point, retries,
    overlapping runs, reshards and readers during runs, every total checked after each step.
    Minutes per kind, and why: ``MODEL_EXAMPLES`` (25) examples of up to 20 steps, each step
    real requests to the node; fewer examples held too few real overlaps to prove them."""
    factory = _Factory(make_family, conn.session, engine_keyspace)
    overlaps: list[Overlap] = []
    steps: Counter = Counter()
    machine = run_model(factory, t0, adapter, overlaps, steps)
    machine.TestCase().runTest()
    # every overlap step asserted its own overlap; here: that enough of them ran, and where.
    # Hypothesis starts with short examples, so a handful of examples may hold none at all
    # (25 held 85 real overlaps of increments, every point drawn)
    per_point = Counter(o.point for o in overlaps if o.overlapped)
    print(f"\n{adapter.kind}: {len(overlaps)} overlap steps, real overlaps {dict(per_point)}")
    print(f"{adapter.kind}: {dict(steps)}")
    examples = machine.TestCase.settings.max_examples
    wanted = examples // 5 if examples >= 10 else 0
    assert sum(per_point.values()) >= wanted, (
        f"{sum(per_point.values())} real overlaps in {examples} examples, wanted {wanted}",
        overlaps,
    )
    if examples >= 10:  # the readers checked reads during runs, and shard counts changed
        assert steps["reads during runs"] > 0 and steps["reshards"] > 0, steps


def test_model_exact_when_every_fold_carries_two_rows(
    make_family, conn, engine_keyspace, t0, monkeypatch
):
    """The increments model with a fold that carries at most two rows of a counter: every
    backlog, late ones included, is folded over several runs, oldest first (a late backlog by
    lowering the counter's epoch), under crashes at every point, retries, overlapping runs,
    late writes and reshards; readers are checked at every point of every run and after every
    run that drains the last rows. A fifth of the model's examples: each one drains, over
    several runs (over 30 s on a busy 2-core machine)."""
    from counters.compaction import fold as fold_module

    monkeypatch.setattr(fold_module, "MAX_FOLD_ROWS", 2)
    factory = _Factory(make_family, conn.session, engine_keyspace)
    steps: Counter = Counter()
    examples = max(int(os.environ.get("MODEL_EXAMPLES", "25")) // 5, 1)
    machine = run_model(
        factory, t0, Increments, [], steps, examples=examples, drains=True, name="two_rows"
    )
    machine.TestCase().runTest()
    print(f"\nincrements, two rows a fold: {dict(steps)}")
