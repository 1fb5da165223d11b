"""Sizes at the node's limits: a backlog of late rows folded over several runs, readers exact
throughout; no request of any path over the node's limits; a counter that cannot be folded is
quarantined and never stops its family."""

from __future__ import annotations

import random
import string
from datetime import timedelta

import pytest
from counters import engine
from counters.client import Increment

from .helpers import raw_rows

pytestmark = pytest.mark.integration

IDENTITY_CHARS = 60_000
"""An identity just under the node's 64 KiB limit on a clustering value: the fewest rows that
reach the byte limits (random text: its record hardly compresses)."""


def long_identity(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=IDENTITY_CHARS))


def inc(counter, amount, at, actor="w", version=0):
    return Increment((counter,), amount, at, (actor, version))


def same_bucket(store, n, prefix="o"):
    by_bucket: dict = {}
    for i in range(10_000):
        name = f"{prefix}{i}"
        group = by_bucket.setdefault(store.keys.bucket((name,)), [])
        group.append(name)
        if len(group) == n:
            return group
    raise AssertionError("no bucket got enough counters")


def run(store, epoch, **kw):
    return engine.run_family(store, epoch, now=epoch + timedelta(minutes=5), **kw)


def test_a_late_backlog_over_the_request_limit_is_folded_over_several_runs(make_family, t0):
    """An upstream queue replayed after an outage longer than ``lag``: 320 late rows of one
    counter, with their own times and 60,000-character identities (~19 MB of keys, over the
    node's 16 MiB request limit in one commit). They are folded over several runs, oldest
    first; a sibling in the same bucket is compacted by every run; readers are exact between
    runs and at every step of each run."""
    _family, store, client = make_family(shards=1)
    late, sibling = same_bucket(store, 2, prefix="q")
    rng = random.Random(49)
    client.record([inc(late, 1, t0 + timedelta(seconds=30)), inc(sibling, 1, t0)])
    epoch = t0 + timedelta(minutes=10)
    assert run(store, epoch).outcome == "success"
    backlog = [
        inc(late, 1, t0 + timedelta(minutes=1, milliseconds=1_000 * i), long_identity(rng), i)
        for i in range(320)
    ]
    for part in range(0, len(backlog), 10):  # the write API's batches of long rows: small
        client.record(backlog[part : part + 10])
    expected = {late: 321, sibling: 1}
    runs = []
    for minute in range(11, 20):
        client.record([inc(sibling, 1, t0 + timedelta(minutes=minute - 1, seconds=1))])
        expected[sibling] += 1
        runs.append(run(store, t0 + timedelta(minutes=minute)))
        assert runs[-1].outcome == "success"
        assert {v.counter[0]: v.value for v in client.read_many([late, sibling])} == expected
        if len(raw_rows(store, (late,))) == 0:
            break
    assert len(runs) > 2  # over several runs
    assert sum(r.tally.rows_folded for r in runs) == 320 + len(runs)
    assert not raw_rows(store, (late,))
