"""Every family's lag against its freshness limit, for a watchdog outside Airflow.

The ``counters_freshness`` DAG alerts when a family falls behind, but it runs in the scheduler it
watches: a dead scheduler (or metadata DB) stops it too. ``counterctl health`` reads the same
state from Cassandra with the same rule (``status.freshness``), so cron, a Kubernetes probe or a
monitoring check can tell, from outside, that compaction stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import metrics
from .config import BrokenEntry, Family
from .connection import Connection
from .core import ClockOffset, clock_refusal, clock_tolerance, to_text
from .core.codec import encode
from .schema import SchemaError
from .status import Freshness, freshness
from .store import KnownFamily, Store, known_families

if TYPE_CHECKING:
    from .engine import RunOutcome

log = logging.getLogger(__name__)

HEALTHY = (Freshness.FRESH, Freshness.LATE)
"""Within the limit (a family more than half way to it is ``late``, still healthy)."""


@dataclass(frozen=True)
class LagSummary:
    """One family's freshness in plain values: a line of ``counterctl health --json`` and an
    entry of the freshness task's XCom (both through ``core.codec``)."""

    family: str
    state: str
    healthy: bool
    epoch: datetime | None
    behind_s: float | None
    limit_s: float
    dag_id: str
    problem: str | None
    clock_offset_s: float | None
    clock_tolerance_s: float
    clock_refused: str | None


@dataclass(frozen=True)
class FamilyLag:
    family: Family
    epoch: datetime | None
    state: Freshness
    behind: timedelta | None
    """``(now - lag) - compacted epoch``; None before the first run"""
    limit: timedelta
    problem: str | None = None
    """Why the state could not be read (the family's tables are missing)"""
    clock: ClockOffset | None = None
    """This host's clock against the cluster's, when measured (``now`` is the cluster's)"""

    @property
    def clock_refused(self) -> str | None:
        """Why this host would be refused for compacting the family (its clock is off by more
        than ``core.clock_tolerance``), None when it would not or the clock was not read."""
        if self.clock is None:
            return None
        return clock_refusal(self.family.name, self.family.lag, self.clock)

    @property
    def healthy(self) -> bool:
        """Within its freshness limit. A family never compacted is not: a watchdog must see a
        deployment whose runs never started (a new family is so until its first run)."""
        return self.problem is None and self.state in HEALTHY

    def summary(self) -> LagSummary:
        return LagSummary(
            family=self.family.name,
            state=self.state.value,
            healthy=self.healthy,
            epoch=self.epoch,
            behind_s=self.behind.total_seconds() if self.behind is not None else None,
            limit_s=self.limit.total_seconds(),
            dag_id=self.family.dag_id,
            problem=self.problem,
            clock_offset_s=self.clock.seconds if self.clock is not None else None,
            clock_tolerance_s=clock_tolerance(self.family.lag).total_seconds(),
            clock_refused=self.clock_refused,
        )

    def as_dict(self) -> dict[str, Any]:
        """``counterctl health --json``'s line (``core.codec``'s form of ``summary()``)."""
        return dict(encode(self.summary()))

    def line(self) -> str:
        if self.problem:
            return f"{self.family.name}\t{self.state.value}\t{self.problem}"
        behind = "never compacted" if self.behind is None else f"{self.behind} behind"
        epoch = to_text(self.epoch) if self.epoch else "-"
        line = (
            f"{self.family.name}\t{self.state.value}\t{behind} (limit {self.limit})\tepoch {epoch}"
        )
        if self.clock is not None:
            tolerance = clock_tolerance(self.family.lag).total_seconds()
            verdict = "REFUSED for compaction" if self.clock_refused else "ok"
            line += f"\tclock {self.clock.seconds:+.3f} s ({verdict}, limit {tolerance:g} s)"
        return line


def family_lag(
    family: Family, epoch: datetime | None, now: datetime, clock: ClockOffset | None = None
) -> FamilyLag:
    """Pure: the family's lag at ``now`` (the cluster's time) from its compacted epoch, and
    this host's ``clock`` offset when measured."""
    lag = freshness(epoch, now, family)
    return FamilyLag(family, epoch, lag.state, lag.behind, lag.limit, clock=clock)


def stale_after(family: Family) -> timedelta:
    """Pure: how far the compacted epoch may fall behind now before the family is stale (the
    freshness rule: ``now - lag - epoch > freshness``), sent as a gauge for alert rules."""
    return family.lag + family.freshness


def quarantined_now(store: Store) -> int | None:
    """How many of the family's counters are quarantined now, for the metric; None when it
    cannot be read (best effort: a metric must not fail a run, Cassandra may be what failed)."""
    try:
        return store.quarantine.count_quarantined()
    except Exception:
        log.warning(
            "family %s: could not count quarantined counters", store.family.name, exc_info=True
        )
        return None


def clock_offset(conn: Connection) -> float | None:
    """This host's clock minus the cluster's, in seconds, for the metric (the measurement its
    connection holds, else one read); None when it cannot be read (a metric must not fail a run)."""
    try:
        return conn.cluster_clock().offset.seconds
    except Exception:
        log.warning("could not read the cluster's clock", exc_info=True)
        return None


def read_lags(
    stores: Iterable[Store], now: datetime, clock: ClockOffset | None = None
) -> list[FamilyLag]:
    """One point read per family: its compacted epoch. A family whose tables are missing is
    reported (never compacted, with the reason), not a failure of the whole check. ``now``:
    the cluster's time; ``clock``: this host's offset from it, shown with every family."""
    lags = []
    for store in stores:
        try:
            epoch = store.state.family_epoch()
        except SchemaError as exc:
            lag = family_lag(store.family, None, now, clock)
            lags.append(replace(lag, epoch=None, behind=None, problem=str(exc)))
            continue
        lags.append(family_lag(store.family, epoch, now, clock))
    return lags


def unhealthy(lags: Sequence[FamilyLag]) -> list[FamilyLag]:
    return [lag for lag in lags if not lag.healthy]


@dataclass(frozen=True)
class Unconfigured:
    """A family the cluster knows (``store.known_families``) that the families YAML does not
    load: missing from it, or its entry broken. Its compaction DAG is gone, so it goes stale
    and nothing else alerts: the freshness check and ``counterctl health`` report it (and
    alert) until its entry loads again, or, once retired (``counterctl retire``) and removed
    from the YAML, list it as retired and stay quiet."""

    name: str
    keyspace: str
    epoch: datetime | None
    problem: str
    entry: BrokenEntry | None = None
    """Its broken entry in the YAML (None: it has none)."""
    retired: str | None = None
    """When and by whom it was retired (only for a family absent from the YAML)."""

    @property
    def healthy(self) -> bool:
        return self.retired is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "family": self.name,
            "keyspace": self.keyspace,
            "state": "retired" if self.retired else "unconfigured",
            "healthy": self.healthy,
            "epoch": to_text(self.epoch),
            "problem": self.problem,
            "retired": self.retired,
        }

    def line(self) -> str:
        epoch = to_text(self.epoch) if self.epoch else "-"
        state = "retired" if self.retired else "unconfigured"
        return f"{self.name}\t{state}\t{self.retired or self.problem}\tepoch {epoch}"


def watched_keyspaces(families: Sequence[Family], broken: Sequence[BrokenEntry]) -> list[str]:
    """The keyspaces whose families the checks look for (pure): every keyspace the YAML
    names, a broken entry's included."""
    return sorted({f.keyspace for f in families} | {b.keyspace for b in broken if b.keyspace})


def unconfigured(
    known: Sequence[KnownFamily],
    families: Sequence[Family],
    broken: Sequence[BrokenEntry],
    config: str,
) -> list[Unconfigured]:
    """The families the cluster knows that the YAML does not load (pure), each with why. A
    family absent from the YAML that was retired is listed as retired; a broken entry always
    counts as configured on purpose, retired or not."""
    loaded = {(f.keyspace, f.name) for f in families}
    out: list[Unconfigured] = []
    for family in known:
        if (family.keyspace, family.name) in loaded:
            continue
        entry = next(
            (b for b in broken if b.name == family.name and b.keyspace in (None, family.keyspace)),
            None,
        )
        if entry is not None:
            problem = (
                f"family {family.name!r} (keyspace {family.keyspace}) is not compacted: its "
                f"entry in {config} does not load, so it has no DAG: {entry.error}"
            )
            out.append(Unconfigured(family.name, family.keyspace, family.epoch, problem, entry))
            continue
        problem = (
            f"family {family.name!r} (keyspace {family.keyspace}) is not compacted: it is known "
            f"to the cluster but not in {config}, so it has no DAG. Put its entry back; or, if "
            f"it was removed on purpose, retire it (`counterctl retire --family {family.name}` "
            "while its entry is there, then remove the entry)"
        )
        retired = (
            f"retired {to_text(family.retired_at)} by {family.retired_by or '?'}"
            if family.retired_at is not None
            else None
        )
        out.append(Unconfigured(family.name, family.keyspace, family.epoch, problem, None, retired))
    return out


def read_unconfigured(
    conn: Connection,
    families: Sequence[Family],
    broken: Sequence[BrokenEntry],
    config: str,
) -> tuple[list[Unconfigured], list[str]]:
    """``unconfigured`` over what the cluster knows in the watched keyspaces (two small reads
    a keyspace), and why a keyspace could not be read (a role without its grants, a timeout):
    one such keyspace does not hide the others."""
    known: list[KnownFamily] = []
    problems: list[str] = []
    for keyspace in watched_keyspaces(families, broken):
        try:
            known += known_families(conn, keyspace)
        except Exception as exc:
            log.warning("keyspace %s: its families could not be read", keyspace, exc_info=True)
            problems.append(
                f"keyspace {keyspace}: families unreadable: {type(exc).__name__}: {exc}"
            )
    return unconfigured(known, families, broken, config), problems


def emit_run_metrics(store: Store, ended: RunOutcome, *, clock: bool = True) -> None:
    """A run's metrics (``metrics.emit_run``, from its audit row) with its family's health
    beside them: the counters quarantined now, the lag past which it is stale and, with
    ``clock``, this host's clock offset to the node (left out where the run failed before it
    reached the node). The DAG's tasks and ``counterctl compact`` send them this one way."""
    metrics.emit_run(
        ended.audit_row(),
        quarantined=lambda: quarantined_now(store),
        stale_after=stale_after(store.family),
        clock_offset=(lambda: clock_offset(store.conn)) if clock else None,
    )
