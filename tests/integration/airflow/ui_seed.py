"""Demo-like history for the Counter families pages: the demo families' kinds, increments over
the last minutes, and the compaction runs the DAG would have made of them, run through the DAG's
own task bodies (``tasks.plan`` and ``tasks.whole_run``): audit rows, Data Docs, late writes and
one quarantined counter, as a person would find them after a few minutes of ``make run``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from cassandra.util import uuid_from_time
from counters.client import CounterClient, Increment
from counters.config import Family, Kind
from counters.core import utc_aware
from counters.demo import demo_counter
from counters.schema import q

RUNS = 5
"""Minute runs per family, the newest one a minute ago."""


@dataclass
class Seeded:
    """What was written and run, to check the pages against."""

    ticks: list[datetime]
    expected: dict[str, dict[tuple[Any, ...], int]] = field(default_factory=dict)
    """per family: the value every counter must read"""
    outcomes: dict[str, list[str]] = field(default_factory=dict)
    quarantined: dict[str, list[str]] = field(default_factory=dict)


def ticks(now: datetime, runs: int = RUNS) -> list[datetime]:
    minute = now.astimezone(UTC).replace(tzinfo=None, second=0, microsecond=0)
    return [minute - timedelta(minutes=runs - i) for i in range(runs)]


def _write(conn: Any, family: Family, at: datetime, rng: random.Random, seeded: Seeded) -> None:
    """A few events of the family's kind at ``at`` (before the tick that folds them)."""
    values = seeded.expected.setdefault(family.name, {})
    client = CounterClient(conn, family)
    if family.kind is Kind.INCREMENTS:
        events = []
        for _ in range(rng.randint(5, 20)):
            key = (demo_counter(rng.randrange(12)),)
            amount = rng.randint(1, 100)
            events.append(Increment(key, amount, utc_aware(at), ("seed", rng.randrange(2**40))))
            values[key] = values.get(key, 0) + amount
        client.record(events)
    elif family.kind is Kind.UNIQUE:
        pairs = []
        for _ in range(rng.randint(3, 10)):
            key, member = (f"meeting-{rng.randrange(4)}",), f"user-{rng.randrange(30)}"
            pairs.append((key, member))
        firsts = client.add_members(pairs, at=at.replace(tzinfo=UTC))
        for (key, _member), first in zip(pairs, firsts, strict=True):
            values[key] = values.get(key, 0) + int(first)
    else:  # rows: the business table, one row per order, its own timeuuid
        statement = conn.session.prepare(
            f"INSERT INTO {q(family.keyspace)}.{q(family.raw_table)} "
            "(location_id, calculation_date, timestamp, order_id) VALUES (?, ?, ?, ?)"
        )
        day = date(2026, 11, 22)
        for _ in range(rng.randint(3, 12)):
            key = (rng.randrange(1, 4), day)
            moment = at.replace(tzinfo=UTC).timestamp() + rng.random()
            conn.session.execute(statement, (*key, uuid_from_time(moment), rng.randrange(1, 10**9)))
            values[key] = values.get(key, 0) + 1


def _null_increment(conn: Any, family: Family, key: str, at: datetime) -> None:
    """A raw row whose increment is NULL (a writer outside the API): the run refuses to fold
    it and quarantines the counter."""
    cols = family.columns
    conn.session.execute(
        f"INSERT INTO {q(family.keyspace)}.{q(family.raw_table)} ({q(cols.key[0])}, "
        f"{q(cols.time)}, actor, version) VALUES (%s, %s, 'bad-writer', 1)",
        (key, at),
    )
    CounterClient(conn, family).store.index.mark_touched([(key,)])


def compact_as_the_dag_does(family: Family, run_id: str, scheduled: datetime, now: datetime) -> str:
    """One run through the DAG's task bodies (``plan``, then ``whole_run`` or, for a sweep, the
    phases the DAG maps over shard groups, one after another); returns its outcome."""
    from airflow.sdk.exceptions import AirflowSkipException
    from counters.airflow import tasks
    from counters.airflow.errors import CheckFailed

    try:
        planned = tasks.plan(family, run_id=run_id, scheduled=scheduled, now=now)
        run = tasks.received_plan(tasks.encode(planned))  # as the DAG's later tasks get it
        if run.small:
            tasks.whole_run(family, run)
        else:
            shards = run.shards
            verified = tasks.verify(family, run, tasks.compact(family, run, shards))
            cleaned = tasks.verify_cleanup(
                family, run, verified, tasks.cleanup(family, run, verified, shards)
            )
            tasks.record_audit(family, run, verified, cleaned)
    except AirflowSkipException:
        return "idle"
    except CheckFailed:
        return "partial"
    return "success"


def seed(conn: Any, families: list[Family], now: datetime, rng_seed: int = 7) -> Seeded:
    """Write and compact ``RUNS`` minutes of history for each family (about 10 s per family on
    the test node, GX included)."""
    rng = random.Random(rng_seed)
    minutes = ticks(now)
    seeded = Seeded(minutes)
    for family in families:
        outcomes = seeded.outcomes.setdefault(family.name, [])
        for i, tick in enumerate(minutes):
            epoch = tick - family.lag
            _write(conn, family, epoch - timedelta(seconds=rng.randint(5, 50)), rng, seeded)
            if i == 2 and family.kind is Kind.INCREMENTS:
                # a late writer: a row of a counter the first run folded, behind its epoch
                key = next(iter(seeded.expected[family.name]))
                at = minutes[0] - family.lag - timedelta(seconds=10)
                CounterClient(conn, family).record([Increment(key, 3, utc_aware(at), ("late", i))])
                seeded.expected[family.name][key] += 3
            if i == RUNS - 1 and family.name == "trades":
                _null_increment(conn, family, "BROKEN", epoch - timedelta(seconds=3))
                seeded.quarantined.setdefault(family.name, []).append("BROKEN")
            run_id = f"scheduled__{tick.isoformat()}+00:00"
            outcomes.append(
                compact_as_the_dag_does(family, run_id, tick, tick + timedelta(seconds=2))
            )
    return seeded
