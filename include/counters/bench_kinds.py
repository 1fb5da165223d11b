"""One benchmark line per family kind: compaction rows/s at the default data size, and the read
p99 of a compacted counter against a fresh one.

Adding a kind is one function: decorate it with ``@kind_line("<kind>")``. It gets a
:class:`KindContext` (the connection, the bench keyspace, the sizes, the sections this run
already measured, and helpers to compact through the engine in its own process and to time
reads) and returns a :class:`KindLine`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KindBench = Callable[["KindContext"], "KindLine"]
KINDS: dict[str, KindBench] = {}


def kind_line(name: str) -> Callable[[KindBench], KindBench]:
    def register(func: KindBench) -> KindBench:
        KINDS[name] = func
        return func

    return register


@dataclass
class KindContext:
    conn: Any
    keyspace: str
    params: Any
    results: dict[str, Any]
    bench: Any = field(repr=False, default=None)
    """The running ``counters.bench.Bench``: ``make_family``, ``compact`` (engine run in a worker
    process), ``read_latency`` (timed client reads) and ``reset_family`` are meant for kinds."""


@dataclass
class KindLine:
    kind: str
    compaction_rows_per_s: float | None
    read_p99_compacted_ms: float | None
    read_p99_fresh_ms: float | None
    exact: bool | None
    note: str = ""

    @property
    def p99_ratio(self) -> float | None:
        if self.read_p99_compacted_ms is None or not self.read_p99_fresh_ms:
            return None
        return self.read_p99_compacted_ms / self.read_p99_fresh_ms

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "p99_compacted_over_fresh": self.p99_ratio}


@kind_line("increments")
def increments(ctx: KindContext) -> KindLine:
    """The engine's first kind: the figures of the compaction and read-latency sections."""
    compaction = ctx.results.get("compaction") or {}
    reads = ctx.results.get("read_latency") or {}
    compacted = (reads.get("counters") or {}).get("compacted") or {}
    fresh = (reads.get("counters") or {}).get("fresh") or {}
    missing = [name for name, data in (("compaction", compaction), ("reads", reads)) if not data]
    return KindLine(
        kind="increments",
        compaction_rows_per_s=compaction.get("rows_per_s"),
        read_p99_compacted_ms=compacted.get("p99_ms"),
        read_p99_fresh_ms=fresh.get("p99_ms"),
        exact=(compaction.get("exactness") or {}).get("exact"),
        note=f"sections not run: {', '.join(missing)}" if missing else "",
    )
