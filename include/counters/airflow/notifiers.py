"""Alerts: to each channel the family configures, when it starts failing (or falls behind),
as a reminder while it keeps failing, and when it recovers (``alerting``: the streaks).

Channels (``alerts:`` in the families YAML; environment defaults for a family that leaves one
empty):

* email through the SMTP provider's ``SmtpNotifier`` (connection ``alerts.smtp_conn_id``,
  default ``counters_smtp``; recipients ``alerts.email`` or ``$COUNTERS_ALERT_EMAIL``,
  comma separated);
* Slack through the Slack provider's ``SlackWebhookNotifier`` (connection
  ``alerts.slack_webhook_conn_id`` or ``$COUNTERS_ALERT_SLACK_CONN_ID``);
* a plain JSON ``POST`` to ``alerts.webhook_url`` or ``$COUNTERS_ALERT_WEBHOOK_URL``, else
  through the HTTP provider's ``HttpNotifier`` to the HTTP connection
  ``$COUNTERS_ALERT_WEBHOOK_CONN_ID`` (default ``counters_webhook``) if it exists.

The alert names the family, DAG, run, task, the failed check(s), the counters affected (with
amounts, for conservation checks) and the task log's URL. A channel that fails is logged and does
not stop the others; nothing here connects before a task fails.
"""

from __future__ import annotations

import html
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import BaseNotifier

from ..config import Alerts, Family
from ..core import to_text
from .alerting import (
    DEFAULT_REMIND_EVERY,
    FAILING,
    Notice,
    Streak,
    StreakKind,
    VariableStreaks,
    after_failure,
    after_success,
    remind_every_of,
    state_key,
)

log = logging.getLogger(__name__)

EMAIL_ENV = "COUNTERS_ALERT_EMAIL"
SLACK_ENV = "COUNTERS_ALERT_SLACK_CONN_ID"
WEBHOOK_URL_ENV = "COUNTERS_ALERT_WEBHOOK_URL"
WEBHOOK_CONN_ENV = "COUNTERS_ALERT_WEBHOOK_CONN_ID"
DEFAULT_WEBHOOK_CONN_ID = "counters_webhook"
WEBHOOK_TIMEOUT_S = 10


@dataclass(frozen=True)
class Channels:
    """Where one family's alerts go, after applying the environment defaults."""

    email: tuple[str, ...] = ()
    smtp_conn_id: str = "counters_smtp"
    slack_webhook_conn_id: str | None = None
    webhook_url: str | None = None
    webhook_conn_id: str | None = None
    remind_every: timedelta = DEFAULT_REMIND_EVERY
    """While the family keeps failing: remind this often (0: never)."""

    @classmethod
    def for_family(cls, family: Family, env: Mapping[str, str] | None = None) -> Channels:
        return cls.for_alerts(family.alerts, env)

    @classmethod
    def for_alerts(cls, alerts: Alerts | None, env: Mapping[str, str] | None = None) -> Channels:
        """``alerts`` (None: none of its own) with the environment's defaults: the channels
        of a family whose YAML entry does not load are its entry's ``alerts`` if they validate
        alone, else the deployment's defaults (``$COUNTERS_ALERT_*``, ``counters_webhook``)."""
        env = os.environ if env is None else env
        alerts = alerts or Alerts()
        email = alerts.email or tuple(
            a.strip() for a in (env.get(EMAIL_ENV) or "").split(",") if a.strip()
        )
        webhook_url = alerts.webhook_url or env.get(WEBHOOK_URL_ENV) or None
        return cls(
            email=tuple(email),
            smtp_conn_id=alerts.smtp_conn_id,
            slack_webhook_conn_id=alerts.slack_webhook_conn_id or env.get(SLACK_ENV) or None,
            webhook_url=webhook_url,
            webhook_conn_id=None
            if webhook_url
            else (env.get(WEBHOOK_CONN_ENV, DEFAULT_WEBHOOK_CONN_ID) or None),
            remind_every=remind_every_of(alerts, env),
        )

    def describe(self) -> str:
        parts = []
        if self.email:
            parts.append(f"email to {', '.join(self.email)} via `{self.smtp_conn_id}`")
        if self.slack_webhook_conn_id:
            parts.append(f"Slack via `{self.slack_webhook_conn_id}`")
        if self.webhook_url:
            parts.append(f"JSON webhook {self.webhook_url}")
        elif self.webhook_conn_id:
            parts.append(f"JSON webhook via connection `{self.webhook_conn_id}` (if defined)")
        if not parts:
            return "none configured"
        reminders = f"reminders every {self.remind_every}" if self.remind_every else "no reminders"
        return "; ".join(parts) + f" (when it starts failing, {reminders}, when it recovers)"


@dataclass(frozen=True)
class Alert:
    family: str
    dag_id: str
    run_id: str
    task: str
    checks: tuple[str, ...]
    counters: tuple[str, ...]
    message: str
    log_url: str | None
    try_number: int | None = None
    kind: str = "failing"
    """``failing``, ``still_failing``, ``recovered`` (a family's runs); ``stale``,
    ``still_stale``, ``fresh_again`` (its freshness)"""
    since: str | None = None
    """When the streak began (UTC, ISO 8601)"""
    failures: int = 1
    """Failures in the streak so far (runs, or freshness checks)"""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def what(self) -> str:
        return ", ".join(self.checks) or "task failed"

    @property
    def subject(self) -> str:
        where = f"({self.dag_id} run {self.run_id})"
        since = f"since {self.since[:16].replace('T', ' ')} UTC" if self.since else ""
        if self.kind in ("still_failing", "still_stale"):
            state = "still failing" if self.kind == "still_failing" else "still stale"
            return (
                f"[counters] {self.family}: {state} {since}, {self.failures} "
                f"{'failed runs' if self.kind == 'still_failing' else 'stale checks'}: "
                f"{self.what} {where}"
            )
        if self.kind in ("recovered", "fresh_again"):
            state = "recovered" if self.kind == "recovered" else "fresh again"
            counted = "failed runs" if self.kind == "recovered" else "stale checks"
            return (
                f"[counters] {self.family}: {state} after {self.failures} {counted} {since} {where}"
            )
        return f"[counters] {self.family}: {self.what} {where}"

    def text(self) -> str:
        lines = [
            self.subject.removeprefix("[counters] ").replace(
                f"{self.family}: ", f"Counter family {self.family}: ", 1
            ),
            f"DAG {self.dag_id}, run {self.run_id}, task {self.task}"
            + (f" (try {self.try_number})" if self.try_number else ""),
            f"Failed check(s): {', '.join(self.checks) or '-'}",
            "Counters affected: " + ("; ".join(self.counters[:20]) or "-"),
            f"Log: {self.log_url or '-'}",
            "",
            self.message,
        ]
        return "\n".join(lines)

    def for_streak(self, kind: StreakKind, notice: Notice, streak: Streak | None) -> Alert:
        """This alert as the ``notice`` of a ``kind`` streak (its subject, kind and counts)."""
        names = {
            ("failing", "started"): "failing",
            ("failing", "reminder"): "still_failing",
            ("failing", "recovered"): "recovered",
            ("stale", "started"): "stale",
            ("stale", "reminder"): "still_stale",
            ("stale", "recovered"): "fresh_again",
        }
        return replace(
            self,
            kind=names[kind, notice],
            since=to_text(streak.since) if streak else self.since,
            failures=streak.failures if streak else self.failures,
        )

    def html(self) -> str:
        rows = "".join(
            f"<tr><th align='left'>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
            for k, v in (
                ("family", self.family),
                ("DAG", self.dag_id),
                ("run", self.run_id),
                ("task", self.task),
                ("failed check(s)", ", ".join(self.checks) or "-"),
                ("counters affected", "; ".join(self.counters[:20]) or "-"),
            )
        )
        link = (
            f"<p>Log: <a href='{html.escape(self.log_url)}'>{html.escape(self.log_url)}</a></p>"
            if self.log_url
            else ""
        )
        return f"<table>{rows}</table>{link}<pre>{html.escape(self.message)}</pre>"

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["checks"] = list(self.checks)
        data["counters"] = list(self.counters)
        data["subject"] = self.subject
        return data


def alert_from_context(family: str, context: Mapping[str, Any]) -> Alert:
    """Build the alert of a failed task from its Airflow context."""
    ti = context.get("ti") or context.get("task_instance")
    dag_run = context.get("dag_run")
    error = context.get("exception")
    task_id = getattr(ti, "task_id", None) or "?"
    map_index = getattr(ti, "map_index", -1)
    task = f"{task_id}[{map_index}]" if map_index is not None and map_index >= 0 else task_id
    checks: Sequence[str] = getattr(error, "checks", ()) or ()
    if not checks:
        kind = type(error).__name__ if isinstance(error, BaseException) else "failure"
        checks = (f"task {task_id} failed ({kind})",)
    try:
        log_url = getattr(ti, "log_url", None)
    except Exception:  # the URL is a nicety; never lose the alert over it
        log_url = None
    return Alert(
        family=family,
        dag_id=str(getattr(ti, "dag_id", None) or getattr(dag_run, "dag_id", None) or "?"),
        run_id=str(getattr(ti, "run_id", None) or getattr(dag_run, "run_id", None) or "?"),
        task=task,
        checks=tuple(checks),
        counters=tuple(getattr(error, "counters", ()) or ()),
        message=str(error) if error is not None else f"task {task_id} failed",
        log_url=log_url,
        try_number=getattr(ti, "try_number", None),
    )


def send_json(url: str, payload: Mapping[str, Any], timeout: float = WEBHOOK_TIMEOUT_S) -> int:
    import requests

    response = requests.post(url, json=payload, timeout=timeout)
    response.raise_for_status()
    return response.status_code


class JsonWebhookNotifier(BaseNotifier):
    """POST a JSON document to a plain URL (an HTTP connection goes through the HTTP
    provider's ``HttpNotifier``, which needs a connection).

    :param payload: the JSON body.
    :param url: the URL.
    """

    template_fields = ()

    def __init__(self, payload: Mapping[str, Any], *, url: str):
        super().__init__()
        if not url:
            raise ValueError("JsonWebhookNotifier needs a url")
        self.payload = dict(payload)
        self.url = url

    def notify(self, context: Any) -> None:
        send_json(self.url, self.payload)


def _connection_exists(conn_id: str) -> bool:
    from airflow.sdk import BaseHook

    try:
        BaseHook.get_connection(conn_id)
    except Exception:  # AirflowNotFoundException, or no API server outside a task
        return False
    return True


def deliver(alert: Alert, channels: Channels, context: Any = None) -> dict[str, str]:
    """Send ``alert`` to every channel; returns channel -> "sent" or the error."""
    from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    context = context if context is not None else {}
    outcome: dict[str, str] = {}
    senders: list[tuple[str, BaseNotifier]] = []
    if channels.email:
        senders.append(
            (
                "email",
                SmtpNotifier(
                    to=list(channels.email),
                    subject=alert.subject,
                    html_content=alert.html(),
                    smtp_conn_id=channels.smtp_conn_id,
                ),
            )
        )
    if channels.slack_webhook_conn_id:
        senders.append(
            (
                "slack",
                SlackWebhookNotifier(
                    slack_webhook_conn_id=channels.slack_webhook_conn_id, text=alert.text()
                ),
            )
        )
    if channels.webhook_url:
        senders.append(("webhook", JsonWebhookNotifier(alert.as_json(), url=channels.webhook_url)))
    elif channels.webhook_conn_id and _connection_exists(channels.webhook_conn_id):
        from airflow.providers.http.notifications.http import HttpNotifier

        senders.append(
            (
                "webhook",
                HttpNotifier(
                    http_conn_id=channels.webhook_conn_id,
                    json=alert.as_json(),
                    extra_options={"timeout": WEBHOOK_TIMEOUT_S},
                ),
            )
        )
    for name, sender in senders:
        try:
            # notify(), not __call__: the text is final, and a counter named "{{ x }}" must not
            # be rendered as a Jinja template
            sender.notify(context)
        except Exception as exc:
            log.warning("alert via %s failed: %s", name, exc, exc_info=True)
            outcome[name] = f"error: {exc}"
        else:
            outcome[name] = "sent"
    if not senders:
        log.warning("family %s has no alert channel configured; alert: %s", alert.family, alert)
    else:
        log.info("alert %r delivered: %s", alert.subject, json.dumps(outcome))
    return outcome


class CountersAlertNotifier(BaseNotifier):
    """``on_failure_callback`` of every compaction task (``kind`` failing) and freshness check
    (``kind`` stale): alert the family's channels when its streak starts, remind at
    ``channels.remind_every`` while it lasts, and stay quiet in between.

    >>> CountersAlertNotifier("trades", Channels(email=("ops@example.com",)))  # doctest: +ELLIPSIS
    <...CountersAlertNotifier object at ...>
    """

    template_fields = ()

    def __init__(self, family: str, channels: Channels, kind: StreakKind = FAILING):
        super().__init__()
        self.family = family
        self.channels = channels
        self.kind = kind

    def notify(self, context: Any) -> None:
        notify_failure(self.family, self.channels, self.kind, context)


def notify_failure(
    family: str, channels: Channels, kind: StreakKind, context: Mapping[str, Any]
) -> None:
    """The family failed (``kind`` failing) or was found stale (``kind`` stale), the error in
    ``context["exception"]``: alert its channels when its streak starts, remind at
    ``channels.remind_every`` while it lasts, stay quiet in between. The freshness check calls
    it once per stale family from its one task."""
    alert = alert_from_context(family, context)
    streaks = VariableStreaks()
    key = state_key(family, kind)
    try:
        before = streaks.load(key)
    except Exception:  # the state cannot be read: alert rather than stay silent
        log.warning("alert streak %s unreadable; alerting", key, exc_info=True)
        deliver(alert.for_streak(kind, "started", None), channels, context)
        return
    decision = after_failure(
        before,
        run_id=alert.run_id,
        now=datetime.now(UTC),
        remind_every=channels.remind_every,
        what=f"{alert.task}: {alert.what}",
    )
    _save(streaks, key, before, decision.streak)
    if decision.notice is None:
        streak = decision.streak
        log.info(
            "family %s still %s (since %s, %d failure(s), last alert %s): not alerting "
            "again before %s after the last alert",
            family,
            kind,
            streak.since if streak else "-",
            streak.failures if streak else 0,
            streak.last_sent if streak else "-",
            channels.remind_every or "never",
        )
        return
    deliver(alert.for_streak(kind, decision.notice, decision.streak), channels, context)


def _save(streaks: VariableStreaks, key: str, before: Streak | None, after: Streak | None) -> None:
    if after == before:
        return
    try:
        streaks.save(key, after)
    except Exception:
        log.warning("could not store alert streak %s", key, exc_info=True)


def notify_recovery(
    family: str, channels: Channels, kind: StreakKind, context: Mapping[str, Any]
) -> bool:
    """A run ended without failing (``kind`` failing) or a freshness check found the family
    fresh (``kind`` stale): close an open streak with a recovery notice. Returns whether one was
    sent. Never raises: the run itself succeeded."""
    streaks = VariableStreaks()
    key = state_key(family, kind)
    try:
        before = streaks.load(key)
        decision = after_success(before)
        if decision.notice is None or before is None:
            return False
        _save(streaks, key, before, None)
        ended = datetime.now(UTC).replace(tzinfo=None) - before.since
        base = alert_from_context(family, {**context, "exception": None})
        alert = replace(
            base,
            checks=(),
            counters=(),
            message=(
                f"Family {family} is {'compacting again' if kind == FAILING else 'fresh again'}"
                f" after {ended} ({before.failures} "
                f"{'failed run(s)' if kind == FAILING else 'stale check(s)'} since "
                f"{to_text(before.since)}; the first: {before.first})."
            ),
        ).for_streak(kind, "recovered", before)
        deliver(alert, channels, context)
        return True
    except Exception:
        log.warning("could not send the recovery notice of %s", key, exc_info=True)
        return False
