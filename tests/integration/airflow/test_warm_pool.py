"""The warm pool runs a small run with the ``run`` task's own steps (the engine's one
sequencer): the same audit row and GX result as the task on a worker; each other ending is an
outcome the trigger hands back, with nothing audited twice and nothing deleted unchecked.

In this process (``warmpool.run_in_pool``, the fault hooks of today's tests) and in a real
spawned pool process (``WarmPool``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from counters.airflow import tasks, warmpool
from counters.airflow.poolrun import PoolOutcome, PoolRun
from counters.airflow.trigger import FamilyRunTrigger
from counters.airflow.warmpool import WarmPool
from counters.audit import Provenance
from counters.client import CounterClient
from counters.connection import ConnectionSettings
from counters.core import utc_aware as aware
from counters.core.codec import CodecError, decode, encode
from counters.store import Store

from tests.integration.airflow.test_compaction_dag import (
    load,
    overwrite_ibm_copy,
    raw_times,
    states,
)
from tests.integration.airflow.test_one_sequencer import compared
from tests.pool_faults import FAULTS_ENV, SETUP

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


@pytest.fixture(scope="module")
def warm_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmPool]:
    """One real pool process for the module's tests that run in a warm one (its warm-up, the
    GX suites and imports, is most of a pool test's cost), watching ``faults`` for
    ``tests.pool_faults``: a test that kills or stops it gets a new one on its next run."""
    faults = tmp_path_factory.mktemp("faults")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FAULTS_ENV, str(faults))  # the pool's processes read it when they start
        pool = WarmPool(processes=1, setup=SETUP)
        try:
            yield pool
        finally:
            pool.close()


def faults_folder() -> Path:
    """Where the pool's processes look for fault files (``warm_pool``)."""
    return Path(os.environ[FAULTS_ENV])


def pool_run(family: Any, scheduled: datetime, run_id: str) -> PoolRun:
    """The run the trigger would hand the pool for a DAG run scheduled at ``scheduled``."""
    return PoolRun(
        family=family,
        run_id=run_id,
        scheduled=scheduled,
        epoch=None,
        dry_run=False,
        provenance=Provenance("scheduled", None, {"dag_id": family.dag_id, "dag_run_id": run_id}),
        settings=ConnectionSettings.from_env(),
    )


def copy_value(store: Store, counter: str) -> int | None:
    """The readers' copy of ``counter`` (its compact row's value)."""
    f = store.family
    row = store.statements.session.execute(
        f"SELECT value FROM {f.keyspace}.{f.compact_table} WHERE type = %s", (counter,)
    ).one()
    return None if row is None else int(row.value)


def gx_result(stored: str) -> dict[str, Any]:
    """A stored GX result, the names that differ between two families' runs left out."""
    from counters.gx.evidence import RESULT_FILE

    path = Path(stored.removeprefix("file://")) / RESULT_FILE
    result = json.loads(path.read_text())
    return {
        "success": result["success"],
        "statistics": result["statistics"],
        "results": sorted(
            (r["expectation_config"]["type"], r["success"]) for r in result["results"]
        ),
    }


@pytest.mark.usefixtures("task_log")  # the lines at INFO: a CLI test may have set the root
def test_each_ending_of_a_run_in_the_pool_is_an_outcome_audited_once(  # logger to WARNING
    conn, make_families, dagbag, t0
):
    """In this process, with the fault hooks of the DAG tests: a family's first run (a sweep)
    is ``large`` (nothing done, nothing audited: a worker does it); a small run ``success``;
    a run whose epoch is not newer ``stopped`` (its ``noop`` row); a tampered counter
    ``failed``, audited ``partial`` in the pool and nothing of it deleted; an error ``error``,
    not audited (the worker that gets it back does the run), and its retry in the same process
    checks the family's tables again (a worker's fresh process would: a kept ``Store`` skipped
    the checks by the run id, and a TTL set on the compact table in between made readers lose
    the folded value)."""
    families = make_families({}, shape="one-task")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    load(client, t0)
    epoch = t0 + timedelta(minutes=5)

    first = warmpool.run_in_pool(pool_run(family, epoch + family.lag, "r1"))
    assert first.outcome == "large" and "sweep" in first.message, first
    assert store.audit.page(5) == []
    dag = dagbag().dags[family.dag_id]
    assert dag.test(logical_date=aware(epoch + family.lag)).state == "success"  # the worker

    small = warmpool.run_in_pool(pool_run(family, epoch + timedelta(minutes=3) + family.lag, "r2"))
    assert small.outcome == "success", small
    assert small.summary is not None and small.summary["rows_folded"] == 6
    assert any("audit row written" in line for line in small.log), small.log
    again = warmpool.run_in_pool(pool_run(family, epoch + timedelta(minutes=3) + family.lag, "r3"))
    assert again.outcome == "stopped" and again.message.startswith("noop"), again

    def fail_before_a_commit(point: str) -> None:
        if point == "keys":  # before a commit: r5 then writes IBM's copy, the tamper's cue
            raise RuntimeError("the node went away")

    with tasks.fault_hook(fail_before_a_commit):
        error = warmpool.run_in_pool(pool_run(family, t0 + timedelta(minutes=9) + family.lag, "r4"))
    assert (error.outcome, error.error) == ("error", "RuntimeError"), error
    assert copy_value(store, "IBM") == 45  # r4 committed nothing: r5's commit makes it 55
    # r4's retry (its run id kept) in the same process, after a TTL was set on the compact
    # table: checked again as a worker's fresh process checks it, and refused
    compact = f"{family.keyspace}.{family.compact_table}"
    conn.session.execute(f"ALTER TABLE {compact} WITH default_time_to_live = 3")
    try:
        retried = warmpool.run_in_pool(
            pool_run(family, t0 + timedelta(minutes=9) + family.lag, "r4")
        )
    finally:
        conn.session.execute(f"ALTER TABLE {compact} WITH default_time_to_live = 0")
    assert (retried.outcome, retried.error) == ("error", "SchemaError"), retried
    assert "default_time_to_live" in retried.message, retried
    assert copy_value(store, "IBM") == 45
    with tasks.fault_hook(overwrite_ibm_copy(store)):
        failed = warmpool.run_in_pool(
            pool_run(family, t0 + timedelta(minutes=10) + family.lag, "r5")
        )
    assert (failed.outcome, failed.checks) == ("failed", ("no_counter_quarantined",)), failed
    assert failed.counters and "IBM" in failed.counters[0], failed

    rows = {a["run_id"]: a["outcome"] for a in store.audit.page(10)}
    pooled = {k: v for k, v in rows.items() if k.startswith("r")}
    assert pooled == {"r2": "success", "r3": "noop", "r5": "partial"}, rows
    # IBM's row at t0+9m: neither the failed run nor the partial one deleted it
    assert len([t for t in raw_times(store, "IBM") if t <= t0 + timedelta(minutes=10)]) == 1
    assert client.read("AAPL") == 255


def test_a_small_run_in_a_pool_process_and_on_a_worker_leave_the_same_audit_row_and_gx_result(
    conn, make_families, dagbag, t0, warm_pool
):
    """Two families, the same rows: both first runs (sweeps) on a worker; then one family's
    small run by the DAG's task on a worker, the other's in a spawned pool process. Their
    audit rows are equal but for ids, times and provenance (``test_one_sequencer``'s
    comparison), and so are the stored GX results; the pool process then does a second run
    with the connection, statements and suite it kept."""
    families = make_families({}, {}, shape="one-task")
    on_worker, in_pool = (families.family(e["name"]) for e in families.entries)
    for family in (on_worker, in_pool):
        load(CounterClient(conn, family, Store(conn, family)), t0)
    bag = dagbag()
    first, second = t0 + timedelta(minutes=5), t0 + timedelta(minutes=10)
    for family in (on_worker, in_pool):
        assert (
            bag.dags[family.dag_id].test(logical_date=aware(first + family.lag)).state == "success"
        )

    run = bag.dags[on_worker.dag_id].test(logical_date=aware(second + on_worker.lag))
    assert run.state == "success" and states(run) == {"run": "success"}
    pool = warm_pool
    done = pool.submit(pool_run(in_pool, second + in_pool.lag, "pooled")).result(timeout=300)
    assert done.outcome == "success", done
    client = CounterClient(conn, in_pool, Store(conn, in_pool))
    client.record([*client_rows(second)])
    later = pool.submit(pool_run(in_pool, second + timedelta(minutes=2) + in_pool.lag, "p2"))
    again = later.result(timeout=300)
    assert again.outcome == "success" and again.pid == done.pid, (done, again)
    assert again.summary is not None and again.summary["rows_folded"] == 6  # 4 loaded + 2
    # the run's requests, each step's (not those after the last ``store_for``: the metrics')
    assert {"commit", "verify", "cleanup"} <= set(again.summary["requests"]), again.summary

    worker_row = Store(conn, on_worker).audit.page(5)[0]
    pool_rows = {r["run_id"]: r for r in Store(conn, in_pool).audit.page(5)}
    assert compared(pool_rows["pooled"]) == compared(worker_row)
    assert gx_result(pool_rows["pooled"]["gx_result"]) == gx_result(worker_row["gx_result"])
    assert (
        done.summary is not None and done.summary["gx_result"] == pool_rows["pooled"]["gx_result"]
    )


def client_rows(after: datetime) -> list[Any]:
    from tests.integration.airflow.test_compaction_dag import inc

    return [
        inc("IBM", 7, after + timedelta(seconds=30), 500),
        inc("AAPL", 8, after + timedelta(seconds=31), 501),
    ]


def test_a_pool_outcome_survives_the_event_a_worker_resumes_with() -> None:
    outcome = PoolOutcome(
        "failed",
        message="conservation check failed",
        checks=("compact_value_equals_before_plus_folded",),
        counters=("IBM: compact value 999 (expected 55 = 0 + 55)",),
        log=("INFO counters: audit row written",),
        cpu_s=0.25,
        pid=42,
    )
    assert decode(PoolOutcome, json.loads(json.dumps(encode(outcome)))) == outcome
    with pytest.raises(CodecError, match=r"PoolOutcome.outcome: expected one of .*, got 'done'"):
        decode(PoolOutcome, {**encode(outcome), "outcome": "done"})


class RecordedRequests:
    """``SUPERVISOR_COMMS`` of a trigger runner that records each Execution API request (the
    Task SDK's Variable, XCom and Connection calls all go through it) and answers none."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, msg: Any) -> None:
        self.sent.append(type(msg).__name__)

    async def asend(self, msg: Any) -> None:
        self.send(msg)


def test_each_outcome_ends_the_task_or_hands_it_back_without_an_api_request(
    make_families, monkeypatch
) -> None:
    """The event after the pool's outcome: a success ends the task with its one XCom and the
    end marker (the asset event when it committed), a noop or idle run skips it with the
    marker, a dry run skips it, and every other outcome is the event a worker resumes with,
    the outcome whole. None of them makes an Execution API request: in the triggerer each is
    served by its main process, whose first one builds the in-process API, with no heartbeat
    and no event handed on meanwhile (the task ended long after its run, and the triggerer
    could report its runner deadlocked; docs/airflow.md). Mutation: the streak read put back
    into ``end_event`` sends ``GetVariable``."""
    from airflow.sdk.execution_time import task_runner
    from airflow.triggers.base import TaskSkippedEvent, TaskSuccessEvent, TriggerEvent
    from counters.airflow.alerting import FAILING, state_key
    from counters.airflow.trigger import END_KEY, RunEnd, end_event

    requests = RecordedRequests()
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", requests, raising=False)
    family = make_families({}, shape="one-task").family_at(0)
    streak = state_key(family.name, FAILING)
    summary = {"family": family.name, "run_id": "r", "counters_committed": 2, "rows_folded": 3}
    extra = {"run_id": "r", "rows_folded": 3}
    committed = PoolOutcome("success", summary=summary, asset=extra, log=("INFO counters: a line",))
    done = end_event(family, committed)
    assert isinstance(done, TaskSuccessEvent) and done.xcoms is not None
    assert done.xcoms["summary"] == summary
    end = decode(RunEnd, json.loads(json.dumps(done.xcoms[END_KEY])))
    unlogged = PoolOutcome("success", summary=summary, asset=extra)
    assert (end.streak, end.outcome) == (streak, unlogged)
    assert end.asset is not None and end.asset["alias"] == f"counters_compacted_{family.name}"
    assert end.asset["extra"]["rows_folded"] == 3
    nothing = end_event(family, PoolOutcome("success", summary={"run_id": "r"}))
    assert isinstance(nothing, TaskSuccessEvent) and nothing.xcoms is not None
    assert decode(RunEnd, nothing.xcoms[END_KEY]).asset is None  # no asset event
    stopped = end_event(family, PoolOutcome("stopped", message="idle"))
    assert isinstance(stopped, TaskSkippedEvent) and stopped.xcoms is not None
    assert decode(RunEnd, stopped.xcoms[END_KEY]).outcome.message == "idle"
    dry = end_event(family, PoolOutcome("dry-run"))
    assert isinstance(dry, TaskSkippedEvent) and not dry.xcoms
    for back in ("failed", "large", "error", "timeout"):
        outcome = PoolOutcome(back, message=f"{back}!")
        event = end_event(family, outcome)
        assert type(event) is TriggerEvent and decode(PoolOutcome, event.payload) == outcome
    assert requests.sent == []
    with pytest.raises(CodecError, match=r"RunEnd: field\(s\) missing: streak"):
        decode(RunEnd, {"v": 1, "asset": None, "outcome": encode(PoolOutcome("success"))})


class AnswersAtTheTimeout(Future):  # type: ignore[type-arg]
    """A pool's run whose answer lands as the trigger's wait for it ends."""

    def cancel(self) -> bool:
        if not self.done():
            self.set_result(PoolOutcome("success", summary={"run_id": "r"}, asset={"e": 1}))
        return False


class FakePool:
    """``WarmPool``'s face to the trigger: hands out ``future``s, counts ``stop``s."""

    def __init__(self, future: Future) -> None:  # type: ignore[type-arg]
        self.future, self.stops = future, 0

    def submit(self, request: Any) -> Future:  # type: ignore[type-arg]
        self.future.set_running_or_notify_cancel()
        return self.future

    def stop(self) -> list[int]:
        self.stops += 1
        return []


def test_an_answer_at_the_timeout_is_the_runs_and_a_cancel_unqueues_the_run() -> None:
    """The pool's answer that lands as the wait ends is the run's outcome (handed back as a
    timeout, a committed run would be redone as a ``noop`` and its task skipped; a failed one
    redone instead of failing at once), with no stop. A trigger cancelled while its run is
    still queued (Airflow's own timeout, a triggerer's shutdown) cancels the run, so it never
    starts beside the task's next try (``asyncio.wrap_future`` passes the cancel on). Mutation:
    ``_late`` without its ``done`` branch stops the pool and hands back ``timeout``."""
    trigger = FamilyRunTrigger({"name": "f"})
    late = FakePool(AnswersAtTheTimeout())
    outcome = asyncio.run(trigger.in_pool(cast(PoolRun, None), 0.05, pool=cast(Any, late)))
    assert (outcome.outcome, outcome.asset, late.stops) == ("success", {"e": 1}, 0), outcome

    queued: Future = Future()  # type: ignore[type-arg]
    pool = FakePool(queued)
    pool.submit = lambda request: queued  # type: ignore[method-assign]  # not started

    async def cancelled() -> None:
        waiting = asyncio.ensure_future(trigger.in_pool(cast(PoolRun, None), 60, cast(Any, pool)))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with suppress(asyncio.CancelledError):
            await waiting

    asyncio.run(cancelled())
    assert queued.cancelled()


def test_a_run_waits_for_the_pool_until_shortly_before_airflows_own_timeout() -> None:
    """Airflow's timeout of the trigger fails the task and cancels the trigger without
    ``on_kill``: the run's wait for the pool ends ``BACKSTOP_MARGIN_S`` before it, and a pool
    timeout at or past it is refused where it is set."""
    from counters.airflow.trigger import BACKSTOP_MARGIN_S, TIMEOUT_ENV, pool_timeout, pool_wait

    now = datetime(2026, 11, 29, 15, 0)
    assert pool_wait(300.0, None, now) == 300.0
    assert pool_wait(300.0, now + timedelta(minutes=30), now) == 300.0
    assert pool_wait(300.0, now + timedelta(minutes=3), now) == 180.0 - BACKSTOP_MARGIN_S
    assert pool_wait(300.0, now + timedelta(seconds=30), now) == 0.0
    assert pool_wait(300.0, (now + timedelta(minutes=3)).replace(tzinfo=UTC), now) == 120.0
    assert pool_timeout({TIMEOUT_ENV: "600"}) == 600.0
    for bad in ("1800", "1740", "0", "soon"):
        with pytest.raises(ValueError, match=TIMEOUT_ENV):
            pool_timeout({TIMEOUT_ENV: bad})


def test_a_trigger_knows_who_triggered_its_dag_run() -> None:
    """Airflow 3.3.2 builds a trigger's DAG run without ``triggering_user_name``: a manual run
    done in the pool would audit no user. The triggerer's patch carries it (the whole path:
    ``test_trigger_runs``). Mutation: without ``carry_triggering_user`` the user is None."""
    from airflow.models.dagrun import DagRun
    from counters.airflow.trigger import carry_triggering_user

    def dag_run(run_id: str, run_type: str, user: str | None) -> DagRun:
        after = datetime(2026, 11, 29, 15, 0, tzinfo=UTC)
        return DagRun(
            dag_id="d",
            run_id=run_id,
            run_type=run_type,
            run_after=after,
            state="queued",
            triggering_user_name=user,
        )

    carry_triggering_user()
    carry_triggering_user()  # once: a second call wraps nothing again
    assert dag_run("manual-1", "manual", "alice").dag_run_data.triggering_user_name == "alice"
    assert dag_run("s", "scheduled", None).dag_run_data.triggering_user_name is None


def test_a_pool_that_does_not_answer_in_time_hands_the_run_back(
    make_families, t0, monkeypatch, tmp_path
) -> None:
    """No answer within the timeout (here: the pool process is still starting) is the outcome
    ``timeout``; the run not yet started is cancelled, so the pool never does it after the
    worker did."""
    import asyncio

    from counters.airflow.trigger import FamilyRunTrigger

    family = make_families({}, shape="one-task").family_at(0)
    trigger = FamilyRunTrigger(family.model_dump(mode="python"))
    pool = WarmPool(processes=1)
    try:
        outcome = asyncio.run(trigger.in_pool(pool_run(family, t0 + family.lag, "late"), 0.5, pool))
    finally:
        pool.close()
    assert outcome.outcome == "timeout" and outcome.handed_back, outcome
    assert "0.5 s" in outcome.message


def test_stop_ends_a_killed_pool_process_that_another_thread_reaped_first(
    make_families, t0
) -> None:
    """``WarmPool.stop`` after another thread of the triggerer reaped the killed process (the
    executor's own thread joins a pool process that died: when its ``waitpid`` comes first,
    ``multiprocessing`` in the stopping thread gets ECHILD and its ``is_alive`` says True for
    good): the process has ended, and ``stop`` says so instead of "still running after
    SIGKILL". Deterministic: the executor's thread is held in the run's failure (a callback
    of its future, run before that thread reaps) while this test kills and reaps the
    process itself, standing for the thread that came first."""
    family = make_families({}, shape="one-task").family_at(0)
    pool = WarmPool(processes=1)
    failing, go_on = threading.Event(), threading.Event()

    def hold(_future: Any) -> None:  # in the executor's thread, as it finds the pool broken
        failing.set()
        go_on.wait(60)

    try:
        future = pool.submit(pool_run(family, t0 + family.lag, "reaped"))
        future.add_done_callback(hold)
        deadline = time.monotonic() + 60
        while not pool_pids(pool) and time.monotonic() < deadline:
            time.sleep(0.01)
        [pid] = pool_pids(pool)  # still warming up: its run has not started
        os.kill(pid, signal.SIGKILL)
        assert failing.wait(60), "the executor never saw its process die"
        assert os.waitpid(pid, 0)[0] == pid  # reaped here, behind its Process's back
        assert pool.stop() == [pid]
    finally:
        go_on.set()
        pool.close()


# --- a run the pool does not end: back to a worker, exact --------------------------------

HANDED: list[PoolOutcome] = []
"""The outcomes the inline trigger handed back to the worker, in order (this module's test)."""
_deferred: dict[str, Any] = {}
"""The task instance that deferred and the pool timeout of its trigger (the inline trigger)."""


class InlineFamilyRunTrigger(FamilyRunTrigger):
    """``FamilyRunTrigger`` as ``dag.test()`` runs a trigger (in line, in this process): given
    the deferred task's instance, as the triggerer gives it one (``task_instance``)."""

    async def run(self) -> Any:
        from airflow.triggers.base import TaskSuccessEvent

        self.task_instance = _deferred["ti"]
        self.timeout_s = _deferred["timeout_s"]
        async for event in super().run():
            if not isinstance(event, TaskSuccessEvent) and event.payload:
                HANDED.append(decode(PoolOutcome, event.payload))
            yield event


def start_from_the_trigger(self: Any, context: Any) -> None:
    """``FamilyRun.execute`` in ``dag.test()``: what the scheduler does to a task that starts
    from the trigger (``TaskInstance.defer_task``: its ``start_trigger_args``), so that
    ``dag.test()`` runs the trigger in line and resumes the task on its ``next_method``."""
    from airflow.sdk.exceptions import TaskDeferred

    args = self.start_trigger_args
    assert self.start_from_trigger and args.next_method == "resume"
    _deferred["ti"] = context["ti"]
    raise TaskDeferred(
        trigger=InlineFamilyRunTrigger(**args.trigger_kwargs), method_name=args.next_method
    )


def pool_pids(pool: WarmPool) -> list[int]:
    executor = pool._executor
    return sorted(executor._processes) if executor is not None else []


def test_a_failed_check_a_timeout_or_a_dead_pool_process_goes_back_to_a_worker_exact(
    conn, make_families, dagbag, t0, tmp_path, monkeypatch, warm_pool
):
    """Four runs of a one-task family through the trigger (run in line by ``dag.test()``, the
    task deferred as the scheduler defers it) and a real pool process with
    ``tests.pool_faults``; each run the pool does not end resumes on a worker (the task's
    ``resume``), and after each the readers' values are the sums written:

    1. the first run, a sweep: ``large``, the worker does it;
    2. the pool process stalls after a commit and does not answer in time: ``timeout``; the
       trigger stops the pool's processes (by pid) before the worker does the run, carrying
       the pool's commit: one audit row, nothing counted twice;
    3. the pool process dies (SIGKILL) after a commit, before its cleanup: ``error``; the
       worker does the run, carrying that commit: one audit row with the run's whole rise;
    4. a check fails in the pool (IBM's copy overwritten): audited ``partial`` there, the
       worker fails the task at once, no second audit row, none of IBM's rows deleted;
    5. the task is marked failed while its run stalls in the pool before a commit (the
       trigger cancelled, then its ``on_kill``): the pool's processes are stopped, so the
       run commits nothing more and writes no audit row.

    One to two minutes under load: two pool processes start after the module's warm one is
    stopped or killed (the GX warm-up), five runs, and the timeout case waits for its
    timeout; one test so they share the family and the warm pool processes."""
    from counters import engine
    from counters.airflow import factory

    faults = faults_folder()
    monkeypatch.setattr(factory.FamilyRun, "execute", start_from_the_trigger)
    pool = warm_pool
    monkeypatch.setattr(warmpool, "_shared", pool)
    HANDED.clear()

    families = make_families({}, shape="one-task")
    family = families.family_at(0)
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    compact = f"{family.keyspace}.{family.compact_table}"
    written: dict[str, int] = {}

    def write(minute: int, amounts: dict[str, int]) -> None:
        from tests.integration.airflow.test_compaction_dag import inc

        at = t0 + timedelta(minutes=minute, seconds=1)
        client.record([inc(c, n, at, minute * 10 + i) for i, (c, n) in enumerate(amounts.items())])
        for c, n in amounts.items():
            written[c] = written.get(c, 0) + n

    def exact() -> None:
        names = sorted(written)
        assert {v.counter[0]: v.value for v in client.read_many(names)} == written

    def run(minute: int, timeout_s: float) -> Any:
        _deferred["timeout_s"] = timeout_s
        dag = dagbag().dags[family.dag_id]
        return dag.test(logical_date=aware(t0 + timedelta(minutes=minute) + family.lag))

    def audit(run_id: str) -> list[dict[str, Any]]:
        return [a for a in store.audit.page(20) if a["run_id"] == run_id]

    pids: set[int] = set()
    release = tmp_path / "release"  # a stalled pool process goes on (only if not stopped)
    try:
        # 1. a sweep: large, done by the worker (the pool process starts meanwhile)
        write(0, {"IBM": 1, "AAPL": 2})
        first = run(5, timeout_s=240)
        assert (first.state, states(first)) == ("success", {"run": "success"})
        assert [h.outcome for h in HANDED] == ["large"], HANDED
        exact()

        # 2. the pool stalls after a commit: timeout, its process stopped, the worker does
        #    the run
        write(6, {"IBM": 10, "AAPL": 20})
        warm = pool_pids(pool)
        pids.update(warm)
        (faults / "commit.wait").write_text(f"wait {release}")
        stalled = run(10, timeout_s=8)
        assert not list(faults.iterdir()), "the pool process never reached its commit"
        assert stalled.state == "success", states(stalled)
        assert HANDED[-1].outcome == "timeout", HANDED[-1]
        assert HANDED[-1].message.endswith(f"its processes {warm} stopped"), HANDED[-1]
        assert not [pid for pid in warm if _alive(pid)]
        exact()
        [row] = audit(stalled.run_id)  # the worker's alone: nothing counted twice
        assert (row["outcome"], row["rows_folded"], row["sum_folded"]) == ("success", 2, 30)

        # 3. the pool process dies after a commit, before its cleanup
        write(11, {"IBM": 100, "AAPL": 200})
        (faults / "commit.kill").write_text("kill")
        killed = run(15, timeout_s=240)
        assert killed.state == "success", states(killed)
        assert not list(faults.iterdir())
        assert (HANDED[-1].outcome, HANDED[-1].error) == ("error", None), HANDED[-1]
        assert "warm pool process died" in HANDED[-1].message
        exact()
        [row] = audit(killed.run_id)
        assert (row["outcome"], row["rows_folded"], row["sum_folded"]) == ("success", 2, 300)
        assert raw_times(store, "IBM") == [] and raw_times(store, "AAPL") == []

        # 4. a check fails in the pool: the worker fails the task, nothing of IBM deleted
        write(16, {"IBM": 1000, "AAPL": 2000})
        ibm = written["IBM"]
        (faults / "copy.tamper").write_text(f"tamper {compact} IBM {ibm} 999")
        tampered = run(20, timeout_s=240)
        pids.update(pool_pids(pool))
        assert not list(faults.iterdir())
        assert (tampered.state, states(tampered)) == ("failed", {"run": "failed"})
        assert HANDED[-1].outcome == "failed", HANDED[-1]
        assert [a["outcome"] for a in audit(tampered.run_id)] == ["partial"]
        assert len(raw_times(store, "IBM")) == 1 and raw_times(store, "AAPL") == []
        engine.release(store, ("IBM",))  # the operator's fix: the copy from the ledger
        exact()

        # 5. the task is marked failed (or cleared) while its run stalls in the pool before a
        #    commit: Airflow cancels the trigger and calls its on_kill, which stops the pool
        write(21, {"IBM": 10_000, "AAPL": 20_000})
        warm = pool_pids(pool)
        pids.update(warm)
        (faults / "keys.wait").write_text(f"wait {release}")
        ended_by_hand = pool_run(family, t0 + timedelta(minutes=25) + family.lag, "by-hand")
        asyncio.run(mark_failed(FamilyRunTrigger(family.model_dump()), ended_by_hand, pool))
        assert not list(faults.iterdir()), "the pool process never reached its commit"
        assert warm and not [pid for pid in warm if _alive(pid)], warm
        release.touch()  # a pool process still alive would commit and audit now
        assert audit("by-hand") == []
        exact()
    finally:
        release.touch()
        pids.update(pool_pids(pool))
        pool.close()
    alive = [pid for pid in pids if _alive(pid)]
    assert not alive, f"pool processes left running: {alive}"


async def mark_failed(trigger: FamilyRunTrigger, request: PoolRun, pool: WarmPool) -> None:
    """What the triggerer does when a deferred task is marked failed, succeeded or cleared
    (``TriggerRunner.run_trigger``): cancel the trigger's task, then call its ``on_kill``;
    here once the run stalls in the pool at a fault file it took (``keys.wait``)."""
    at_work = asyncio.create_task(trigger.in_pool(request, 240, pool))
    faults = Path(os.environ[FAULTS_ENV])
    deadline = asyncio.get_running_loop().time() + 240
    while list(faults.glob("keys.*")) and not at_work.done():
        assert asyncio.get_running_loop().time() < deadline, "the run never reached 'keys'"
        await asyncio.sleep(0.05)
    assert not at_work.done(), at_work.result()
    at_work.cancel()
    with suppress(asyncio.CancelledError):
        await at_work
    await trigger.on_kill()


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
