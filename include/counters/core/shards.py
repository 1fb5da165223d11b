"""Where a counter lives: shards and buckets of the token ring, and how work is split."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

MIN_TOKEN = -(2**63)
MAX_TOKEN = 2**63 - 1
_RING = 2**64


def shard_bounds(shards: int) -> list[tuple[int, int]]:
    """Split the Murmur3 ring into ``shards`` ranges ``(start, end]`` that cover every token."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    edges = [MIN_TOKEN + (i * _RING) // shards for i in range(shards)] + [MAX_TOKEN]
    return [(edges[i], edges[i + 1]) for i in range(shards)]


def shard_of(token: int, shards: int) -> int:
    """The shard whose range ``(start, end]`` holds ``token``."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if token == MIN_TOKEN:  # Murmur3 never yields it for a key; keep the function total anyway
        return 0
    # the i with floor(i*R/n) < t-MIN <= floor((i+1)*R/n), i.e. ceil((t-MIN)*n/R) - 1
    index = ((token - MIN_TOKEN) * shards - 1) // _RING
    return min(index, shards - 1)


def overlapping_shards(shard: int, shards_from: int, shards_to: int) -> range:
    """The shards under a count of ``shards_to`` whose token ranges overlap ``shard`` under
    ``shards_from``: where a reshard may have moved what that shard held."""
    low, high = shard_bounds(shards_from)[shard]
    return range(shard_of(low + 1, shards_to), shard_of(high, shards_to) + 1)


def quarantine_shards(shard: int, counts: Iterable[int]) -> list[int]:
    """Every shard partition that can hold the quarantine entry of a counter the run knew in
    ``shard``, whichever of ``counts`` (the shard counts the family was or is being numbered
    by) numbered the run and the entry: a reshard between a run's verify and its cleanup
    moves entries to the new count's shards."""
    known = sorted(set(counts))
    found = {shard}
    for before in known:
        if shard < before:
            for after in known:
                found.update(overlapping_shards(shard, before, after))
    return sorted(found)


BUCKETS = 16
"""Token sub-ranges per shard. A bucket is the unit of every bulk step: one ledger partition
(one Paxos round commits many counters), one touched-index partition, one raw-table scan."""

BIGINT_MAX = 2**63 - 1
BIGINT_MIN = -(2**63)


def bucket_of(token: int, shards: int) -> tuple[int, int]:
    """(shard, bucket) of a partition token: the shard split again into ``BUCKETS`` ranges."""
    fine = shard_of(token, shards * BUCKETS)
    return fine // BUCKETS, fine % BUCKETS


def bucket_bounds(shards: int, shard: int, bucket: int) -> tuple[int, int]:
    """The token range ``(start, end]`` of one bucket."""
    return shard_bounds(shards * BUCKETS)[shard * BUCKETS + bucket]


def split_refused_range(low: int, high: int, known_tokens: Iterable[int]) -> list[tuple[int, int]]:
    """The ranges to read instead of a token range ``(low, high]`` whose scan the server
    refused (a partition full of tombstones): around the tokens of the counters already known
    (their partitions left out: the caller reads those by parts), else its two halves. A range
    of one token cannot be split: ``ValueError``."""
    inside = sorted({t for t in known_tokens if low < t <= high})
    if inside:
        edges = [low, *inside]
        pieces = [(edges[i], edges[i + 1] - 1) for i in range(len(inside))] + [(inside[-1], high)]
        return [(a, b) for a, b in pieces if a < b]
    if high - low <= 1:
        raise ValueError(f"the partition at token {high} cannot be read")
    middle = low + (high - low) // 2
    return [(low, middle), (middle, high)]


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """``items`` in consecutive slices of at most ``size`` (the one chunking helper)."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    return [items[i : i + size] for i in range(0, len(items), size)]


def spread(
    items: Iterable[tuple[int, int, Any]], most_rows: int, most_bytes: int
) -> list[tuple[int, list[Any]]]:
    """``(rows, bytes, item)`` in order, in consecutive groups of at most ``most_rows`` rows and
    ``most_bytes`` bytes (an item over either alone is a group of its own): ``(bytes, items)``
    per group. How a batch of many partitions stays under the node's row and size limits."""
    groups: list[tuple[int, list[Any]]] = []
    current: list[Any] = []
    rows = size = 0
    for n, weight, item in items:
        if current and (rows + n > most_rows or size + weight > most_bytes):
            groups.append((size, current))
            current, rows, size = [], 0, 0
        current.append(item)
        rows, size = rows + n, size + weight
    if current:
        groups.append((size, current))
    return groups
