"""A whole run (``counterctl compact``): ``sequence``'s steps in order, the shards in a process
pool."""

from __future__ import annotations

import logging
import os
import pickle
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from itertools import repeat
from multiprocessing import get_context
from typing import Any

from ..config import Family
from ..connection import ConnectionSettings
from ..errors import EngineError
from ..gx import checks
from ..schema import RawLayout
from ..store import COMMIT_CHUNK, Store
from .cleanup import CleanupReport
from .common import Fault, Phases, ShardReport, new_run_id, no_fault
from .conclude import AuditHook
from .outcome import RunOutcome
from .sequence import (
    RunSteps,
    RunStopped,
    ShardJob,
    plan_step,
    run_shard_job,
    run_steps,
)

log = logging.getLogger(__name__)


def _die_with_parent(parent: int) -> None:
    """A shard worker ends with the run that started it, even one killed by SIGKILL (Linux:
    the kernel signals it; elsewhere it notices on its next task)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def portable_error(exc: BaseException, where: str) -> BaseException:
    """``exc`` if it survives the trip from a worker process to the run (pickled and rebuilt as
    the same type), else an ``EngineError`` that names it. A driver error holding a connection's
    lock, or an error whose constructor takes more than its message, would otherwise reach the
    run as "cannot pickle '_thread.RLock' object", without the error that happened."""
    try:
        if type(pickle.loads(pickle.dumps(exc))) is type(exc):
            return exc
    except Exception:  # unpicklable, or not rebuilt from its args
        pass
    return EngineError(f"{where}: {type(exc).__name__}: {exc}")


def _shard_step(
    settings: ConnectionSettings, family: Family, layout: RawLayout | None, job: ShardJob
) -> ShardReport | CleanupReport:
    """One shard's step in a worker process (its own connection)."""
    from ..connection import Connection

    try:
        with Connection(settings) as conn:
            return run_shard_job(Store(conn, family, layout), job)
    except BaseException as exc:
        where = f"family {family.name!r} shard {job.shard} {job.step}"
        portable = portable_error(exc, where)
        if portable is exc:
            raise
        log.error("shard %s %s failed", job.shard, job.step, exc_info=exc)  # the whole traceback
        raise portable from None


def _in_pool(pool: ProcessPoolExecutor, store: Store, jobs: Sequence[ShardJob]) -> list[Any]:
    """The shard jobs in the worker processes, each on its own connection."""
    settings = repeat(store.conn.settings)
    return list(pool.map(_shard_step, settings, repeat(store.family), repeat(store.layout), jobs))


def run_family(
    store: Store,
    epoch: datetime,
    run_id: str | None = None,
    *,
    dry_run: bool = False,
    use_lease: bool = True,
    workers: int = 1,
    commit_chunk: int = COMMIT_CHUNK,
    fault: Fault = no_fault,
    progress: Callable[[str], None] | None = None,
    now: datetime | None = None,
    on_audit: AuditHook | None = None,
) -> RunOutcome:
    """Every step of a run (what ``counterctl compact`` does): ``plan_step``, then
    ``run_steps``, the sequence the DAG runs too (GX suite included); ``workers`` > 1 runs the
    shards in that many processes (both cores: the client's CPU is the bound, not
    Cassandra's), while this one builds the GX suite (``checks.prepare``).
    ``on_audit(outcome)`` is called with how the run ended once its audit row is written
    (metrics). A
    failed check raises ``RunFailed`` after its ``failed`` audit row."""
    run_id = run_id or new_run_id()
    started = datetime.now(UTC)
    store.statements.requests.clear()
    phases = Phases()
    try:
        plan = plan_step(
            store,
            run_id,
            epoch,
            now,
            dry_run=dry_run,
            started_at=started,
            phases=phases,
            on_audit=on_audit,
        )
    except RunStopped as stop:
        return replace(stop.ended, requests=dict(store.statements.requests))
    parallel = workers > 1 and fault is no_fault and len(plan.shards) > 1
    pool = (
        ProcessPoolExecutor(
            min(workers, len(plan.shards)),
            mp_context=get_context("spawn"),
            initializer=_die_with_parent,
            initargs=(os.getpid(),),
        )
        if parallel
        else None
    )
    steps = RunSteps(
        store,
        plan,
        started,
        fault=fault,
        on_audit=on_audit,
        runner=None if pool is None else partial(_in_pool, pool, store),
        use_lease=use_lease,
        commit_chunk=commit_chunk,
        now=now,
    )
    # this process only waits while the shard processes compact: it builds the GX suite then
    gx_ready = checks.prepare(store.family.name) if pool is not None and not dry_run else None
    try:
        return run_steps(steps, phases, progress=progress)
    finally:
        if pool is not None:
            pool.shutdown()
        if gx_ready is not None:
            gx_ready.join()
