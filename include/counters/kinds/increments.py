"""The default kind: one row per increment (seed 004), summed into the counter's value and
deleted once folded."""

from __future__ import annotations

from collections.abc import Mapping

from counters.kinds.base import DemoWriter, Kind, KindRules, Reconcile
from counters.kinds.registry import register


@register
class Increments(KindRules):
    kind = Kind.INCREMENTS
    counts = "the sum of its rows' increments"
    newer_rows = "their increments"
    value_column = "increment"
    keeps_rows = False
    yaml_defaults: Mapping[str, object] = {}
    derived_table = None
    summed = True
    members = False
    reads_from_floor = True
    creates_raw_table = True
    reset_refusal = None
    reconcile = Reconcile.NOTHING
    demo = DemoWriter.INCREMENTS
