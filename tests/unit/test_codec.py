"""The one encoding of typed values (``core.codec``): a versioned dataclass survives plain JSON
with its times in the one format, and a payload of another version is refused naming the
type and the field."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from counters.core.codec import CodecError, decode, encode, versioned

pytestmark = pytest.mark.unit


def trip(value: Any) -> Any:
    """``value`` through what XCom stores (JSON text) and back."""
    return decode(type(value), json.loads(json.dumps(encode(value))))


def test_a_type_without_an_upgrade_refuses_a_payload_without_its_version():
    @versioned(3)
    @dataclass(frozen=True)
    class Probe:
        when: datetime
        named: tuple[str, ...] = ()

    value = Probe(datetime(2026, 11, 22, 10, 0), ("a",))
    assert encode(value) == {"v": 3, "when": "2026-11-22T10:00:00.000Z", "named": ["a"]}
    assert trip(value) == value
    with pytest.raises(CodecError, match=r"Probe: field 'v' is 0, expected 3"):
        decode(Probe, {"when": "2026-11-22T10:00:00.000Z", "named": []})
