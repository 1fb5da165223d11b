"""The suite's time budget, shown at the end of every session (CONTRIBUTING.md, "Time budget"):
the session's wall time, each tier's share, the slowest tests, and those over the time a test
may take without saying why in its docstring. Shown, never asserted: a slow machine fails no
test."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

BUDGET_S = 30 * 60
"""The whole suite (`make test`, what CI runs) on 2 cores."""
SAYS_WHY_S = 30.0
"""A test that takes longer says why in its docstring."""
SLOWEST = 15

TIERS = (
    "tests/integration/engine",
    "tests/integration/airflow",
    "tests/integration/deploy",
    "tests/integration/cassandra_node",
    "tests/integration",
    "tests/cluster",
    "tests/bench",
    "tests/dags",
    "tests/unit",
)
"""Folders whose tests' times are summed, the first that holds a test wins."""


@dataclass(frozen=True)
class TestTime:
    nodeid: str
    seconds: float
    documented: bool


FAILURE_CHARS = 300
"""How much of a failure's last line the lanes' closing lines show."""


def failure_line(nodeid: str, when: str, message: str) -> str:
    """One line for a failed test: its id, the phase that failed (setup, call, teardown) and
    the first line of its error, so the tail of a log names what failed without the report
    above it."""
    first = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
    return f"{nodeid} ({when}): {first[:FAILURE_CHARS]}"


def tier_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return next((t for t in TIERS if path.startswith(t + "/")), "other")


def per_test(reports: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Each test's setup, call and teardown summed (``(nodeid, duration)`` of every report)."""
    totals: dict[str, float] = defaultdict(float)
    for nodeid, duration in reports:
        totals[nodeid] += duration
    return dict(totals)


def summary(wall_s: float, tests: list[TestTime]) -> list[str]:
    """The lines shown at the end of the session."""
    tiers: dict[str, list[float]] = defaultdict(list)
    for test in tests:
        tiers[tier_of(test.nodeid)].append(test.seconds)
    lines = [
        f"suite time: {wall_s / 60:.1f} min of pytest (budget {BUDGET_S // 60} min on 2 cores: "
        "CONTRIBUTING.md, Time budget)",
        "by tier (tests, minutes):",
    ]
    for tier, times in sorted(tiers.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {tier:<34} {len(times):>4} {sum(times) / 60:6.1f}")
    lines.append(f"the {SLOWEST} slowest tests (setup, call and teardown, seconds):")
    slowest = sorted(tests, key=lambda t: -t.seconds)[:SLOWEST]
    lines += [f"  {t.seconds:7.1f}  {t.nodeid}" for t in slowest]
    silent = [t for t in tests if t.seconds > SAYS_WHY_S and not t.documented]
    if silent:
        lines.append(f"over {SAYS_WHY_S:.0f} s without a docstring that says why:")
        lines += [f"  {t.seconds:7.1f}  {t.nodeid}" for t in silent]
    return lines
