"""docs/cli.md is generated from the CLI's own --help, and kept in step with it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cli_reference.py"


def _module():
    spec = importlib.util.spec_from_file_location("cli_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_up_to_date() -> None:
    reference = _module()
    assert reference.TARGET.read_text() == reference.render(), (
        "docs/cli.md is out of date: run .venv/bin/python scripts/cli_reference.py"
    )


def test_every_command_is_documented_with_help() -> None:
    from counters.cli import cli

    text = _module().render()
    for name, command in cli.commands.items():
        assert command.help, f"counterctl {name} has no help text"
        assert f"## counterctl {name}\n" in text
