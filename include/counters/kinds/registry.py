"""The kinds' rules by kind: each kind's module registers its one class here."""

from __future__ import annotations

from counters.kinds.base import Kind, KindRules

RULES: dict[Kind, KindRules] = {}


def register(cls: type[KindRules]) -> type[KindRules]:
    """Register ``cls``'s one instance as its kind's rules (instantiating it fails when it
    leaves out a hook); a second class for the same kind is refused."""
    rules = cls()
    if cls.kind in RULES:
        raise TypeError(f"kind {cls.kind.value!r} has rules already: {type(RULES[cls.kind])}")
    RULES[cls.kind] = rules
    return cls
