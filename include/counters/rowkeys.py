"""Counted row keys as the bytes of a CQL ``IN ?`` value (pure: no I/O, no driver session).

The run log records, per commit, the clustering keys of the rows each counter counted, and the
cleanup binds them to ``DELETE ... WHERE (clustering) IN ?``. Kept as that value's bytes (the
elements of a CQL list, a tuple per key when the clustering key has several columns), a
million keys cost the cleanup a copy, not a JSON decode and a driver serializer call per key;
they are decoded to packed keys only where a key is compared (a retry's merge, the sampled
check, a later fold's pending keys).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import call
from typing import Any

from cassandra.marshal import varint_pack, varint_unpack

from .core import Packed

_INT32 = struct.Struct(">i")

Encode = Callable[[Any], bytes]
"""A clustering value to its length and bytes; the value's type is the column's CQL type, known
only at run time (the codec is picked by name), so it is ``Any`` here."""
Decode = Callable[[bytes], object]


class Encoded(bytes):
    """A value already in the bytes the native protocol sends for it (``store.bind`` passes it
    through)."""


def _fixed(fmt: str) -> tuple[Encode, Decode]:
    """A fixed-width type: its value with its length, one ``struct`` call; and back."""
    value = struct.Struct(">" + fmt)
    sized = struct.Struct(">i" + fmt)
    return partial(sized.pack, value.size), lambda b: value.unpack(b)[0]


def _sized(encode: Callable[[Any], bytes]) -> Encode:
    """A variable-width type: its value's bytes behind their length."""

    def sized(v: Any) -> bytes:
        b = encode(v)
        return _INT32.pack(len(b)) + b

    return sized


def _uuid_bytes(text: object) -> bytes:
    """A packed uuid (its canonical text) as its 16 bytes: 7x cheaper than ``uuid.UUID``."""
    try:
        raw = bytes.fromhex(str(text).replace("-", ""))
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise ValueError(f"not a uuid: {text!r}")
    return raw


def _uuid_text(raw: bytes) -> str:
    """16 bytes as the canonical text ``str(uuid.UUID(bytes=raw))`` gives, 3x cheaper."""
    if len(raw) != 16:
        raise ValueError(f"a uuid is 16 bytes, not {len(raw)}")
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_CODECS: dict[str, tuple[Encode, Decode]] = {
    # (value -> length + bytes, bytes -> value)
    "timestamp": _fixed("q"),  # packed as epoch ms
    "bigint": _fixed("q"),
    "int": _fixed("i"),
    "smallint": _fixed("h"),
    "tinyint": _fixed("b"),
    "varint": (_sized(varint_pack), varint_unpack),
    "boolean": (_sized(lambda v: b"\x01" if v else b"\x00"), lambda b: b != b"\x00"),
    "text": (_sized(str.encode), lambda b: b.decode()),
    "varchar": (_sized(str.encode), lambda b: b.decode()),
    "ascii": (_sized(lambda v: v.encode("ascii")), lambda b: b.decode("ascii")),
    "uuid": (_sized(_uuid_bytes), _uuid_text),
    "timeuuid": (_sized(_uuid_bytes), _uuid_text),
}
KEY_TYPES = frozenset(_CODECS)
"""The clustering column types a key codec encodes (``store.PACKED_TYPES``)."""


@dataclass(frozen=True)
class KeyCodec:
    """Packed clustering keys <-> the elements of a CQL list: ``list<type>`` for a one-column
    clustering key, ``list<tuple<...>>`` otherwise, the same bytes the driver serializes."""

    types: tuple[str, ...]

    def __post_init__(self) -> None:
        unknown = [t for t in self.types if t not in _CODECS]
        if unknown or not self.types:
            raise ValueError(f"no key codec for clustering types {list(self.types)}")

    def encode(self, keys: Iterable[Packed]) -> bytes:
        """The list elements (no count) of these keys, in order. A list element and a tuple
        field are both their length and bytes: a one-column key is its field, a tuple is its
        fields behind their total length (~0.7 us a three-column key)."""
        encoders = [_CODECS[t][0] for t in self.types]
        join = b"".join
        if len(encoders) == 1:
            one = encoders[0]
            return join([one(key[0]) for key in keys])
        i32 = _INT32.pack
        out: list[bytes] = []
        add = out.append
        for key in keys:
            body = join(map(call, encoders, key))
            add(i32(len(body)))
            add(body)
        return join(out)

    def decode(self, body: bytes) -> list[Packed]:
        """The packed keys of :meth:`encode`'s bytes."""
        read = _INT32.unpack_from
        decoders = [_CODECS[t][1] for t in self.types]
        keys: list[Packed] = []
        at, end = 0, len(body)
        single = len(decoders) == 1
        while at < end:
            (size,) = read(body, at)
            at += 4
            if single:
                keys.append((decoders[0](body[at : at + size]),))
            else:
                values = []
                inner = at
                for dec in decoders:
                    (width,) = read(body, inner)
                    inner += 4
                    values.append(dec(body[inner : inner + width]))
                    inner += width
                keys.append(tuple(values))
            at += size
        return keys


def _offsets(body: bytes, every: int, most_bytes: int | None = None) -> list[tuple[int, int]]:
    """``(elements, byte offset)`` after each run of at most ``every`` elements of ``body``
    taking at most ``most_bytes`` (an element over it alone is a run of its own), to its end."""
    read = _INT32.unpack_from
    cuts: list[tuple[int, int]] = []
    at = start = n = 0
    while at < len(body):
        width = 4 + read(body, at)[0]
        if n and (n == every or (most_bytes is not None and at + width - start > most_bytes)):
            cuts.append((n, at))
            start, n = at, 0
        at += width
        n += 1
    if n:
        cuts.append((n, at))
    return cuts


class CountedKeys:
    """One counter's counted keys in a commit record, kept as the bytes they are bound with."""

    __slots__ = ("_keys", "body", "codec", "count")

    def __init__(self, codec: KeyCodec, count: int, body: bytes) -> None:
        self.codec = codec
        self.count = count
        self.body = body
        self._keys: list[Packed] | None = None

    @classmethod
    def of(cls, codec: KeyCodec, keys: Sequence[Packed]) -> CountedKeys:
        found = cls(codec, len(keys), codec.encode(keys))
        found._keys = [tuple(k) for k in keys]
        return found

    def __len__(self) -> int:
        return self.count

    @property
    def keys(self) -> list[Packed]:
        """The packed keys (decoded once, on first use)."""
        if self._keys is None:
            self._keys = self.codec.decode(self.body)
        return self._keys

    def in_values(self, most: int, most_bytes: int | None = None) -> list[tuple[int, Encoded]]:
        """The keys as ``IN ?`` values of at most ``most`` keys each, and of at most
        ``most_bytes`` (one key over it alone): (keys, value)."""
        if not self.count:
            return []
        if self.count <= most and (most_bytes is None or len(self.body) <= most_bytes):
            return [(self.count, Encoded(_INT32.pack(self.count) + self.body))]
        out: list[tuple[int, Encoded]] = []
        start = 0
        for n, cut in _offsets(self.body, most, most_bytes):
            out.append((n, Encoded(_INT32.pack(n) + self.body[start:cut])))
            start = cut
        return out
