#!/usr/bin/env python3
"""Write docs/cli.md from ``counterctl --help`` and every subcommand's ``--help``.

    .venv/bin/python scripts/cli_reference.py          # rewrite docs/cli.md
    .venv/bin/python scripts/cli_reference.py --check  # exit 1 if docs/cli.md is out of date

The reference is generated, never edited by hand: ``tests/unit/test_cli_reference.py`` fails
when it drifts from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

PROJECT = Path(__file__).resolve().parent.parent
TARGET = PROJECT / "docs" / "cli.md"

INTRO = """\
# counterctl reference

Generated from `--help` by `scripts/cli_reference.py` (do not edit; `make docs` rewrites it,
and a unit test fails when it is out of date). `counterctl` is installed into `.venv` by the
setup; `make run` puts `.venv/bin` first on the PATH of what it starts.

Exit codes: 0 done (or nothing to do), 1 unexpected error, 2 bad configuration or input (or an
epoch later than now - lag, or a permission the role lacks), 3 another run holds the family,
4 a conservation check failed or counters were quarantined (the rest of the family was
compacted), 5 Cassandra unreachable (or the login refused), 6 Cassandra could not serve a
request at the family's consistency level (too few live replicas, a timeout: retry),
7 reconcile or recount found differences, 8 `health`: a family is past its freshness limit or
was never compacted, 9 `recount`: no counter differs, but some cannot be rebuilt (their
evidence expired: the archive's retention removed the file of their last commit). Every
failure is one line naming the family and the reason (the driver's own connection warnings
only with `-v`).

Wherever the package is installed (the project's Dockerfile installs it) `counterctl` is on
the PATH; `python -m counters` is the same. `--conn-id cassandra_default` connects as the DAGs
do, through the Airflow connection.

Library use (the same calls the CLI makes):

```python
from counters.config import load_catalog
from counters.connection import connect
from counters.client import CounterClient

family = load_catalog().get("trades")
with connect() as conn:  # CASSANDRA_* environment
    client = CounterClient(conn, family)
    client.increment("IBM", 500, at=fill_time, identity=("P1", 2))  # a retry is the same row
    client.read("IBM")  # compact value + newer increments
```
"""


def render() -> str:
    from counters.cli import cli

    parts = [INTRO]
    with click.Context(cli, info_name="counterctl", terminal_width=100) as root:
        parts.append(f"## counterctl\n\n```\n{cli.get_help(root)}\n```\n")
        for name in sorted(cli.commands):
            command = cli.commands[name]
            with click.Context(command, info_name=name, parent=root, terminal_width=100) as ctx:
                parts.append(f"## counterctl {name}\n\n```\n{command.get_help(ctx)}\n```\n")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is out of date: run .venv/bin/python scripts/cli_reference.py")
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
