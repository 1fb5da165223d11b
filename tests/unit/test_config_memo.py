"""The families YAML parsed once per process: memoized on (path, mtime_ns, size)."""

import os
import time
from pathlib import Path

import pytest
from counters import config
from counters.config import file_stamp, load_families_leniently, memo_usable

pytestmark = pytest.mark.unit

ONE = """
families:
  - name: trades
    keyspace: ks
    raw_table: raw
    compact_table: compact
    lag: 90s
"""
TWO = ONE.replace("trades", "tradez").replace("raw_table: raw", "raw_table: rox")


def _age(path: Path, seconds: float) -> None:
    """Set the file's mtime ``seconds`` in the past (a file edited a while ago)."""
    then = time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(then, then))


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    parse = config._parse_leniently

    def counting(path: Path):
        calls.append(path)
        return parse(path)

    monkeypatch.setattr(config, "_parse_leniently", counting)
    return calls


def test_an_unchanged_file_is_parsed_once(tmp_path, monkeypatch):
    path = tmp_path / "families.yaml"
    path.write_text(ONE)
    _age(path, 60)
    calls = _count_parses(monkeypatch)
    first, _ = load_families_leniently(path)
    again, _ = load_families_leniently(path)
    assert [f.name for f in again] == [f.name for f in first] == ["trades"]
    assert calls == [path]
    again.clear()  # a caller's list is its own: the memo keeps its families
    assert [f.name for f in load_families_leniently(path)[0]] == ["trades"]


def test_a_changed_file_is_parsed_again(tmp_path, monkeypatch):
    path = tmp_path / "families.yaml"
    path.write_text(ONE)
    _age(path, 60)
    calls = _count_parses(monkeypatch)
    assert [f.name for f in load_families_leniently(path)[0]] == ["trades"]
    path.write_text(TWO)  # same size, new mtime
    assert len(TWO) == len(ONE)
    _age(path, 30)
    assert [f.name for f in load_families_leniently(path)[0]] == ["tradez"]
    assert len(calls) == 2


def test_a_file_changed_a_moment_ago_is_not_memoized(tmp_path, monkeypatch):
    """Its mtime comes from a coarse clock: a same-size rewrite within the tick would keep the
    stamp, so a fresh file is parsed every time until it is ``RACY_S`` old."""
    path = tmp_path / "families.yaml"
    path.write_text(ONE)
    calls = _count_parses(monkeypatch)
    load_families_leniently(path)
    stamp = file_stamp(path)
    path.write_text(TWO)
    if stamp is not None:  # the same stamp, as a rewrite within one clock tick would leave it
        os.utime(path, ns=(stamp[1], stamp[1]))
    assert [f.name for f in load_families_leniently(path)[0]] == ["tradez"]
    assert len(calls) == 2


def test_a_file_replaced_with_its_old_mtime_is_parsed_again(tmp_path, monkeypatch):
    """``cp -p`` or ``rsync -a`` of a same-size file keeps the old mtime; its ctime moves."""
    path = tmp_path / "families.yaml"
    path.write_text(ONE)
    _age(path, 30)
    calls = _count_parses(monkeypatch)
    assert [f.name for f in load_families_leniently(path)[0]] == ["trades"]
    old = path.stat().st_mtime_ns
    path.write_text(TWO)
    os.utime(path, ns=(old, old))
    assert [f.name for f in load_families_leniently(path)[0]] == ["tradez"]
    assert len(calls) == 2


def test_memo_usable_only_for_a_file_older_than_the_racy_window():
    now = 10_000_000_000_000
    assert memo_usable(("f", now - 3 * 10**9, 1, 7, now), now)
    assert not memo_usable(("f", now - 10**9, 1, 7, now), now)
    assert not memo_usable(None, now)


def test_a_missing_file_still_names_itself(tmp_path):
    with pytest.raises(config.ConfigError, match="cannot read families file"):
        load_families_leniently(tmp_path / "nope.yaml")
