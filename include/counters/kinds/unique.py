"""First-write-wins unique counters (seeds 000/001): each member is written once to a set
table, its first write derives one +1 row, and the value counts each member once."""

from __future__ import annotations

from collections.abc import Mapping

from counters.kinds.base import DemoWriter, DerivedTable, Kind, KindRules, Reconcile
from counters.kinds.registry import register


@register
class Unique(KindRules):
    kind = Kind.UNIQUE
    counts = "its distinct members (each counted once, from its first write)"
    newer_rows = "distinct new members"
    value_column = "member"
    keeps_rows = False
    yaml_defaults: Mapping[str, object] = {}
    derived_table = DerivedTable(suffix="_firsts", time="first_time", increment="increment")
    summed = True
    members = True
    reads_from_floor = False
    creates_raw_table = False
    reset_refusal = (
        "a unique counter cannot be reset: its set rows are written with timestamps near "
        "Long.MAX (first write wins), so no delete can remove them without also shadowing "
        "every later write of the same member"
    )
    reconcile = Reconcile.MEMBERS
    demo = DemoWriter.MEMBERS
