"""The whole suite's two lanes (tests/lanes.py): every test in exactly one, the tests that share
Airflow's SQLite DB or fixed addresses in one lane, and the combined budget and exit code."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from tests.lanes import (
    LANES,
    LaneResult,
    closing_lines,
    combined_budget,
    lane_of,
    prefixed,
    run,
    verdict,
)
from tests.timing import failure_line

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TEST_FILES = sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if p.is_file()
)


def _marks(path: Path) -> set[str]:
    """The tier marks a test module's ``pytestmark`` names (read, not imported)."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)}
    return set()


def test_every_test_file_runs_in_exactly_one_lane():
    assert len(TEST_FILES) > 100
    misplaced = {path: lane_of(path) for path in TEST_FILES if len(lane_of(path)) != 1}
    assert misplaced == {}, "a test file in no lane runs nowhere in `make test`; in two, twice"


def test_every_lane_folder_exists_and_is_named_once():
    folders = [f for lane in LANES.values() for f in lane]
    assert len(folders) == len(set(folders))
    assert all((ROOT / f).is_dir() for f in folders), folders


def test_cluster_and_airflow_db_tests_share_one_lane():
    """One session at a time on the SQLite DB of var/airflow-test and on the cluster's fixed
    addresses: every test file marked ``cluster``, and every ``airflow`` one that uses that DB,
    is in the services lane (the deploy test makes its own ``AIRFLOW_HOME``)."""
    shared = [
        path
        for path in TEST_FILES
        if "cluster" in _marks(ROOT / path)
        or ("airflow" in _marks(ROOT / path) and not path.startswith("tests/integration/deploy/"))
    ]
    assert len(shared) > 20
    assert {path: lane_of(path) for path in shared} == {path: ["services"] for path in shared}


def test_the_suite_fails_when_either_lane_fails():
    assert verdict([LaneResult("engine", 0, 1.0), LaneResult("services", 0, 2.0)]) == 0
    assert verdict([LaneResult("engine", 0, 1.0), LaneResult("services", 1, 2.0)]) == 1
    assert verdict([LaneResult("engine", 5, 1.0), LaneResult("services", 0, 2.0)]) == 5


def test_the_budget_sums_both_lanes_tests_and_shows_the_wall_time(tmp_path):
    for lane, tests in (
        ("engine", [("tests/integration/engine/test_a.py::t", 120.0, True)]),
        ("services", [("tests/cluster/test_b.py::t", 90.0, False)]),
    ):
        (tmp_path / f"{lane}.json").write_text(
            json.dumps(
                {
                    "wall_s": 1.0,
                    "tests": [{"nodeid": n, "seconds": s, "documented": d} for n, s, d in tests],
                }
            )
        )
    results = [LaneResult("engine", 0, 600.0), LaneResult("services", 0, 660.0)]
    lines = combined_budget(660.0, results, tmp_path)
    assert lines[0] == "2 lanes side by side: engine 10.0 min, services 11.0 min"
    assert lines[1].startswith("suite time: 11.0 min of pytest")
    assert "  tests/integration/engine              1    2.0" in lines
    assert "  tests/cluster                         1    1.5" in lines
    assert lines[-1] == "     90.0  tests/cluster/test_b.py::t"  # over 30 s, no docstring


def test_the_last_lines_name_each_failed_test_of_a_failed_lane(tmp_path):
    """CI keeps a long log's tail only: the failed tests are named after the budget."""
    line = failure_line("tests/cluster/test_b.py::t", "call", "\nassert 16 == 17\n +  where 16")
    assert line == "tests/cluster/test_b.py::t (call): assert 16 == 17"
    (tmp_path / "services.json").write_text(
        json.dumps({"wall_s": 1.0, "tests": [], "failed": [line]})
    )
    results = [LaneResult("engine", 0, 1.0), LaneResult("services", 1, 2.0)]
    assert closing_lines(results, tmp_path) == [
        "lane services: pytest exited 1",
        "  FAILED tests/cluster/test_b.py::t (call): assert 16 == 17",
    ]
    # a lane stopped before its end wrote no times: its exit code is still named
    assert closing_lines([LaneResult("engine", 2, 1.0)], tmp_path) == [
        "lane engine: pytest exited 2"
    ]


def test_lanes_run_side_by_side_and_relay_each_line_tagged(tmp_path, capsys, monkeypatch):
    """Two real sessions of a tiny test each, through ``run``: both outputs arrive tagged, and
    a failing lane's exit code is the suite's."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "test_a.py").write_text("def test_a():\n    print('from a')\n")
    (tmp_path / "b" / "test_b.py").write_text("def test_b():\n    assert False\n")
    lanes = {"one": (str(tmp_path / "a"),), "two": (str(tmp_path / "b"),)}
    monkeypatch.setattr("tests.lanes.LANES", lanes)
    monkeypatch.setattr("tests.lanes.ROOT", tmp_path)
    results = run(sys.executable, ["-q", "-s"], tmp_path / "times")
    out = capsys.readouterr().out
    assert [(r.lane, r.returncode) for r in results] == [("one", 0), ("two", 1)]
    assert verdict(results) == 1
    assert prefixed("one", "from a") in out
    assert "[two] " in out and "assert False" in out
    assert all(line.startswith(("[one] ", "[two] ")) for line in out.splitlines() if line)
