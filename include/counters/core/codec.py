"""One encoding of the run's typed values as plain JSON (XCom, worker processes), driven by
their dataclass fields.

``encode`` writes a dataclass as ``{"v": N, ...fields}`` (``v`` only for a type registered
with ``versioned``; a nested unregistered dataclass is its fields alone), times with
``moments.to_text`` (the one format), tuples as lists and mappings' keys as text. ``decode``
is strict: a version it does not know, a field missing or one it does not know is refused
with a ``CodecError`` naming the type and the field, never guessed. A type whose older form
is stored somewhere (an XCom a previous release wrote, read by a task the new release runs)
registers an ``upgrade`` hook that turns that form into the current one; a payload without
``v`` is version 0, the form before versions.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import cache
from typing import Any, Generic, TypedDict, TypeVar, Union

from .moments import from_text, to_text

T = TypeVar("T")

VERSION_KEY = "v"

Upgrade = Callable[[int, dict[str, Any]], dict[str, Any]]
"""``(version, payload) -> payload``: an older stored form as the current one (without ``v``);
raises ``CodecError`` for a version it does not read."""


class CodecError(ValueError):
    """A payload that does not decode to its type: names the type and the field."""


class Encoded(TypedDict, Generic[T]):
    """A ``T`` as ``encode`` wrote it (plain JSON, ``decode(T, ...)`` reads it back): what the
    DAG's tasks pass each other across XCom, typed by what it holds."""

    v: int


@dataclasses.dataclass(frozen=True)
class _Layout:
    version: int
    upgrade: Upgrade | None


_layouts: dict[type, _Layout] = {}


def versioned(version: int, upgrade: Upgrade | None = None) -> Callable[[type[T]], type[T]]:
    """Register a dataclass's layout version (and how its older stored forms read)."""

    def register(cls: type[T]) -> type[T]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__name__} is not a dataclass")
        _layouts[cls] = _Layout(version, upgrade)
        return cls

    return register


def fields_unchanged(name: str, version: int = 1) -> Upgrade:
    """The upgrade of a type whose form before versions (no ``v``, version 0) had the fields
    it has now: a previous release's XCom reads as it is; any other version is refused."""

    def upgrade(found: int, payload: dict[str, Any]) -> dict[str, Any]:
        if found != 0:
            raise CodecError(f"{name}: field 'v' is {found!r}, expected {version}")
        return payload

    return upgrade


def fields_added(name: str, version: int, **added: Any) -> Upgrade:
    """The upgrade of a type whose every earlier form (no ``v``, or a version before
    ``version``) lacked the fields ``added``: it reads with their defaults; a later version is
    refused."""

    def upgrade(found: int, payload: dict[str, Any]) -> dict[str, Any]:
        if not 0 <= found < version:
            raise CodecError(f"{name}: field 'v' is {found!r}, expected {version}")
        return {**payload, **added}

    return upgrade


def encode(value: T) -> Encoded[T]:
    """``value`` (a dataclass) as plain JSON."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        raise TypeError(f"encode takes a dataclass instance, not {type(value).__name__}")
    return typing.cast(Encoded[T], _encode(value))


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        layout = _layouts.get(type(value))
        if layout is not None:
            out[VERSION_KEY] = layout.version
        for f in dataclasses.fields(value):
            out[f.name] = _encode(getattr(value, f.name))
        return out
    if isinstance(value, datetime):
        return to_text(value)
    if isinstance(value, Mapping):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot encode a {type(value).__name__}: {value!r}")


def decode(cls: type[T], data: Mapping[str, Any]) -> T:
    """``encode``'s inverse, strict: ``CodecError`` names the type and the field."""
    return typing.cast(T, _decode_dataclass(cls, data, cls.__name__))


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode_dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise CodecError(f"{where}: expected an object, got {type(data).__name__}: {data!r}")
    payload = dict(data)
    layout = _layouts.get(cls)
    if layout is not None:
        version = payload.pop(VERSION_KEY, 0)
        if version != layout.version:
            if layout.upgrade is None or not isinstance(version, int):
                raise CodecError(
                    f"{where}: field 'v' is {version!r}, expected {layout.version} "
                    f"({cls.__name__} reads no other version)"
                )
            try:
                payload = layout.upgrade(version, payload)
            except CodecError as exc:  # the hook names the type; say where it was nested
                if where == cls.__name__:
                    raise
                raise CodecError(f"{where}: {exc}") from None
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    missing = [n for n in names if n not in payload]
    if missing:
        raise CodecError(f"{where}: field(s) missing: {', '.join(missing)}")
    extra = sorted(set(payload) - set(names))
    if extra:
        raise CodecError(f"{where}: unknown field(s): {', '.join(extra)}")
    hints = _hints(cls)
    return cls(**{n: _decode(hints[n], payload[n], f"{where}.{n}") for n in names})


def _decode(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) != 1:
            raise TypeError(f"{where}: cannot decode the union {hint}")
        return _decode(options[0], value, where)
    if dataclasses.is_dataclass(hint):
        return _decode_dataclass(typing.cast(type, hint), value, where)
    if origin is typing.Literal:
        if value not in args:
            raise CodecError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if hint is datetime:
        if not isinstance(value, str):
            raise CodecError(f"{where}: expected a time as text, got {value!r}")
        try:
            return from_text(value)
        except ValueError as exc:
            raise CodecError(f"{where}: {exc}") from None
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise CodecError(f"{where}: expected a list, got {value!r}")
        item = args[0] if args else Any
        items = [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin in (dict, Mapping, typing.Mapping) or hint in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise CodecError(f"{where}: expected an object, got {value!r}")
        key, val = args if args else (Any, Any)
        return {_key(key, k, where): _decode(val, v, f"{where}[{k!r}]") for k, v in value.items()}
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CodecError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint in (int, str, bool):
        if type(value) is not hint:
            raise CodecError(f"{where}: expected {hint.__name__}, got {value!r}")
        return value
    raise TypeError(f"{where}: cannot decode the type {hint}")


def _key(hint: Any, key: str, where: str) -> Any:
    if hint is int:
        try:
            return int(key)
        except ValueError:
            raise CodecError(f"{where}: key {key!r} is not a whole number") from None
    return key
