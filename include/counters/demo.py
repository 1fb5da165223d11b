"""Synthetic increments: the demo writer of ``make run`` and the benchmark loader."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from .client import CounterClient, Increment
from .config import Family, Kind
from .connection import Connection
from .core import truncate_ms

log = logging.getLogger(__name__)

SYMBOLS = ["IBM", "AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "TSLA", "META", "ORCL", "SAP"]


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
    clients = [CounterClient(conn, f) for f in families if f.kind is Kind.INCREMENTS]
    if not clients:
        raise ValueError("no family of kind 'increments' to write to")
    rng = random.Random()
    written = 0
    version = int(time.time() * 1000)
    started = time.monotonic()
    tick = 1.0
    while not stop.is_set():
        if duration is not None and time.monotonic() - started >= duration:
            break
        begin = time.monotonic()
        now = truncate_ms(datetime.now(UTC).replace(tzinfo=None))
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
        stop.wait(max(0.0, tick - (time.monotonic() - begin)))
    return written
