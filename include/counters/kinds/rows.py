"""Cached row counts (seed 002/003): the rows are the business's data, kept and counted by
slice on the server, each row counting one."""

from __future__ import annotations

from collections.abc import Mapping

from counters.kinds.base import DemoWriter, Kind, KindRules, Reconcile
from counters.kinds.registry import register


@register
class Rows(KindRules):
    kind = Kind.ROWS
    counts = "its rows (each row counts one)"
    newer_rows = "count of rows"
    value_column = None
    keeps_rows = True
    yaml_defaults: Mapping[str, object] = {
        "compact_columns": {"value": "count", "epoch": "counted_until"},
        "discovery": "scan",
    }
    derived_table = None
    summed = False
    members = False
    reads_from_floor = False
    creates_raw_table = False
    reset_refusal = None
    reconcile = Reconcile.ROWS
    demo = DemoWriter.ORDERS
