"""Model-based test: random writes, retries, late writes, crashes and overlapping runs against the
real node, checked against a plain-Python oracle (the sum of every distinct increment)."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta

import pytest
from counters import engine
from counters.client import Increment
from counters.core import epoch_for
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from .conftest import Crash
from .helpers import rows_at_or_below

pytestmark = pytest.mark.integration

COUNTERS = ["IBM", "AAPL", "MSFT", "GOOG"]
POINTS = [  # read_raw twice: the stale-commit window gets drawn more often
    "read_raw",
    "lease",
    "discover",
    "read_compact",
    "read_raw",
    "commit",
    "log",
    "verify",
    "cleanup_read_log",
    "cleanup_delete",
    "cleanup_forget",
    "finish",
]


def run_model(make_family, t0):
    """Examples share one set of tables (a fresh table set per example would exhaust the
    node's heap); each example gets its own family name (state, lease, audit) and counters."""
    ids = itertools.count()
    tables = {}

    class CompactionMachine(RuleBasedStateMachine):
        @initialize(shards=st.integers(1, 3))
        def setup(self, shards):
            example = next(ids)
            if shards not in tables:
                family, _, _ = make_family(shards=shards)
                tables[shards] = family
            base = tables[shards]
            self.family, self.store, self.client = make_family(
                name=f"{base.name}_{example}",
                raw_table=base.raw_table,
                compact_table=base.compact_table,
                shards=shards,
            )
            self.clock = t0
            self.counters = [f"{c}{example}" for c in COUNTERS]
            self.oracle = dict.fromkeys(self.counters, 0)
            self.events: list[Increment] = []
            self.crashed_runs: list[tuple[str, object]] = []

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
            counter = self.counters[index]
            event = Increment(
                (counter,), amount, self.clock + timedelta(seconds=offset), ("w", next(ids))
            )
            self.client.record([event])
            self.oracle[counter] += amount
            self.events.append(event)

        @precondition(lambda self: self.events)
        @rule(data=st.data())
        def retry(self, data):
            """A writer retries an earlier increment: the same row, never a second count."""
            self.client.record([data.draw(st.sampled_from(self.events))])

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

            def crash(p):
                if p == point:
                    hits.append(p)
                    if len(hits) == nth:
                        raise Crash(p)

            try:
                self._run(epoch, run_id=run_id, chunk_size=chunk, use_lease=lease, fault=crash)
            except Crash:
                self.crashed_runs.append((run_id, epoch))
            except engine.RowsRefused:
                raise

        @precondition(lambda self: self.crashed_runs)
        @rule()
        def retry_crashed_run(self):
            """Airflow retries the crashed task: same run id, same epoch."""
            run_id, epoch = self.crashed_runs.pop()
            self._run(epoch, run_id=run_id)

        @rule(point=st.sampled_from(POINTS[2:]), amount=st.integers(1, 9), later=st.booleans())
        def overlap(self, point, amount, later):
            """Run A stalls at ``point``; meanwhile late writes land on every counter and run B
            runs to the end (no lease: a stale lease holder and its successor). The window that
            matters most is A stalled between its raw read and its commit."""
            for index in range(len(COUNTERS)):  # rows for A to fold, so A has a commit to make
                self.write(index, amount, -30)
            self.clock += timedelta(minutes=2)
            epoch = epoch_for(self.clock, self.family.lag)
            paused, resume = threading.Event(), threading.Event()

            def stall(p):
                if p == point and not paused.is_set():
                    paused.set()
                    resume.wait(30)

            def run_a():
                try:
                    self._run(epoch, run_id=f"A{next(ids)}", use_lease=False, fault=stall)
                finally:
                    paused.set()  # a run that never reaches the point (a no-op) also ends

            thread = threading.Thread(target=run_a)
            thread.start()
            assert paused.wait(30)
            for index in range(len(COUNTERS)):
                self.write(index, amount, -200)
            if later:
                self.clock += timedelta(minutes=1)
            self._run(
                epoch_for(self.clock, self.family.lag),
                run_id=f"B{next(ids)}",
                use_lease=False,
                chunk_size=1,
            )
            resume.set()
            thread.join(60)
            assert not thread.is_alive()

        def teardown(self):
            if not hasattr(self, "store"):
                return
            self.clock += timedelta(hours=1)
            epoch = epoch_for(self.clock, self.family.lag)
            engine.run_family(self.store, epoch, now=self.clock, use_lease=False)
            values = {v.counter[0]: v.value for v in self.client.read_many(self.counters)}
            assert values == self.oracle
            for counter in self.counters:
                assert rows_at_or_below(self.store, (counter,), epoch) == 0

    CompactionMachine.TestCase.settings = settings(
        max_examples=int(__import__("os").environ.get("MODEL_EXAMPLES", "25")),
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    return CompactionMachine


def test_model_exact_totals_under_crashes_retries_late_writes_and_overlap(make_family, t0):
    machine = run_model(make_family, t0)
    machine.TestCase().runTest()
