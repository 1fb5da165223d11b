"""A family's ``run`` task started and ended by the triggerer: no executor, task process or
execution-API request for the runs the warm pool does.

The ``run`` task of a one-task DAG is ``factory.FamilyRun`` with ``start_from_trigger``: the
scheduler defers it at once (``DagRun.schedule_tis``) and the triggerer runs
:class:`FamilyRunTrigger`, which hands the run to the warm pool (:mod:`.warmpool`), logs
what the run did into the task's log and ends the task:

- a committed run: ``TaskSuccessEvent`` with the XCom ``summary`` and, when it committed
  something, the compact table's asset event, both written by the handler the triggerer
  registers (:func:`register_end_handler`) as a worker's are;
- a run that stopped (noop, idle) or a dry run: ``TaskSkippedEvent``;
- but a committed or stopped run of a family whose failing streak is open (its Variable
  exists) goes to a worker (``FamilyRun.resume``), which ends it as the ``run`` task does and
  sends the recovery notice: the handler finds the streak in its own transaction.
- anything else goes back to a worker through the task's ``next_method``
  (``FamilyRun.resume``): a failed check or quarantined counters (audited in the pool: the
  worker fails the task as the step would have, so alerts and the fail-at-once rule hold), a
  large run (a sweep or many counters: the worker does it, as today), an error, a pool that
  did not answer in time (its processes stopped first when the run had started there) or
  whose process died (the worker does the run again, with the task's retries and its failure
  callback's audit row).

``FAILED`` is never an event of this trigger: Airflow's own end-from-trigger failure knows
neither the retry policy nor the failure callbacks' audit row.

The trigger makes no Execution API request after the pool answers (no Variable, XCom or
Connection): each is served by the triggerer's main process through an in-process API
whose first request builds Cadwyn's versioned routes (seconds of CPU), and the main process
neither heartbeats nor hands events on meanwhile: the run's task would end that much later,
and past ``[triggerer] runner_health_check_threshold`` the triggerer reports its runner
deadlocked and loses its triggers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from airflow.listeners import hookimpl
from airflow.triggers.base import (
    BaseTrigger,
    TaskSkippedEvent,
    TaskSuccessEvent,
    TriggerEvent,
)

from ..config import Family
from ..core.codec import decode, encode, versioned
from ..core.moments import utc_naive
from .poolrun import PoolOutcome, PoolRun

if TYPE_CHECKING:
    from .warmpool import WarmPool

log = logging.getLogger(__name__)

TIMEOUT_ENV = "COUNTERS_WARM_POOL_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0
"""How long a run waits for the pool (queueing included: a minute's runs of many families
arrive together) before it goes back to a worker."""
BACKSTOP = timedelta(minutes=30)
"""The trigger's own timeout in Airflow (``StartTriggerArgs.timeout``): past it the task fails
(``__fail__``) and is retried; the pool's timeout hands the run to a worker long before."""
BACKSTOP_MARGIN_S = 60.0
"""How long before ``BACKSTOP`` a run's wait for the pool ends (time to stop the pool's
processes and hand the run back)."""
MIN_WAIT_S = 5.0
"""A run with less time than this to wait for the pool is handed to a worker at once."""

END_KEY = "counters_run_end"
"""The key of a success or skipped event's ``xcoms`` that marks the end of a family's run and
carries its :class:`RunEnd`: the triggerer's handler takes it out (no such XCom is written)."""


@versioned(1)
@dataclass(frozen=True)
class RunEnd:
    """How the trigger ended a family's run, for the triggerer's handler (``END_KEY``):
    ``streak``: the Variable of the family's failing streak (open: a worker ends the run and
    closes it); ``asset``: the compact table's asset event (None: nothing committed);
    ``outcome``: the pool's outcome without its log, the event a worker resumes with. Crosses
    as ``core.codec`` writes it."""

    streak: str
    asset: Mapping[str, Any] | None
    outcome: PoolOutcome


def pool_timeout(env: Mapping[str, str] | None = None) -> float:
    """``$COUNTERS_WARM_POOL_TIMEOUT_S``: seconds, under ``BACKSTOP`` (Airflow's own timeout
    fails the task and cancels the trigger without stopping the pool's work)."""
    env = os.environ if env is None else env
    text = (env.get(TIMEOUT_ENV) or "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < BACKSTOP.total_seconds() - BACKSTOP_MARGIN_S:
        raise ValueError(
            f"{TIMEOUT_ENV} must be a number of seconds > 0 and under "
            f"{BACKSTOP.total_seconds() - BACKSTOP_MARGIN_S:g}, got {text!r}"
        )
    return seconds


def pool_wait(timeout: float, timeout_after: datetime | None, now: datetime) -> float:
    """How long a run may wait for the pool: ``timeout``, but ending ``BACKSTOP_MARGIN_S``
    before Airflow's own timeout of the trigger (``timeout_after``, naive as UTC: a trigger
    that started late, after a triggerer was down). Past that one Airflow fails the task and
    cancels the trigger without ``on_kill``, and the pool's run would go on beside the task's
    next try. Pure."""
    if timeout_after is None:
        return timeout
    left = (utc_naive(timeout_after) - utc_naive(now)).total_seconds() - BACKSTOP_MARGIN_S
    return max(0.0, min(timeout, left))


def pool_run(family: Family, context: Mapping[str, Any]) -> PoolRun:
    """The run the task's context describes, as the ``run`` task would plan it (its run id,
    scheduled time, params and who started it), with the Cassandra connection's settings
    fetched now. Sync: the connection's fetch goes through the triggerer's supervisor."""
    from . import runtime, tasks

    dag_run, params = context["dag_run"], context["params"]
    return PoolRun(
        family=family,
        run_id=dag_run.run_id,
        scheduled=tasks.scheduled_time(dag_run),
        epoch=params.get("epoch"),
        dry_run=bool(params.get("dry_run")),
        provenance=tasks.provenance(dag_run, params),
        settings=runtime.fetch_connection_settings(),
    )


def asset_event(family: Family, extra: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The compact table's asset event of a run (its alias, the table, the ``extra``: the
    run's ``RunOutcome.asset_extra``), as the ``run`` task on a worker records it; None when
    the run committed nothing (no ``extra``)."""
    from . import assets

    if extra is None:
        return None
    table = assets.compact_asset(family)
    return {
        "alias": assets.compacted_alias(family).name,
        "name": table.name,
        "uri": table.uri,
        "extra": dict(extra),
    }


def end_event(family: Family, outcome: PoolOutcome) -> TriggerEvent:
    """The event that ends (or hands back) the task after the pool's ``outcome`` (pure: no
    Variable or other Execution API request, see the module)."""
    from .alerting import FAILING, state_key

    if outcome.handed_back:
        return TriggerEvent(encode(outcome))
    if outcome.outcome == "dry-run":
        return TaskSkippedEvent()
    streak = state_key(family.name, FAILING)
    unlogged = replace(outcome, log=())
    if outcome.outcome != "success":  # stopped: noop or idle
        return TaskSkippedEvent(xcoms={END_KEY: _json(RunEnd(streak, None, unlogged))})
    end = RunEnd(streak, asset_event(family, outcome.asset), unlogged)
    summary = dict(outcome.summary or {})
    return TaskSuccessEvent(xcoms={"summary": summary, END_KEY: _json(end)})


def _json(end: RunEnd) -> dict[str, Any]:
    """``end`` as an event's XCom value (Airflow types those as JSON values)."""
    return cast("dict[str, Any]", encode(end))


class FamilyRunTrigger(BaseTrigger):
    """Runs a family's run in the warm pool and ends the task (see the module). ``family``:
    the family's configuration as the DAG was built with it (``Family.model_dump``), so the
    triggerer needs no families YAML of its own."""

    def __init__(self, family: dict[str, Any], timeout_s: float | None = None):
        super().__init__()
        self.family = family
        self.timeout_s = timeout_s
        self._at_work: tuple[WarmPool, Future[PoolOutcome]] | None = None
        """The pool and the run handed to it, until the pool answered (``on_kill``)."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"family": self.family, "timeout_s": self.timeout_s},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        family = Family.model_validate(self.family)
        ti: Any = self.task_instance
        context = ti.get_template_context()
        timeout = pool_wait(
            self.timeout_s or pool_timeout(),
            getattr(self, "timeout_after", None),
            datetime.now(UTC),
        )
        try:
            if timeout < MIN_WAIT_S:
                outcome = PoolOutcome(
                    "timeout", message=f"{timeout:.0f} s left before the trigger's timeout"
                )
            else:
                request = await asyncio.to_thread(pool_run, family, context)
                outcome = await self.in_pool(request, timeout)
        except Exception as exc:  # the run never reached the pool: a worker does it
            self.log.warning("family %s: run not handed to the pool", family.name, exc_info=True)
            outcome = PoolOutcome("error", message=f"{type(exc).__name__}: {exc}")
        for line in outcome.log:
            self.log.info("%s", line)
        self.log.info(
            "family %s: %s in the warm pool (process %s, %.3f CPU-s)%s",
            family.name,
            outcome.outcome,
            outcome.pid or "-",
            outcome.cpu_s,
            "; handed to a worker: " + outcome.message if outcome.handed_back else "",
        )
        yield end_event(family, outcome)

    async def in_pool(
        self, request: PoolRun, timeout: float, pool: WarmPool | None = None
    ) -> PoolOutcome:
        """The pool's outcome of ``request`` (``pool``: the process's shared one); ``timeout``
        or a process that died (every run it held fails with ``BrokenProcessPool``) is an
        outcome that hands the run back. A run the pool started and did not end in time is
        stopped first (``WarmPool.stop``: its processes killed and waited for), so the worker
        that does it again is the only one at it; a run not started yet is cancelled."""
        from . import warmpool

        pool = pool or warmpool.shared()
        future = pool.submit(request)
        self._at_work = (pool, future)
        try:
            outcome = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            outcome = await self._late(pool, future, timeout)
        except BrokenProcessPool as exc:
            outcome = PoolOutcome("error", message=f"a warm pool process died: {exc}")
        self._at_work = None  # not on a cancel: ``on_kill`` may follow it (a cancel of this
        return outcome  # wait cancels a run still queued: ``wrap_future`` chains the cancel)

    @staticmethod
    async def _late(pool: WarmPool, future: Future[PoolOutcome], timeout: float) -> PoolOutcome:
        """The outcome of a run the pool did not answer in ``timeout``: its own when it ended
        as the wait did (a committed run handed back would be redone as a ``noop`` and its
        task skipped); else the run is cancelled, or stopped with the pool's processes when
        it is at work, and handed back."""
        if not future.cancel():
            if future.done():
                try:
                    return future.result()
                except BrokenProcessPool as exc:
                    return PoolOutcome("error", message=f"a warm pool process died: {exc}")
            stopped = await asyncio.to_thread(pool.stop)
            if future.done() and not future.cancelled():
                with contextlib.suppress(BrokenProcessPool):
                    return future.result()  # it ended while its processes were stopped
            message = f"no answer from the warm pool in {timeout} s"
            return PoolOutcome("timeout", message=f"{message}; its processes {stopped} stopped")
        return PoolOutcome("timeout", message=f"no answer from the warm pool in {timeout} s")

    async def on_kill(self) -> None:
        """The task instance was marked failed or succeeded, or cleared, while its run was in
        the pool (Airflow cancels the trigger, then calls this; not when a triggerer stops or
        hands its triggers to another). A run still queued is cancelled; one at work is
        stopped with the pool's processes (``WarmPool.stop``): it commits nothing more and
        writes no audit row, and the run's next try (after a clear) is the only one at it.
        The other runs the pool held go to workers. A commit the run made before is carried
        by the family's next run, as a crashed worker's is; its shard leases expire by
        their TTL, and a next run meanwhile waits for them (``LeaseHeld``, retried)."""
        at_work, self._at_work = self._at_work, None
        if at_work is None:
            return
        pool, future = at_work
        if future.cancel() or future.done():
            return
        stopped = await asyncio.to_thread(pool.stop)
        self.log.warning(
            "family %s: the task was ended by hand while its run was in the warm pool; the "
            "pool's processes %s stopped",
            self.family.get("name"),
            stopped,
        )


# --- in the triggerer's supervisor (metadata DB access) -----------------------------------

_registered = False


def record_asset_event(ti: Any, event: Mapping[str, Any], session: Any) -> None:
    """Record the compact table's event through the family's alias, as the execution API does
    for the ``run`` task's outlet events on a worker (``TaskInstance.register_asset_changes_in_db``,
    the same function): the same asset, alias link, ``extra`` and source task instance; the
    listeners' asset callbacks then run."""
    from airflow.api_fastapi.execution_api.datamodels.asset import AssetProfile
    from airflow.models.taskinstance import TaskInstance

    callbacks = TaskInstance.register_asset_changes_in_db(
        ti,
        [AssetProfile(name=event["alias"], type="AssetAlias")],
        [
            {
                "source_alias_name": event["alias"],
                "dest_asset_key": {"name": event["name"], "uri": event["uri"]},
                "dest_asset_extra": {},
                "extra": dict(event["extra"]),
            }
        ],
        session=session,
    )
    for callback in callbacks:
        callback()


def write_xcoms(ti: Any, xcoms: Mapping[str, Any], session: Any) -> None:
    """The XComs of a run ended from the trigger, stored as the execution API stores a task's
    (the value as it is, one JSON encoding): Airflow's own handler pushes them with the core
    ``TaskInstance.xcom_push``, which encodes a value twice (a pull then gets a string)."""
    from airflow.models.xcom import XComModel

    for key, value in xcoms.items():
        XComModel.set(
            key=key,
            value=value,
            dag_id=ti.dag_id,
            task_id=ti.task_id,
            run_id=ti.run_id,
            map_index=ti.map_index,
            serialize=False,
            session=session,
        )


def end_run(
    ti: Any, xcoms: Mapping[str, Any], asset: Mapping[str, Any] | None, session: Any
) -> None:
    """End a family's run from the trigger as Airflow's handler ends a task from a
    ``TaskSuccessEvent`` (no more trigger, state ``success``), with two differences: the XComs
    are written as a worker's are (``write_xcoms``) and the asset event is recorded
    (``record_asset_event``); and no task callback is queued: Airflow queues one for a success
    too, and the DAG processor then parses the whole DAG file only to find it is not a failure
    callback (it runs none for a success), a parse per few runs for nothing."""
    from airflow.utils.state import TaskInstanceState

    ti.trigger_id = None
    ti.set_state(TaskInstanceState.SUCCESS, session=session)
    write_xcoms(ti, xcoms, session)
    if asset is not None:
        record_asset_event(ti, asset, session)
    session.flush()


def streak_open(key: str, session: Any) -> bool:
    """Whether the failing streak's Variable exists, read in the handler's own transaction (the
    streaks are written with ``Variable.set``: to the metadata DB)."""
    from airflow.models.variable import Variable
    from sqlalchemy import select

    return session.scalar(select(Variable.id).where(Variable.key == key).limit(1)) is not None


def carry_triggering_user() -> None:
    """Give a trigger's DAG run who triggered it: Airflow 3.3.2 builds it
    (``DagRun.dag_run_data``, in the triggerer's main process) without
    ``triggering_user_name``, a field of the very model it builds, so a manual run or a
    backfill done in the pool would audit no Airflow user where a worker's audits theirs.
    Wraps that property in this process (the triggerer's)."""
    from airflow.models.dagrun import DagRun

    built = DagRun.__dict__["dag_run_data"]
    if getattr(built.fget, "carries_user", False):
        return

    def dag_run_data(run: Any) -> Any:
        data = built.fget(run)
        user = getattr(run, "triggering_user_name", None)
        if user and getattr(data, "triggering_user_name", None) is None:
            data = data.model_copy(update={"triggering_user_name": user})
        return data

    dag_run_data.carries_user = True  # type: ignore[attr-defined]
    DagRun.dag_run_data = property(dag_run_data)  # type: ignore[method-assign,assignment]


def register_end_handler() -> bool:
    """Teach this triggerer how a family's run ends from the trigger: Airflow ends a task from a
    ``TaskSuccessEvent`` (``models.trigger.handle_event_submit``, one handler per event type)
    without the task's outlet events, stores its XComs encoded twice and queues a success
    callback that only costs a DAG-file parse. A success or skipped event that carries
    ``END_KEY`` is ended here instead, in the same transaction: by ``end_run`` (a success) or
    as Airflow ends a skipped task; or, when the family's failing streak is open, handed to a
    worker with the pool's outcome (Airflow's handler of a plain event: the task's
    ``next_method``), which closes the streak with its notice. Every other event is
    Airflow's, untouched. Returns whether it registered now."""
    global _registered
    if _registered:
        return False
    from airflow.models.trigger import handle_event_submit
    from airflow.triggers.base import BaseTaskEndEvent

    carry_triggering_user()
    end_task = handle_event_submit.dispatch(BaseTaskEndEvent)
    resume = handle_event_submit.dispatch(TriggerEvent)

    def ended(event: BaseTaskEndEvent, *, task_instance: Any, session: Any) -> None:
        xcoms = dict(event.xcoms or {})
        data = xcoms.pop(END_KEY, None)
        if not isinstance(data, Mapping):  # not a family's run (or no such key)
            end_task(event, task_instance=task_instance, session=session)
            return
        end = decode(RunEnd, data)
        if streak_open(end.streak, session):
            resume(TriggerEvent(encode(end.outcome)), task_instance=task_instance, session=session)
        elif isinstance(event, TaskSuccessEvent):
            end_run(task_instance, xcoms, end.asset, session)
        else:
            end_task(type(event)(xcoms=xcoms or None), task_instance=task_instance, session=session)

    handle_event_submit.register(TaskSuccessEvent, ended)
    handle_event_submit.register(TaskSkippedEvent, ended)
    _registered = True
    return True


def runs_triggers(argv: list[str]) -> bool:
    """Whether ``argv`` is ``airflow triggerer`` (a job's type is not known yet when listeners
    hear of its start). Pure."""
    return bool(argv) and os.path.basename(argv[0]) == "airflow" and argv[1:2] == ["triggerer"]


class TriggererListener:
    """Airflow listener: registers the end handler when a triggerer's job starts."""

    @hookimpl
    def on_starting(self, component: Any) -> None:
        if type(component).__module__ != "airflow.jobs.job" or not runs_triggers(sys.argv):
            return
        try:
            register_end_handler()
        except Exception:
            log.exception("counters: could not register the end handler of the triggerer")
