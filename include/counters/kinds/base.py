"""What a family's kind decides, declared once per kind (CONTRIBUTING.md, "Adding a kind").

The engine, the store, the schema and the interfaces ask a family's ``rules`` (its kind's
``KindRules``) what to do; none of them compares the kind itself
(``tests/unit/test_kind_rules.py``).
A hook is a fact about the kind (which rows are summed, what a copy lists, what a reset or a
reconcile may do), not a step of the pipeline: the pipeline is one, and it reads these facts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    INCREMENTS = "increments"
    ROWS = "rows"
    UNIQUE = "unique"


class Reconcile(StrEnum):
    """What ``counterctl reconcile`` recounts a family's values against."""

    MEMBERS = "members"
    """The distinct members of a unique family's set table."""
    ROWS = "rows"
    """The kept rows of a rows family, after each counter's reset point."""
    NOTHING = "nothing"
    """Nothing is left to recount against: the folded rows are deleted."""


class DemoWriter(StrEnum):
    """What the demo writer (``make run``) writes to a family of the kind."""

    INCREMENTS = "increments"
    """Increments through the write API."""
    ORDERS = "orders"
    """Rows of seed 003's business table, written by plain CQL (the business application)."""
    MEMBERS = "members"
    """Members added through the write API (first write wins)."""


@dataclass(frozen=True)
class DerivedTable:
    """A table the engine folds instead of the raw table, derived from it by the write API:
    named after the raw table with ``suffix``, its rows keyed by ``time``, each adding
    ``increment``."""

    suffix: str
    time: str
    increment: str


class KindRules(ABC):
    """The facts one kind decides. Each kind is one subclass, registered in
    ``counters.kinds.RULES``; an abstract hook it leaves out fails at import."""

    kind: Kind

    @property
    @abstractmethod
    def counts(self) -> str:
        """What a counter's value counts, for people (the DAG's docs, the families page)."""

    @property
    @abstractmethod
    def newer_rows(self) -> str:
        """What the rows after a counter's epoch add to its value, for people (the read rule
        on a counter's page)."""

    @property
    @abstractmethod
    def value_column(self) -> str | None:
        """The raw table's column a row's contribution comes from (``columns.<this>``): the
        increment summed, the member counted once; None when each row counts one."""

    @property
    @abstractmethod
    def keeps_rows(self) -> bool:
        """The raw rows are the business's data: kept (``retention: keep``, the only one
        allowed) and counted by slice on the server; else folded one by one and deleted
        (``retention: delete``, the only one allowed)."""

    @property
    @abstractmethod
    def yaml_defaults(self) -> Mapping[str, object]:
        """Defaults of the family's YAML fields that differ for the kind."""

    @property
    @abstractmethod
    def derived_table(self) -> DerivedTable | None:
        """The table the engine folds when it is not the raw table itself."""

    @property
    @abstractmethod
    def summed(self) -> bool:
        """The folded table's rows carry an increment column, summed by folds and reads (False:
        each row counts one, and the table has no increment column)."""

    @property
    @abstractmethod
    def members(self) -> bool:
        """Each folded row stands for a member written first-write-wins to a set table, counted
        once: folds and reads take members distinct, the readers' copy lists the counted keys,
        cleanup marks the members counted before it deletes their rows (so the set table is
        the compactor's to write), and the write API adds members, not increments."""

    @property
    @abstractmethod
    def reads_from_floor(self) -> bool:
        """A run that is no sweep may read a marked counter's rows from its floor
        (``core.read_floor``) rather than whole: every row below it is folded and deleted, and
        the copy lists no keys that a whole read would have to find."""

    @property
    @abstractmethod
    def creates_raw_table(self) -> bool:
        """``counterctl init`` creates the raw table from ``columns`` (False: the table is the
        writers' own, or derived from a set table the kind creates)."""

    @property
    @abstractmethod
    def reset_refusal(self) -> str | None:
        """Why a counter of the kind cannot be reset (None: it can)."""

    @property
    @abstractmethod
    def reconcile(self) -> Reconcile:
        """What ``counterctl reconcile`` recounts the values against."""

    @property
    @abstractmethod
    def demo(self) -> DemoWriter:
        """What the demo writer writes to a family of the kind."""

    def reconcile_refusal(self) -> str:
        """Why reconcile refuses a family of the kind (only for ``Reconcile.NOTHING``)."""
        return (
            f"reconcile recounts a unique family's set or a rows family's rows; the folded rows "
            f"of a family of kind '{self.kind}' are deleted (late rows are reported by every "
            "compaction instead)"
        )
