"""Family kinds as rules chosen once: ``Family.rules`` is its kind's ``KindRules``. One module
per kind; CONTRIBUTING.md, "Adding a kind", says what a new one takes."""

from counters.kinds import increments, rows, unique
from counters.kinds.base import DemoWriter, DerivedTable, Kind, KindRules, Reconcile
from counters.kinds.registry import RULES

KIND_MODULES = (increments, rows, unique)
"""Imported for their registration (each registers its class in ``RULES``)."""

__all__ = ["KIND_MODULES", "RULES", "DemoWriter", "DerivedTable", "Kind", "KindRules", "Reconcile"]
