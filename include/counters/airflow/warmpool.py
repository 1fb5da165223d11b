"""The warm compaction pool: small runs done in long-lived processes next to the triggerer.

A family's ``run`` task starts from the trigger (:mod:`counters.airflow.trigger`), and the
trigger hands the run to this pool: ``COUNTERS_WARM_POOL_PROCESSES`` processes (default one per
core), started by the triggerer's trigger runner on its first run, not deployed apart. Each
keeps what a task process builds for every run and throws away: the Cassandra connection, each
family's table layout and prepared statements (``runtime.store_for``), the GX suites and the
heavy imports (``preload.preload_tasks``, once per process). A process runs the run's steps
with the same functions as the ``run`` task on a worker (``tasks.plan``, then
``tasks.whole_run``: the engine's one sequencer, ``compaction/sequence.py``), only when the plan
says the run is small; what a run did comes back as a :class:`PoolOutcome` with the run's log
lines, for the trigger to log into the task's log.

A pool process has no Airflow to ask: the trigger passes the connection's settings with each
run, and a process reads no Variable (the alert streaks stay with the trigger). Connections of
a GX results store or an archive are found only in the environment or a secrets backend
there; a run that needs one from the metadata DB fails in the pool and goes back to a worker.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from .metadata import DB_ACCESS_BLOCKED, DB_URL_VARIABLES
from .poolrun import Outcome, PoolOutcome, PoolRun

log = logging.getLogger(__name__)

PROCESSES_ENV = "COUNTERS_WARM_POOL_PROCESSES"
STOP_WAIT_S = 30.0
"""How long ``WarmPool.stop`` waits for its killed processes to end."""
SETUP_ENV = "COUNTERS_WARM_POOL_SETUP"
"""``module:function`` each pool process calls after its warm-up (tests install their fault
hooks with it; a deployment could set up tracing)."""


def processes(env: Mapping[str, str] | None = None) -> int:
    """The pool's size: ``$COUNTERS_WARM_POOL_PROCESSES``, else one per core."""
    env = os.environ if env is None else env
    text = (env.get(PROCESSES_ENV) or "").strip()
    if not text:
        return os.cpu_count() or 1
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{PROCESSES_ENV} must be a whole number of processes >= 1, got {text!r}")
    return int(text)


# --- in a pool process -------------------------------------------------------------------


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


CAPTURED = ("counters", "cassandra")
"""The loggers whose lines are a run's log (the driver's: its warnings, as in a task's log)."""


@contextmanager
def _captured() -> Iterator[list[str]]:
    """The lines of ``CAPTURED`` loggers while the block runs (the run's log)."""
    handler = _Lines()
    for name in CAPTURED:
        logging.getLogger(name).addHandler(handler)
    try:
        yield handler.lines
    finally:
        for name in CAPTURED:
            logging.getLogger(name).removeHandler(handler)


def run_in_pool(request: PoolRun) -> PoolOutcome:
    """A family-run in this process, with the ``run`` task's own functions: the plan, then the
    whole run when it is small (the engine's ``run_steps``). Never raises: an error is the
    outcome ``error`` (nothing audited; the worker that gets the run back does it again)."""
    from airflow.sdk.exceptions import AirflowSkipException

    from . import runtime, tasks
    from .errors import CheckFailed

    started = time.process_time()
    family = request.family

    def ended(outcome: Outcome, lines: list[str], **fields: Any) -> PoolOutcome:
        cpu = round(time.process_time() - started, 3)
        return PoolOutcome(outcome, log=tuple(lines), cpu_s=cpu, pid=os.getpid(), **fields)

    with _captured() as lines:
        try:
            runtime.use_connection_settings(request.settings)
            runtime.start_try()
            try:
                run = tasks.plan(
                    family,
                    run_id=request.run_id,
                    scheduled=request.scheduled,
                    epoch=request.epoch,
                    dry_run=request.dry_run,
                    started_by=request.provenance,
                )
            except AirflowSkipException as stop:  # noop or idle, audited by the plan
                return ended("stopped", lines, message=str(stop))
            if not run.small:
                why = "a sweep" if run.sweep else "many counters touched"
                return ended("large", lines, message=f"not a small run ({why}): on a worker")
            try:
                done = tasks.whole_run(family, run)
            except AirflowSkipException as stop:  # a dry run, audited after verify
                return ended("dry-run", lines, message=str(stop))
            asset = done.asset_extra() if done.committed else None
            return ended("success", lines, summary=done.summary(), asset=asset)
        except CheckFailed as failed:  # audited by the step that found it
            return ended(
                "failed",
                lines,
                message=str(failed),
                checks=failed.checks,
                counters=failed.counters,
            )
        except Exception as exc:
            log.warning("family %s run %s failed in the pool", family.name, request.run_id)
            return ended(
                "error", lines, message=f"{type(exc).__name__}: {exc}", error=type(exc).__name__
            )


TITLE = "counters warm pool"
"""The pool processes' title (``ps``, the bench's process kinds)."""


def warm_process(setup: str | None = None) -> None:
    """A pool process's start: its title; the ``counters`` loggers at INFO and the driver's
    at WARNING, kept to themselves (the lines go back to the trigger with the run: through the
    triggerer's stdout they would be copied a second time, at the triggerer's cost), their
    warnings also to stderr; the preload (imports, GX suites, code version: once per
    process); then ``setup`` (``module:function``, ``SETUP_ENV``)."""
    try:
        import setproctitle

        setproctitle.setproctitle(TITLE)
    except ImportError:  # Airflow's own dependency; a title is only a convenience
        pass
    warnings = logging.StreamHandler()
    warnings.setLevel(logging.WARNING)
    for name, level in zip(CAPTURED, (logging.INFO, logging.WARNING), strict=True):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = False
        logger.addHandler(warnings)
    from . import preload

    preload.preload_tasks()
    if setup:
        module, _, function = setup.partition(":")
        getattr(importlib.import_module(module), function)()


# --- in the triggerer ----------------------------------------------------------------------

POOL_DB_URL = "sqlite://"
"""The metadata DB's URL in a pool process: an empty in-memory SQLite (the process reads and
writes no metadata; an Airflow import there needs a URL it can parse, and the trigger
runner's blocked one is not)."""


@contextmanager
def _pool_environment() -> Iterator[None]:
    """While pool processes start (they are spawned with this process's environment): the
    metadata DB's URL that Airflow blocked in the trigger runner replaced by ``POOL_DB_URL``."""
    blocked = [name for name in DB_URL_VARIABLES if os.environ.get(name) == DB_ACCESS_BLOCKED]
    for name in blocked:
        os.environ[name] = POOL_DB_URL
    try:
        yield
    finally:
        for name in blocked:
            os.environ[name] = DB_ACCESS_BLOCKED


@dataclass
class WarmPool:
    """``processes`` long-lived processes (spawned: the trigger runner has threads and an event
    loop that a fork would copy mid-flight), started as runs arrive."""

    processes: int = field(default_factory=processes)
    setup: str | None = field(default_factory=lambda: os.environ.get(SETUP_ENV) or None)
    """``module:function`` each process calls after its warm-up (``SETUP_ENV``)."""
    _executor: ProcessPoolExecutor | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def submit(self, request: PoolRun) -> Future[PoolOutcome]:
        """Queue a run; a pool one of whose processes died (``BrokenProcessPool``: every run
        it held fails, and the trigger hands each back) is replaced by a new one."""
        with self._lock, _pool_environment():  # a submit may spawn a process
            if self._executor is not None:
                try:
                    return self._executor.submit(run_in_pool, request)
                except BrokenProcessPool:
                    log.warning("counters: a warm pool process died; starting a new pool")
                    self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = ProcessPoolExecutor(
                max_workers=self.processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=warm_process,
                initargs=(self.setup,),
            )
            log.info("counters: warm compaction pool of %d process(es) started", self.processes)
            return self._executor.submit(run_in_pool, request)

    def stop(self) -> list[int]:
        """Kill this pool's processes (SIGKILL) and wait until each has ended and is reaped
        (``_reaped``: by this thread or the executor's own); returns their pids. For a run
        the trigger gave up on while a process was at it: the worker that does the run again
        must not have the pool's attempt going on beside it (both hold the run's shard
        leases: a lease is the run's, not the process's). Every other run the pool held
        fails with ``BrokenProcessPool`` and goes to a worker too; the next run starts a
        new pool."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is None:
            return []
        processes = dict(executor._processes or {})  # pid -> multiprocessing.Process
        for process in processes.values():
            process.kill()  # SIGKILL unless its exit was seen (not a pid used again since)
        deadline = time.monotonic() + STOP_WAIT_S
        still = [
            pid
            for pid, process in processes.items()
            if not _reaped(process, deadline - time.monotonic())
        ]
        executor.shutdown(wait=False, cancel_futures=True)
        if still:
            raise RuntimeError(f"warm pool processes {still} still running after SIGKILL")
        log.warning("counters: warm pool processes %s stopped", sorted(processes))
        return sorted(processes)

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
                self._executor = None


def _reaped(process: BaseProcess, timeout: float) -> bool:
    """Whether a killed pool process ended and was reaped within ``timeout`` seconds, by this
    thread or another. Not ``Process.is_alive`` alone: the executor's own thread reaps a pool
    process that died as well (its ``is_alive`` and ``join``); when it does so while this
    thread joins the process, this thread's ``waitpid`` finds no such child, which
    ``multiprocessing`` takes for "not started yet": ``is_alive`` then says True for good. A
    child this process no longer has (``ChildProcessError``) was reaped: it has ended."""
    process.join(max(timeout, 0.0))
    if process.exitcode is not None:
        return True
    child = process.pid
    if child is None:  # never started
        return True
    try:
        pid, _status = os.waitpid(child, os.WNOHANG)
    except ChildProcessError:  # reaped by another thread of this process
        return True
    return pid == child  # 0: still running


_shared: WarmPool | None = None
_shared_lock = threading.Lock()


def shared() -> WarmPool:
    """The pool of this process (the triggerer's trigger runner), created on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = WarmPool()
        return _shared
