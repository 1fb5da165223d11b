"""Fault hooks for warm pool processes that a test does not run in its own process (a real
triggerer's pool): ``COUNTERS_WARM_POOL_SETUP=tests.pool_faults:install`` makes each pool
process watch the folder ``$COUNTERS_TEST_POOL_FAULTS``. A file ``<point>.<name>`` there (a
fault point of the engine: ``commit``, ``copy``, ``lease``, ...) holds one action, done by the
first pool process that reaches the point and takes the file:

- ``kill``: the process kills itself (SIGKILL), as a crashed pool process;
- ``sleep <seconds>``: it waits there (a slow node, a triggerer killed meanwhile);
- ``wait <path>``: it waits there until ``path`` exists (at most ``WAIT_CAP_S``): a pool
  process stalled while the trigger gave up on it and a worker did its run;
- ``tamper <keyspace.table> <counter> <value> <new>``: once the counter's readers' copy holds
  ``value``, someone overwrites it with ``new``, after the copy in write order (the file is
  taken only then).
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path

FAULTS_ENV = "COUNTERS_TEST_POOL_FAULTS"
SETUP = "tests.pool_faults:install"
WAIT_CAP_S = 300.0

_installed = ExitStack()


def _take(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:  # another process took it
        return False
    return True


def _tampered(spec: list[str]) -> bool:
    from counters.connection import Connection, ConnectionSettings

    table, counter, value, new = spec
    conn = Connection(ConnectionSettings.from_env())
    try:
        row = conn.session.execute(
            f"SELECT value, writetime(value) AS written FROM {table} WHERE type = %s", (counter,)
        ).one()
        if row is None or row.value != int(value):
            return False
        conn.session.execute(  # after the copy in write order, whatever this host's clock says
            f"UPDATE {table} USING TIMESTAMP %s SET value = %s WHERE type = %s",
            (row.written + 1, int(new), counter),
        )
        return True
    finally:
        conn.close()


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_CAP_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def install() -> None:
    """Watch ``$COUNTERS_TEST_POOL_FAULTS`` for the rest of this process's life."""
    from counters.airflow import tasks

    folder = Path(os.environ[FAULTS_ENV])

    def hook(point: str) -> None:
        for path in sorted(folder.glob(f"{point}.*")):
            try:
                action, *args = path.read_text().split()
            except FileNotFoundError:
                continue
            if action == "tamper":
                if _tampered(args):
                    path.unlink(missing_ok=True)
            elif _take(path):
                if action == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif action == "sleep":
                    time.sleep(float(args[0]))
                elif action == "wait":
                    _wait_for(Path(args[0]))

    _installed.enter_context(tasks.fault_hook(hook))
