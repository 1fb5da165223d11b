"""Alerts: one message per failed task, to each channel the family configures.

Channels (``alerts:`` in the families YAML; environment defaults for a family that leaves one
empty):

* email through the SMTP provider's ``SmtpNotifier`` (connection ``alerts.smtp_conn_id``,
  default ``counters_smtp``; recipients ``alerts.email`` or ``$COUNTERS_ALERT_EMAIL``,
  comma separated);
* Slack through the Slack provider's ``SlackWebhookNotifier`` (connection
  ``alerts.slack_webhook_conn_id`` or ``$COUNTERS_ALERT_SLACK_CONN_ID``);
* a plain JSON ``POST`` to ``alerts.webhook_url`` or ``$COUNTERS_ALERT_WEBHOOK_URL``, else to the
  HTTP connection ``$COUNTERS_ALERT_WEBHOOK_CONN_ID`` (default ``counters_webhook``) if it exists.

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
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow.sdk import BaseNotifier

from ..config import Family

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

    @classmethod
    def for_family(cls, family: Family, env: Mapping[str, str] | None = None) -> Channels:
        env = os.environ if env is None else env
        alerts = family.alerts
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
        return "; ".join(parts) or "none configured"


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
    kind: str = "task_failed"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def subject(self) -> str:
        what = ", ".join(self.checks) or "task failed"
        return f"[counters] {self.family}: {what} ({self.dag_id} run {self.run_id})"

    def text(self) -> str:
        lines = [
            f"Counter family {self.family}: {', '.join(self.checks) or 'task failed'}",
            f"DAG {self.dag_id}, run {self.run_id}, task {self.task}"
            + (f" (try {self.try_number})" if self.try_number else ""),
            f"Failed check(s): {', '.join(self.checks) or '-'}",
            "Counters affected: " + ("; ".join(self.counters[:20]) or "-"),
            f"Log: {self.log_url or '-'}",
            "",
            self.message,
        ]
        return "\n".join(lines)

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
        dag_id=getattr(ti, "dag_id", None) or getattr(dag_run, "dag_id", "?"),
        run_id=getattr(ti, "run_id", None) or getattr(dag_run, "run_id", "?"),
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
    """POST a JSON document to a URL, or to an HTTP connection's base URL.

    :param payload: the JSON body.
    :param url: the URL (takes precedence).
    :param http_conn_id: an HTTP connection (``host`` with scheme, optional ``schema`` path).
    """

    template_fields = ()

    def __init__(
        self,
        payload: Mapping[str, Any],
        *,
        url: str | None = None,
        http_conn_id: str | None = None,
    ):
        super().__init__()
        if not url and not http_conn_id:
            raise ValueError("JsonWebhookNotifier needs url or http_conn_id")
        self.payload = dict(payload)
        self.url = url
        self.http_conn_id = http_conn_id

    def notify(self, context: Any) -> None:
        if self.url:
            send_json(self.url, self.payload)
            return
        from airflow.providers.http.hooks.http import HttpHook

        HttpHook(method="POST", http_conn_id=self.http_conn_id).run(
            endpoint=None, json=self.payload, extra_options={"timeout": WEBHOOK_TIMEOUT_S}
        )


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
        senders.append(
            (
                "webhook",
                JsonWebhookNotifier(alert.as_json(), http_conn_id=channels.webhook_conn_id),
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
    """``on_failure_callback`` of every compaction task: alert the family's channels.

    >>> CountersAlertNotifier("trades", Channels(email=("ops@example.com",)))  # doctest: +ELLIPSIS
    <...CountersAlertNotifier object at ...>
    """

    template_fields = ()

    def __init__(self, family: str, channels: Channels):
        super().__init__()
        self.family = family
        self.channels = channels

    def notify(self, context: Any) -> None:
        deliver(alert_from_context(self.family, context), self.channels, context)
