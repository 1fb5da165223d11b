"""Synthetic increments: the demo writer of ``make run`` and the benchmark loader."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from .client import CounterClient, Increment
from .config import Family
from .connection import Connection
from .kinds import DemoWriter

log = logging.getLogger(__name__)

SYMBOLS = ["IBM", "AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "TSLA", "META", "ORCL", "SAP"]


ORDERS_DDL = (
    "CREATE TABLE IF NOT EXISTS {keyspace}.{table} (location_id int, calculation_date date, "
    "timestamp timeuuid, order_id int, PRIMARY KEY ((location_id, calculation_date), "
    "timestamp, order_id)) WITH CLUSTERING ORDER BY (timestamp ASC, order_id ASC)"
)
"""Seed 003's ``location_orders2``: the business table of the demo ``rows`` family."""


def create_demo_tables(session: Any, families: Sequence[Family], replication: str) -> None:
    for family in families:
        if family.rules.demo is DemoWriter.ORDERS:
            session.execute(
                f"CREATE KEYSPACE IF NOT EXISTS {family.keyspace} WITH replication = {replication}"
            )
            session.execute(ORDERS_DDL.format(keyspace=family.keyspace, table=family.raw_table))


def write_orders(session: Any, family: Family, count: int, rng: random.Random) -> None:
    """The business application of the demo rows family: one row per order, now() timeuuid."""
    statement = session.prepare(
        f"INSERT INTO {family.keyspace}.{family.raw_table} "
        "(location_id, calculation_date, timestamp, order_id) VALUES (?, ?, now(), ?)"
    )
    today = datetime.now(UTC).date()
    for _ in range(count):
        session.execute(statement, (rng.randrange(1, 6), today, rng.randrange(1, 10**9)))


def demo_counter(index: int) -> str:
    base = SYMBOLS[index % len(SYMBOLS)]
    return base if index < len(SYMBOLS) else f"{base}-{index // len(SYMBOLS)}"


def write_forever(
    conn: Connection,
    families: Sequence[Family],
    rate: float,
    counters: int,
    stop: threading.Event,
    duration: float | None = None,
    actor: str = "demo",
) -> int:
    """Write ``rate`` increments per second to each family until ``stop`` is set."""
    clients = [CounterClient(conn, f) for f in families if f.rules.demo is DemoWriter.INCREMENTS]
    order_families = [f for f in families if f.rules.demo is DemoWriter.ORDERS]
    sets = [CounterClient(conn, f) for f in families if f.rules.demo is DemoWriter.MEMBERS]
    if not clients and not order_families and not sets:
        raise ValueError("no family to write to")
    rng = random.Random()
    written = 0
    version = int(time.time() * 1000)
    started = time.monotonic()
    tick = 1.0
    while not stop.is_set():
        if duration is not None and time.monotonic() - started >= duration:
            break
        begin = time.monotonic()
        now = datetime.now(UTC)
        for client in clients:
            batch = []
            for _ in range(max(1, int(rate * tick))):
                version += 1
                batch.append(
                    Increment(
                        counter=(demo_counter(rng.randrange(counters)),),
                        increment=rng.randint(1, 100),
                        time=now,
                        identity=(actor, version),
                    )
                )
            try:
                client.record(batch)
                written += len(batch)
            except Exception:  # keep the demo alive through a Cassandra restart
                log.warning("demo write failed; retrying next tick", exc_info=True)
        for unique in sets:  # meeting acceptances (seed 000): users accept, some twice
            try:
                for _ in range(max(1, int(rate * tick / 4))):
                    unique.add_member(f"meeting-{rng.randrange(5)}", f"user-{rng.randrange(200)}")
                    written += 1
            except Exception:
                log.warning("demo member write failed; retrying next tick", exc_info=True)
        for family in order_families:
            try:
                write_orders(conn.session, family, max(1, int(rate * tick / 4)), rng)
                written += max(1, int(rate * tick / 4))
            except Exception:
                log.warning("demo order write failed; retrying next tick", exc_info=True)
        stop.wait(max(0.0, tick - (time.monotonic() - begin)))
    return written
