"""``make run`` piped into ``tee`` and stopped with Ctrl-C stops everything it started.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group: ``scripts/run.sh`` and
the pipe's reader die together, so every line the shutdown logs goes to a dead pipe. The script
must still stop Airflow (its own process group), the demo writer and the Cassandra it started,
by their pids. The test runs the real script, with its own Cassandra instance, free ports and an
Airflow home in a tmp folder, in a session of its own (``setsid``), as ``run.sh 2>&1 | tee``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import PROJECT, free_port

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

RUN = PROJECT / "scripts" / "run.sh"
NODE_VAR = PROJECT / "var" / "cassandra"
START_TIMEOUT_S = 420
STOP_TIMEOUT_S = 150


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def wait_for(check, timeout_s: float, what: str, log: Path) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            raise AssertionError(f"{what} not after {timeout_s} s; run.sh output:\n{tail}")
        time.sleep(0.5)
    return time.monotonic() - started


def _ctrl_c_at_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def instance() -> Iterator[str]:
    """A Cassandra instance name of this test; its folder is removed afterwards (and the node
    stopped by its pid if the script under test failed to)."""
    name = f"runpipe{secrets.token_hex(2)}"
    yield name
    pid_file = NODE_VAR / name / "cassandra.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text().strip() or 0)
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(NODE_VAR / name, ignore_errors=True)


def test_expect_ctrl_c_on_a_piped_make_run_to_stop_airflow_the_writer_and_cassandra(
    instance: str, tmp_path: Path
) -> None:
    """Over 30 s, and why: the real ``make run`` starts what it starts (a Cassandra JVM of its
    own, ``airflow standalone``, the demo writer) before the Ctrl-C, and the test waits until
    each of them has stopped; nothing cheaper shows that nothing outlives the script."""
    run_dir = tmp_path / "run"
    output = tmp_path / "run.log"
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "JAVA_HOME", "USER")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env |= {
        "CASSANDRA_INSTANCE": instance,
        "CASSANDRA_PORT": str(free_port()),
        "CASSANDRA_STORAGE_PORT": str(free_port()),
        "CASSANDRA_JMX_PORT": str(free_port()),
        "CASSANDRA_HEAP": "512M",
        "AIRFLOW_PORT": str(free_port()),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "COUNTERS_RUN_DIR": str(run_dir),
        "COUNTERS_GX_RESULTS": str(tmp_path / "gx-results"),
    }
    # `make run 2>&1 | tee run.log` in a terminal: one foreground process group for both, with
    # Ctrl-C at its default action, as a terminal's shell starts a job (a shell cannot trap a
    # signal ignored when it started, and a parent run in the background of a non-interactive
    # shell, `make test &`, ignores SIGINT: run.sh then never saw the Ctrl-C)
    shell = subprocess.Popen(
        ["bash", "-c", f'"{RUN}" 2>&1 | tee "{output}" >/dev/null'],
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_ctrl_c_at_default,
        cwd=PROJECT,
    )
    pgid = shell.pid
    try:
        started_s = wait_for(
            lambda: output.exists() and "Airflow UI" in output.read_text(errors="replace"),
            START_TIMEOUT_S,
            "the banner",
            output,
        )
        text = output.read_text(errors="replace")
        airflow = int((run_dir / "airflow" / "standalone.pid").read_text().strip())
        writer = int(re.search(r"demo writer started \(pid (\d+)", text).group(1))  # type: ignore[union-attr]
        cassandra = int((NODE_VAR / instance / "cassandra.pid").read_text().strip())
        assert group_members(airflow), "Airflow runs in a process group of its own"
        assert alive(writer) and alive(cassandra)
        assert airflow not in group_members(pgid), "Airflow is outside the terminal's group"

        os.killpg(pgid, signal.SIGINT)  # Ctrl-C: run.sh and tee at once
        stopped_s = wait_for(
            lambda: (
                not group_members(pgid)
                and not group_members(airflow)
                and not alive(writer)
                and not alive(cassandra)
            ),
            STOP_TIMEOUT_S,
            "everything stopped",
            output,
        )
        print(f"banner after {started_s:.0f} s; everything stopped {stopped_s:.0f} s after Ctrl-C")
        assert shell.wait(timeout=10) != 0  # interrupted: the pipeline's status is tee's
    finally:
        for pid in group_members(pgid):
            os.kill(pid, signal.SIGKILL)
        airflow_pid = run_dir / "airflow" / "standalone.pid"
        if airflow_pid.exists():
            for pid in group_members(int(airflow_pid.read_text().strip())):
                os.kill(pid, signal.SIGKILL)
