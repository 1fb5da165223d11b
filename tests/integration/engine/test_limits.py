"""Sizes at the node's limits (16 MiB a request and a mutation by default): a backlog of late
rows folded over several runs with readers exact throughout; a counter that cannot be folded
quarantined while its family goes on; a unique counter's backlog of long members.

Long identities (65,000 random printable characters, just under the node's 64 KiB limit on a
clustering value: a record of them compresses to 84%) reach the byte limits with the fewest
rows."""

from __future__ import annotations

import random
import secrets
from datetime import datetime, timedelta

import pytest
from counters import engine
from counters.client import Increment
from counters.compaction import shard as shard_module
from counters.core import utc_aware
from counters.store import Store

from .conftest import Crash
from .helpers import aware, raw_rows
from .test_engine import same_bucket

pytestmark = pytest.mark.integration

IDENTITY_CHARS = 65_000
PRINTABLE = [chr(c) for c in range(33, 127)]
BACKLOG = 300
"""Late rows of one counter: ~19.5 MB of keys, one request of them all over the node's limit."""
OVER_A_REQUEST = 330
"""Rows whose record of keys, compressed, is over the node's 16 MiB limit (~17.9 MB)."""


def long_identity(rng: random.Random) -> str:
    return "".join(rng.choices(PRINTABLE, k=IDENTITY_CHARS))


def inc(counter: str, amount: int, at: datetime, actor: str = "w", version: int = 0) -> Increment:
    return Increment((counter,), amount, utc_aware(at), (actor, version))


def another_bucket(store: Store, than: str, prefix: str) -> str:
    return next(
        f"{prefix}{i}"
        for i in range(10_000)
        if store.keys.bucket((f"{prefix}{i}",)) != store.keys.bucket((than,))
    )


def record_in_parts(client, events: list[Increment]) -> None:
    """The write API, a few long rows a call (a batch of 100 such rows is a 6 MB mutation)."""
    for part in range(0, len(events), 10):
        client.record(events[part : part + 10])


class Readers:
    """Reads the given counters at every point a run reaches (its fault hook) and checks each
    value is the one read before the run or after it: a run changes a reader's value at most
    once (its copy), so anything else is a wrong read. ``crash_at`` also crashes the run
    there (the process dying); ``points`` keeps the reads to those points."""

    def __init__(
        self,
        client,
        counters: list[str],
        crash_at: str | None = None,
        points: tuple[str, ...] | None = None,
    ):
        self.client = client
        self.counters = counters
        self.crash_at = crash_at
        self.points = points
        self.seen: list[dict[str, int]] = []
        self.before = self.read()

    def read(self) -> dict[str, int]:
        return {v.counter[0]: v.value for v in self.client.read_many(self.counters)}

    def __call__(self, point: str) -> None:
        if self.points is None or point in self.points:
            self.seen.append(self.read())
        if point == self.crash_at:
            raise Crash(point)

    def check(self) -> dict[str, int]:
        after = self.read()
        wrong = [
            (c, v, self.before[c], after[c])
            for read in self.seen
            for c, v in read.items()
            if v not in (self.before[c], after[c])
        ]
        assert self.seen and not wrong, wrong[:5]
        return after


def run(store: Store, epoch: datetime, **kw):
    return engine.run_family(store, epoch, now=epoch + timedelta(minutes=5), **kw)


def test_a_late_backlog_over_the_request_limit_is_folded_over_several_runs(make_family, t0):
    """An upstream queue replayed after an outage longer than ``lag``: 300 late rows of one
    counter with their own times and long identities, ~19.5 MB of keys (one request of them
    all, a commit or a cleanup's delete, is over the node's limit). They are folded over
    several runs, oldest first, the counter's epoch lowered to the last row folded so that
    readers count the rest at once. Readers are
    exact between runs and at every point of each run: through a late row arriving during the
    drain (after the lowered epoch: counted at once; before it: from the next run), a crash
    between a commit and its copy and the run's retry. A sibling in the same bucket is
    compacted by every run. A reset that would consume the backlog in one commit is refused,
    changing nothing. (Over 30 s on a busy 2-core machine: the fewest rows over the node's
    limit are ~20 MB, written once and read by each of the runs; ~10 client CPU-s.)"""
    _family, store, client = make_family(shards=1)
    late, sibling = same_bucket(store, 2, prefix="q")
    rng = random.Random(49)
    client.record([inc(late, 1, t0 + timedelta(seconds=30)), inc(sibling, 1, t0)])
    epoch = t0 + timedelta(minutes=10)
    assert run(store, epoch).outcome == "success"
    backlog = [
        inc(late, 1, t0 + timedelta(minutes=1, seconds=i), long_identity(rng), i)
        for i in range(BACKLOG)
    ]
    record_in_parts(client, backlog)
    truth = {late: 1 + BACKLOG, sibling: 1}
    with pytest.raises(engine.EngineError, match="more than one commit carries"):
        engine.reset_counter(store, (late,), at=aware(epoch), now=epoch + timedelta(minutes=5))
    assert client.read(late) == 1  # nothing changed: the backlog is late, not read yet

    minutes = iter(range(11, 40))

    def drain_run(readers: Readers, minute: int | None = None, run_id: str | None = None):
        """The next minute's run (with a new sibling row), read at every point it reaches;
        ``minute`` and ``run_id`` given: the retry of that run."""
        if minute is None:
            minute = next(minutes)
            client.record(
                [inc(sibling, 1, t0 + timedelta(minutes=minute - 1, seconds=1), "s", minute)]
            )
            truth[sibling] += 1
        return run(store, t0 + timedelta(minutes=minute), run_id=run_id, fault=readers)

    first = drain_run(readers := Readers(client, [late, sibling]))
    assert readers.check() == truth
    assert first.outcome == "success" and 0 < first.tally.rows_folded - 1 < BACKLOG
    assert first.tally.capped_counters == 1 and first.tally.late_rows == BACKLOG
    audit = store.audit.page(1)[0]  # every late row entered readers' values with this run
    assert (audit["late_rows"], audit["late_sum"]) == (BACKLOG, BACKLOG)
    assert "1 counter(s) had more rows than one commit carries" in audit["message"]
    lowered = client.late_horizon(late)
    assert lowered is not None and lowered < epoch  # the epoch, lowered to the last row folded

    # late rows during the drain: after the lowered epoch (counted at once), and before it
    client.record([inc(late, 1_000, epoch - timedelta(minutes=1), "x", 1)])
    truth[late] += 1_000
    assert client.read(late) == truth[late]
    client.record([inc(late, 5_000, t0 + timedelta(minutes=1, milliseconds=500), "y", 1)])
    assert client.read(late) == truth[late]  # behind the copy's epoch: from the next run
    truth[late] += 5_000

    readers = Readers(client, [late, sibling], crash_at="commit")
    with pytest.raises(Crash):  # between a commit and its copy
        drain_run(readers, run_id="crashed")
    assert client.read(late) == truth[late] - 5_000  # the copy before it: still exact
    readers.crash_at = None
    readers.check()
    retry = drain_run(readers := Readers(client, [late, sibling]), 12, "crashed")
    assert retry.outcome == "success" and readers.check() == truth

    runs = 3
    while raw_rows(store, (late,)):
        summary = drain_run(readers := Readers(client, [late, sibling]))
        assert summary.outcome == "success" and readers.check() == truth
        runs += 1
        assert runs < 12
    assert runs >= 4  # over several runs (a crashed one and its retry included)
    assert client.late_horizon(late) > epoch and client.read(late) == truth[late]


def test_a_counter_that_no_commit_can_carry_is_quarantined_and_its_family_goes_on(
    make_family, t0, monkeypatch
):
    """330 rows of one counter in one millisecond with long identities (~21 MB of keys): a
    fold never ends inside a millisecond, so no commit the node takes can count them. Each of
    the three guards in turn quarantines the counter with a reason that names the limit, while
    a sibling in its bucket and a counter in another bucket are compacted, and the run ends
    ``partial`` (what alerts): the fold refuses it (the engine's limits); with the fold's limit
    raised, the commit refuses its record before sending it; with that check gone too, the
    node refuses the request and the commit quarantines it. Its rows are kept and read. (Over
    30 s on a busy machine: ~21 MB written, read by three runs.)"""
    from counters.compaction import fold as fold_module

    _family, store, client = make_family(shards=1)
    big, sibling = same_bucket(store, 2, prefix="m")
    other = another_bucket(store, big, prefix="n")
    rng = random.Random(7)
    at = t0 + timedelta(seconds=5)
    rows = [inc(big, 1, at, long_identity(rng), i) for i in range(OVER_A_REQUEST)]
    record_in_parts(client, rows)
    truth = {big: OVER_A_REQUEST, sibling: 0, other: 0}

    def one_run(minute: int, said: str) -> None:
        for counter, amount in ((sibling, 2), (other, 3)):
            client.record(
                [inc(counter, amount, t0 + timedelta(minutes=minute - 1, seconds=1), "s", minute)]
            )
            truth[counter] += amount
        with pytest.raises(engine.ChecksFailed, match="quarantined"):
            run(store, t0 + timedelta(minutes=minute))
        [entry] = engine.quarantined(store)
        assert (entry.counter, entry.reason) == ((big,), "too_large")
        assert "native_transport_max_message_size" in entry.detail and said in entry.detail
        assert store.audit.page(1)[0]["outcome"] == "partial"
        assert {c: client.read(c) for c in truth} == truth
        assert len(raw_rows(store, (big,))) == OVER_A_REQUEST  # kept, still read
        assert not raw_rows(store, (sibling,)) and not raw_rows(store, (other,))
        engine.release(store, (big,))

    one_run(1, "a fold cannot end inside a millisecond")
    monkeypatch.setattr(fold_module, "FOLD_KEY_BYTES", 2**30)
    one_run(2, "bytes (compressed), over the node's limits")
    monkeypatch.setattr(shard_module, "fits_one_request", lambda _bytes: True)
    one_run(3, "the node refused its commit as too large")


def test_a_unique_counters_backlog_of_long_members_stays_within_the_limits(make_family, t0):
    """270 members of one meeting with long names (~17.6 MB): a reader asks which of the
    members after the copy's epoch a cleanup has marked counted, and so does the fold; one
    request naming them all is over the node's limit. Both ask in parts, the fold counts them
    over several runs (a unique commit also copies the members it counts into readers' row),
    and the value read is exact before, between and during those runs. (Over 30 s on a busy
    machine: ~35 MB written, the set and its derived rows, read by every read.)"""
    _family, store, client = make_family(
        kind="unique",
        raw_table=f"members_{secrets.token_hex(3)}",
        columns={"key": "meeting", "member": "user"},
    )
    rng = random.Random(11)
    members = [long_identity(rng) for _ in range(270)]
    for i in range(0, len(members), 10):  # ten members a millisecond, each call its own
        at = t0 + timedelta(seconds=i)
        client.add_members([("m1", member) for member in members[i : i + 10]], at=aware(at))
    client.add_members([("m2", "short")], at=aware(t0))
    truth = {"m1": 270, "m2": 1}
    readers = Readers(client, list(truth), points=("cleanup_mark",))
    assert readers.before == truth
    runs = 0
    for minute in range(10, 20):
        summary = run(store, t0 + timedelta(minutes=minute), fault=readers)
        assert summary.outcome == "success" and readers.check() == truth
        runs += 1
        if summary.tally.capped_counters == 0:
            break
        readers = Readers(client, list(truth), points=("cleanup_mark",))
    assert runs > 1 and engine.reconcile(store) == []
