"""The launcher's wait for a starting node (scripts/cassandra_node.py): on the node's progress,
not a fixed time; a busy machine slows a start without failing it (issue #48 item 4)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import cassandra_node

    yield cassandra_node
    sys.modules.pop("cassandra_node", None)


def test_a_starting_node_is_waited_for_while_its_log_grows(node: ModuleType) -> None:
    timeout, stall = 120.0, node.STALL_S
    assert not node.gives_up(100, 0, timeout, progress_at=0)  # within its timeout
    assert not node.gives_up(200, 0, timeout, progress_at=200 - stall + 1)  # past it, logging
    assert node.gives_up(200, 0, timeout, progress_at=200 - stall - 1)  # past it, silent
    assert not node.gives_up(100, 0, timeout, progress_at=0)  # silent, but within its timeout
    bound = timeout * node.START_TIMEOUT_FACTOR
    assert node.gives_up(bound + 1, 0, timeout, progress_at=bound)  # logging, but past any bound
    assert not node.gives_up(bound - 1, 0, timeout, progress_at=bound - 1)


def test_the_log_size_is_what_the_node_has_written(
    node: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(node, "VAR_DIR", tmp_path)
    inst = node.Instance("x", 1, 2, 3, "1G")
    assert node.log_size(inst) == 0  # no log yet
    inst.log_dir.mkdir(parents=True)
    inst.system_log.write_text("INFO starting\n")
    inst.stdout_log.write_text("=== starting\n")
    assert node.log_size(inst) == len("INFO starting\n") + len("=== starting\n")
