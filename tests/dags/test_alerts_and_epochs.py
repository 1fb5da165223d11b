"""Alert channels and messages, delivered to a real HTTP server; a run's epoch. No Cassandra."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
from counters.airflow import tasks
from counters.airflow.errors import CheckFailed, RunRefused
from counters.airflow.notifiers import Channels, alert_from_context, deliver
from counters.config import Family

pytestmark = pytest.mark.airflow


def family(**overrides: Any) -> Family:
    fields = {"name": "trades", "keyspace": "ks", "raw_table": "r", "compact_table": "c"}
    return Family.model_validate({"lag": "90s", **fields, **overrides})


# --- epochs --------------------------------------------------------------------------------


def test_epoch_is_the_scheduled_minute_minus_the_lag() -> None:
    scheduled = datetime(2026, 11, 22, 10, 0, 42, tzinfo=UTC)
    assert tasks.run_epoch(family(), scheduled, None) == datetime(2026, 11, 22, 9, 58, 30)


def test_epoch_param_overrides_and_is_utc_when_naive() -> None:
    scheduled = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    assert tasks.run_epoch(family(), scheduled, "2026-11-22T08:00:00.1234") == datetime(
        2026, 11, 22, 8, 0, 0, 123000
    )
    assert tasks.run_epoch(family(), scheduled, "2026-11-22T09:00:00+01:00") == datetime(
        2026, 11, 22, 8, 0
    )
    with pytest.raises(RunRefused, match="not an ISO 8601 time: 'yesterday'"):
        tasks.run_epoch(family(), scheduled, "yesterday")


def test_manual_runs_without_logical_date_use_run_after() -> None:
    run_after = datetime(2026, 11, 22, 10, 5, tzinfo=UTC)
    assert tasks.scheduled_time(SimpleNamespace(logical_date=None, run_after=run_after)) == (
        run_after
    )
    logical = run_after - timedelta(hours=1)
    assert tasks.scheduled_time(SimpleNamespace(logical_date=logical, run_after=run_after)) == (
        logical
    )


# --- channels ------------------------------------------------------------------------------


def test_family_channels_win_and_environment_fills_the_gaps() -> None:
    env = {
        "COUNTERS_ALERT_EMAIL": "a@example.com, b@example.com",
        "COUNTERS_ALERT_SLACK_CONN_ID": "slack_default_ops",
        "COUNTERS_ALERT_WEBHOOK_URL": "http://hooks.example/all",
    }
    assert Channels.for_family(family(), env) == Channels(
        email=("a@example.com", "b@example.com"),
        slack_webhook_conn_id="slack_default_ops",
        webhook_url="http://hooks.example/all",
    )
    own = family(alerts={"email": ["x@example.com"], "webhook_url": "http://hooks.example/x"})
    assert Channels.for_family(own, env) == Channels(
        email=("x@example.com",),
        slack_webhook_conn_id="slack_default_ops",
        webhook_url="http://hooks.example/x",
    )
    assert Channels.for_family(family(), {}) == Channels(webhook_conn_id="counters_webhook")


def context(error: BaseException) -> dict[str, Any]:
    ti = SimpleNamespace(
        task_id="verify",
        map_index=-1,
        dag_id="compact_trades",
        run_id="scheduled__2026-11-22T10:00:00+00:00",
        try_number=1,
        log_url="http://localhost:8080/dags/compact_trades/runs/r/tasks/verify?try_number=1",
    )
    return {"ti": ti, "exception": error}


def test_alert_names_family_run_check_counters_and_log() -> None:
    error = CheckFailed(
        "conservation check failed ...",
        checks=["compact_value_equals_before_plus_folded"],
        counters=["IBM: compact value 999 (expected 55 = 0 + 55)", "{{ not jinja }} <b>"],
    )
    alert = alert_from_context("trades", context(error))
    assert alert.subject == (
        "[counters] trades: compact_value_equals_before_plus_folded "
        "(compact_trades run scheduled__2026-11-22T10:00:00+00:00)"
    )
    text = alert.text()
    assert "Counters affected: IBM: compact value 999 (expected 55 = 0 + 55)" in text
    assert "Log: http://localhost:8080/dags/compact_trades/runs/r/tasks/verify" in text
    assert "&lt;b&gt;" in alert.html() and "<b>" not in alert.html()
    payload = alert.as_json()
    assert payload["checks"] == ["compact_value_equals_before_plus_folded"]
    assert payload["task"] == "verify" and payload["family"] == "trades"
    json.dumps(payload)


def test_alert_of_an_unexpected_error_names_the_task_and_error_type() -> None:
    alert = alert_from_context("trades", context(TimeoutError("read timed out")))
    assert alert.checks == ("task verify failed (TimeoutError)",)
    assert alert.counters == () and alert.message == "read timed out"


# --- delivery ------------------------------------------------------------------------------


@pytest.fixture
def http_inbox() -> Iterator[tuple[int, list[tuple[str, dict[str, Any]]]]]:
    posts: list[tuple[str, dict[str, Any]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            posts.append((self.path, json.loads(body)))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], posts
    server.shutdown()
    server.server_close()


def test_delivery_to_slack_and_the_default_webhook_connection(
    http_inbox: tuple[int, list[tuple[str, dict[str, Any]]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, posts = http_inbox
    monkeypatch.setenv(
        "AIRFLOW_CONN_COUNTERS_WEBHOOK",
        json.dumps({"conn_type": "http", "host": f"http://127.0.0.1:{port}", "schema": ""}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_OPS_SLACK",
        json.dumps({"conn_type": "slackwebhook", "password": f"http://127.0.0.1:{port}/slack"}),
    )
    error = CheckFailed("boom", checks=["freshness"])
    alert = alert_from_context("trades", context(error))
    channels = Channels.for_family(family(alerts={"slack_webhook_conn_id": "ops_slack"}), {})

    outcome = deliver(alert, channels)

    assert outcome == {"slack": "sent", "webhook": "sent"}
    by_path = dict(posts)
    assert by_path["/"]["checks"] == ["freshness"] and by_path["/"]["family"] == "trades"
    assert "Counter family trades: freshness" in by_path["/slack"]["text"]


def test_a_failing_channel_does_not_stop_the_others(
    http_inbox: tuple[int, list[tuple[str, dict[str, Any]]]],
) -> None:
    port, posts = http_inbox
    alert = alert_from_context("trades", context(CheckFailed("boom", checks=["x"])))
    channels = Channels(
        email=("ops@example.com",),
        smtp_conn_id="no_such_smtp_connection",
        webhook_url=f"http://127.0.0.1:{port}/hook",
    )

    outcome = deliver(alert, channels)

    assert outcome["webhook"] == "sent" and outcome["email"].startswith("error: ")
    assert [path for path, _ in posts] == ["/hook"]
