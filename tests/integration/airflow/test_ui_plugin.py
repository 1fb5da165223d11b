"""The Counter families plugin through Airflow's own API server app (``create_app()``, the
plugin loaded from the package's entry point as the API server loads it) and FastAPI's test
client, logged in with the simple auth manager's real password, against the real Cassandra
node."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from counters import engine
from counters.client import CounterClient, Increment
from counters.core import utc_aware
from counters.schema import q
from counters.store import Store

from .ui_seed import compact_as_the_dag_does

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

PREFIX = "/counters"


@pytest.fixture(scope="module")
def dag_keyspace(conn: Any) -> Iterator[str]:
    """This module's families in a keyspace of their own, dropped when the module is done:
    the sixty-odd tables would otherwise slow every later schema refresh of the session."""
    import secrets

    name = f"t_ui_{secrets.token_hex(3)}"
    yield name
    conn.session.execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=300)


@pytest.fixture(scope="module")
def airflow_app() -> Any:
    from airflow.api_fastapi.app import create_app

    return create_app()


@pytest.fixture(scope="module")
def token(airflow_app: Any) -> str:
    """A JWT from ``POST /auth/token`` with the password the simple auth manager generated."""
    from fastapi.testclient import TestClient

    passwords = Path(os.environ["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    password = json.loads(passwords.read_text())["admin"]
    answer = TestClient(airflow_app).post(
        "/auth/token", json={"username": "admin", "password": password}
    )
    assert answer.status_code in (200, 201), answer.text
    return answer.json()["access_token"]


@pytest.fixture
def ui(airflow_app: Any, token: str) -> Any:
    """A client logged in as the UI is: the session cookie Airflow's login sets."""
    from fastapi.testclient import TestClient

    client = TestClient(airflow_app)
    client.cookies.set("_token", token)
    return client


@pytest.fixture
def anonymous(airflow_app: Any) -> Any:
    from fastapi.testclient import TestClient

    return TestClient(airflow_app)


def history(conn: Any, family: Any, t0: datetime, runs: int = 5) -> tuple[Store, CounterClient]:
    """``runs`` compactions a minute apart, two counters each (IBM gets i + 1, AAPL 10)."""
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    for i in range(runs):
        at = t0 + timedelta(minutes=i)
        client.record(
            [
                Increment(("IBM",), i + 1, utc_aware(at), ("w", i)),
                Increment(("AAPL",), 10, utc_aware(at), ("w", 100 + i)),
            ]
        )
        engine.run_family(store, at + timedelta(seconds=30), f"run-{i}")
    return store, client


def test_expect_every_page_and_endpoint_behind_the_airflow_login(
    ui: Any, anonymous: Any, make_families: Any
) -> None:
    make_families({}, shape="mapped")
    page = anonymous.get(f"{PREFIX}/")
    assert page.status_code == 401
    assert "log in to Airflow" in page.text and "Traceback" not in page.text
    for path in ("/api/families", "/family/x", "/api/families/x/audit", "/family/x/datadocs/"):
        answer = anonymous.get(PREFIX + path)
        assert answer.status_code == 401, path
    assert anonymous.get(f"{PREFIX}/api/families").json()["detail"].startswith("Not authenticated")
    anonymous.cookies.set("_token", "forged")
    assert anonymous.get(f"{PREFIX}/api/families").status_code == 403
    # the nav icon and the stylesheet hold no data
    assert anonymous.get(f"{PREFIX}/assets/icon.svg").status_code == 200
    assert ui.get(f"{PREFIX}/").status_code == 200


def test_expect_the_plugin_registered_as_a_nav_view_and_a_fastapi_app(ui: Any, token: str) -> None:
    answer = ui.get("/api/v2/plugins", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    plugin = next(p for p in answer.json()["plugins"] if p["name"] == "counter_families")
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == [PREFIX]
    view = plugin["external_views"][0]
    assert (view["href"], view["destination"], view["url_route"]) == (
        "counters/",
        "nav",
        "counter-families",
    )


def test_expect_the_overview_to_show_each_familys_health_and_last_hour(
    ui: Any, conn: Any, make_families: Any, t0: datetime
) -> None:
    families = make_families({"shards": 2}, {"shards": 1}, shape="mapped")
    busy, empty = (families.family(e["name"]) for e in families.entries)
    store, client = history(conn, busy, t0)
    client.record([Increment(("IBM",), 7, utc_aware(t0 + timedelta(minutes=1)), ("late", 1))])
    engine.run_family(store, t0 + timedelta(minutes=5, seconds=30), "run-5")

    answer = ui.get(f"{PREFIX}/api/families")

    assert answer.status_code == 200, answer.text
    rows = {row["name"]: row for row in answer.json()["families"]}
    assert set(rows) == {busy.name, empty.name}
    row = rows[busy.name]
    assert row["epoch"] == (t0 + timedelta(minutes=5, seconds=30)).isoformat() + ".000Z"
    assert row["lag"]["state"] == "stale"  # a day behind
    assert row["last_run"]["run_id"] == "run-5" and row["last_run"]["outcome"] == "success"
    assert row["last_run"]["late_rows"] == 1
    assert row["last_hour"] == {
        "runs": 6,
        "worked": 6,
        "failed": 0,
        "rows_folded": 11,
        "rows_deleted": 11,
        "late_rows": 1,
        "conflicts": 0,
        "truncated": False,
    }
    assert row["quarantined"] == 0
    assert rows[empty.name]["lag"]["state"] == "never"
    assert rows[empty.name]["last_run"] is None

    page = ui.get(f"{PREFIX}/")
    assert page.status_code == 200
    assert f'data-family="{busy.name}"' in page.text and f'data-family="{empty.name}"' in page.text
    assert "never compacted" in page.text


def test_expect_the_family_page_to_page_through_the_audit_newest_first(
    ui: Any, conn: Any, make_families: Any, t0: datetime
) -> None:
    families = make_families(
        {"shards": 2, "alerts": {"email": ["ops@example.com"]}}, shape="mapped"
    )
    family = families.family(families.entries[0]["name"])
    store, client = history(conn, family, t0)
    client.record([Increment(("IBM",), 7, utc_aware(t0 + timedelta(minutes=1)), ("late", 1))])
    engine.run_family(store, t0 + timedelta(minutes=5, seconds=30), "run-5")

    first = ui.get(f"{PREFIX}/api/families/{family.name}", params={"limit": 4}).json()
    second = ui.get(
        f"{PREFIX}/api/families/{family.name}",
        params={"limit": 4, "before": first["next_before"]},
    ).json()

    assert [r["run_id"] for r in first["audit"]] == ["run-5", "run-4", "run-3", "run-2"]
    assert first["next_before"] == first["audit"][-1]["started_at"]
    assert [r["run_id"] for r in second["audit"]] == ["run-1", "run-0"]
    assert second["next_before"] is None
    assert [(r["run_id"], r["late_rows"], r["late_sum"]) for r in first["late_writes"]] == [
        ("run-5", 1, 7)
    ]
    checks = {c["check"]: c for c in first["checks"]}
    assert checks["family_total_conserved"]["passed"] == 4
    assert all(c["failed"] == 0 for c in first["checks"])
    config = first["config"]
    assert (config["shards"], config["lag"], config["kind"]) == (2, "1 min", "increments")
    assert "ops@example.com" in config["alerts"]

    page = ui.get(f"{PREFIX}/family/{family.name}", params={"limit": 4})
    assert page.status_code == 200
    assert page.text.count('<svg class="chart"') == 3
    assert "run-5" in page.text and "run-1" not in page.text
    assert "Older runs" in page.text
    assert ui.get(f"{PREFIX}/family/{family.name}", params={"limit": 0}).status_code == 400
    bad = ui.get(f"{PREFIX}/family/{family.name}", params={"before": "yesterday"})
    assert bad.status_code == 400 and "before: not an ISO 8601 time" in bad.text


def test_expect_a_counter_look_up_to_read_what_the_client_reads(
    ui: Any, conn: Any, make_families: Any, t0: datetime
) -> None:
    families = make_families({"shards": 2}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store, client = history(conn, family, t0, runs=3)
    client.record(
        [Increment(("IBM",), 100, utc_aware(t0 + timedelta(hours=1)), ("newer", 1))]
    )  # unfolded

    found = ui.get(f"{PREFIX}/api/families/{family.name}/counters/IBM").json()

    assert found["value"] == client.read("IBM") == 1 + 2 + 3 + 100
    assert (found["compact_value"], found["newer_sum"]) == (6, 100)
    assert found["epoch"] == (t0 + timedelta(minutes=2, seconds=30)).isoformat() + ".000Z"
    assert found["ledger"]["run_id"] == "run-2" and found["ledger"]["value"] == 6
    assert [r["run_id"] for r in found["history"]] == ["run-2", "run-1", "run-0"]
    assert found["runs_searched"] == 3 and found["quarantine"] is None
    assert (found["shard"], found["bucket"]) == store.keys.bucket(("IBM",))

    never = ui.get(f"{PREFIX}/api/families/{family.name}/counters/NEVER-WRITTEN").json()
    assert (never["value"], never["ledger"], never["history"]) == (0, None, [])

    redirect = ui.get(
        f"{PREFIX}/lookup", params={"family": family.name, "key": "IBM"}, follow_redirects=False
    )
    assert redirect.status_code == 303
    assert redirect.headers["location"].endswith(f"/family/{family.name}/counter?key=IBM")
    page = ui.get(redirect.headers["location"])
    assert page.status_code == 200 and '<span class="value big" id="value">106</span>' in page.text


def test_expect_a_composite_key_read_and_bad_keys_or_families_explained(
    ui: Any, conn: Any, make_families: Any, dag_keyspace: str
) -> None:
    from cassandra.util import uuid_from_time
    from counters.config import Family
    from counters.demo import create_demo_tables

    raw = f"orders_{os.urandom(3).hex()}"
    entry = {
        "kind": "rows",
        "raw_table": raw,
        "columns": {"key": ["location_id", "calculation_date"], "time": "timestamp"},
    }
    probe = Family.model_validate(
        {
            "name": "probe",
            "keyspace": dag_keyspace,
            "compact_table": "c_probe",
            "lag": "1m",
            **entry,
        }
    )
    create_demo_tables(
        conn.session, [probe], "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    families = make_families(entry, shape="mapped")
    family = families.family(families.entries[0]["name"])
    insert = conn.session.prepare(
        f"INSERT INTO {q(dag_keyspace)}.{q(raw)} (location_id, calculation_date, timestamp, "
        "order_id) VALUES (?, ?, ?, ?)"
    )
    day = date(2026, 11, 22)
    start = datetime(2026, 11, 22, 10, 0)
    for i in range(4):
        moment = (start + timedelta(seconds=i)).timestamp()
        conn.session.execute(insert, (7, day, uuid_from_time(moment), i))
    engine.run_family(Store(conn, family), start + timedelta(minutes=5), "orders-run")

    found = ui.get(f"{PREFIX}/api/families/{family.name}/counters/7/2026-11-22")

    assert found.status_code == 200, found.text
    assert (found.json()["value"], found.json()["compact_value"]) == (4, 4)
    short = ui.get(f"{PREFIX}/api/families/{family.name}/counters/7")
    assert short.status_code == 400
    assert "['location_id', 'calculation_date']" in short.json()["detail"]
    bad_date = ui.get(f"{PREFIX}/api/families/{family.name}/counters/7/22.11.2026")
    assert bad_date.status_code == 400 and "cannot parse '22.11.2026'" in bad_date.json()["detail"]
    unknown = ui.get(f"{PREFIX}/family/nope")
    assert unknown.status_code == 404
    assert f"unknown family &#39;nope&#39;; known families: {family.name}" in unknown.text
    assert "Traceback" not in unknown.text


def test_expect_a_quarantined_counter_shown_where_it_matters(
    ui: Any, conn: Any, make_families: Any, t0: datetime
) -> None:
    families = make_families({"shards": 1}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store, _client = history(conn, family, t0, runs=1)
    conn.session.execute(
        f"INSERT INTO {q(family.keyspace)}.{q(family.raw_table)} (type, modify_time, actor, "
        "version) VALUES ('BROKEN', %s, 'bad-writer', 1)",
        (t0 + timedelta(minutes=1),),
    )
    store.index.mark_touched([("BROKEN",)])
    with pytest.raises(engine.ChecksFailed):
        engine.run_family(store, t0 + timedelta(minutes=2), "run-quarantine")

    row = next(
        r for r in ui.get(f"{PREFIX}/api/families").json()["families"] if r["name"] == family.name
    )
    assert row["quarantined"] == 1 and row["last_run"]["outcome"] == "partial"
    assert "no_counter_quarantined" in row["last_run"]["failed_checks"]
    detail = ui.get(f"{PREFIX}/api/families/{family.name}").json()
    assert [(q_["counter"], q_["run_id"]) for q_ in detail["quarantined"]] == [
        ("BROKEN", "run-quarantine")
    ]
    found = ui.get(f"{PREFIX}/api/families/{family.name}/counters/BROKEN").json()
    assert found["quarantine"]["run_id"] == "run-quarantine"
    assert "NULL" in found["quarantine"]["detail"]


def test_expect_the_audit_export_of_a_time_range_as_csv_and_json(
    ui: Any, conn: Any, make_families: Any, t0: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    import counters.status

    families = make_families({"shards": 1}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    history(conn, family, t0)
    rows = ui.get(f"{PREFIX}/api/families/{family.name}").json()["audit"]  # run-4 .. run-0
    since, until = rows[3]["started_at"], rows[0]["started_at"]  # run-1 <= started < run-4
    url = f"{PREFIX}/api/families/{family.name}/audit"

    as_csv = ui.get(url, params={"since": since[:-1], "until": until[:-1], "format": "csv"})
    as_json = ui.get(url, params={"since": since[:-1], "until": until[:-1]})

    assert as_csv.status_code == 200 and as_csv.headers["content-type"].startswith("text/csv")
    assert re.match(
        rf'attachment; filename="audit_{family.name}_\d{{8}}T\d{{6}}Z\.csv"',
        as_csv.headers["content-disposition"],
    )
    lines = as_csv.text.splitlines()
    assert lines[0].split(",") == list(counters.status.AUDIT_COLUMNS)
    assert [line.split(",")[1] for line in lines[1:]] == ["run-3", "run-2", "run-1"]
    body = as_json.json()
    assert [r["run_id"] for r in body["rows"]] == ["run-3", "run-2", "run-1"]
    assert body["rows"][0]["rows_folded"] == 2 and body["since"] == since

    # a long export is read in pages (MAX_PAGE rows each), still newest first, none twice
    monkeypatch.setattr(counters.status, "MAX_PAGE", 2)
    paged = ui.get(url, params={"limit": 5}).json()["rows"]
    assert [r["run_id"] for r in paged] == ["run-4", "run-3", "run-2", "run-1", "run-0"]
    assert [r["run_id"] for r in ui.get(url, params={"limit": 2}).json()["rows"]] == [
        "run-4",
        "run-3",
    ]
    as_parquet = ui.get(url, params={"format": "parquet"})
    assert as_parquet.headers["content-type"] == "application/vnd.apache.parquet"
    table = pq.read_table(io.BytesIO(as_parquet.content))
    assert table.column("run_id").to_pylist() == [f"run-{i}" for i in (4, 3, 2, 1, 0)]

    for params, message in (
        ({"format": "xml"}, "format must be one of csv, json, jsonl, parquet"),
        ({"limit": 0}, "limit"),
        ({"since": "tuesday"}, "since: not an ISO 8601 time"),
        ({"since": until[:-1], "until": since[:-1]}, "must be before until"),
        ({"limit": "many"}, "limit"),
    ):
        answer = ui.get(url, params=params)
        assert answer.status_code == 400, params
        assert message in answer.json()["detail"], answer.json()


def test_expect_data_docs_served_with_every_asset_local(
    ui: Any, conn: Any, make_families: Any, t0: datetime
) -> None:
    from counters.airflow.ui import datadocs
    from counters.gx import evidence

    families = make_families({"shards": 1}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    none_yet = ui.get(f"{PREFIX}/family/{family.name}/datadocs/latest", follow_redirects=False)
    assert none_yet.status_code == 404 and "has no Data Docs yet" in none_yet.text
    client = CounterClient(conn, family)
    client.record([Increment(("IBM",), 5, utc_aware(t0), ("w", 1))])
    at = t0 + timedelta(minutes=2)
    assert compact_as_the_dag_does(family, "manual__docs", at, at) == "success"

    latest = ui.get(f"{PREFIX}/family/{family.name}/datadocs/latest", follow_redirects=False)
    assert latest.status_code == 307
    assert re.search(
        r"/datadocs/\d{4}-\d\d-\d\d/\d{8}T[\d.]+Z__manual__docs/page\.html$",
        latest.headers["location"],
    )
    day, folder = latest.headers["location"].split("/")[-3:-1]
    stored = evidence.open_file(family.name, day, folder, "result.json")
    assert stored is not None and not (stored.parent / "page.html").exists()  # not rendered yet
    page = ui.get(latest.headers["location"])

    assert page.status_code == 200 and "Expectation Validation Result" in page.text
    cached = stored.parent / "page.html"  # rendered on this first view, kept beside the result
    assert cached.exists() and "manual__docs" in cached.read_text()
    cached.write_text(cached.read_text().replace("manual__docs", "manual__cached"))
    assert "manual__cached" in ui.get(latest.headers["location"]).text  # served, not re-rendered
    assert datadocs.remote_assets(page.text) == []
    local = re.findall(r'(?:src|href)="(/counters/assets/datadocs/[^"]+)"', page.text)
    assert len(local) >= 10
    for asset in local:
        assert ui.get(asset).status_code == 200, asset
    assert f'href="{PREFIX}/family/{family.name}">Counter family {family.name}</a>' in page.text
    index = ui.get(f"{PREFIX}/family/{family.name}/datadocs/index.html")
    assert index.status_code == 200 and "manual__docs" in index.text
    assert (
        ui.get(f"{PREFIX}/family/{family.name}/datadocs/static/images/logo-long.png").status_code
        == 200
    )
    for escape in ("..%2F..%2F..%2F.lock", "2026-01-01/..%2F..%2F/page.html", "x/y/page.html"):
        assert ui.get(f"{PREFIX}/family/{family.name}/datadocs/{escape}").status_code == 404
    result = ui.get(latest.headers["location"].removesuffix("page.html") + "result.json")
    assert result.status_code == 200 and result.json()["success"] is True
    audit = ui.get(f"{PREFIX}/api/families/{family.name}").json()["audit"]
    assert audit[0]["data_docs"] == latest.headers["location"].split("/datadocs/", 1)[1]


WORKER = """
import json, sys
from counters.config import Family
from tests.integration.airflow.ui_seed import compact_as_the_dag_does
from datetime import datetime
family = Family.model_validate(json.loads(sys.argv[1]))
at = datetime.fromisoformat(sys.argv[3])
print(compact_as_the_dag_does(family, sys.argv[2], at, at))
"""


def test_expect_the_ui_to_read_the_results_every_worker_stored(
    ui: Any, conn: Any, make_families: Any, t0: datetime, tmp_path: Path
) -> None:
    """Two task processes (two workers) validate a run each; the UI process reads both from
    the store and renders their pages."""
    import subprocess
    import sys

    families = make_families({"shards": 1}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    client = CounterClient(conn, family)
    done = []
    for worker, minute in (("a", 2), ("b", 4)):
        client.record(
            [
                Increment(
                    ("IBM",), minute, utc_aware(t0 + timedelta(minutes=minute - 1)), ("w", minute)
                )
            ]
        )
        at = t0 + timedelta(minutes=minute)
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                WORKER,
                json.dumps(families.entries[0]),
                f"run-{worker}",
                at.isoformat(),
            ],
            cwd=Path(__file__).resolve().parents[3],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0 and out.stdout.split()[-1] == "success", out.stderr[-3000:]
        done.append(f"run-{worker}")

    rows = ui.get(f"{PREFIX}/api/families/{family.name}").json()["audit"]
    assert [r["run_id"] for r in rows] == ["run-b", "run-a"]
    for row in rows:
        assert row["data_docs"] and row["gx_result"].startswith((tmp_path / "gx-results").as_uri())
        page = ui.get(f"{PREFIX}/family/{family.name}/datadocs/{row['data_docs']}")
        assert page.status_code == 200 and "Expectation Validation Result" in page.text
        assert row["run_id"] in page.text
    index = ui.get(f"{PREFIX}/family/{family.name}/datadocs/index.html")
    assert index.text.index("run-b") < index.text.index("run-a")
    latest = ui.get(f"{PREFIX}/family/{family.name}/datadocs/latest", follow_redirects=False)
    assert latest.headers["location"].endswith(rows[0]["data_docs"])


def test_expect_the_ui_export_to_stream_past_ten_thousand_rows(
    ui: Any, conn: Any, make_families: Any
) -> None:
    from counters import audit

    families = make_families({"shards": 1}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    start = datetime(2026, 8, 30)
    rows = [
        audit.stamped(
            {
                "family": family.name,
                "started_at": start + timedelta(minutes=7 * i),
                "run_id": f"run-{i:05d}",
                "outcome": "success",
            },
            family,
            audit.Provenance("scheduled"),
            None,
        )
        for i in range(10_020)
    ]
    for month in {r["month"] for r in rows}:
        store.audit._add_month(month)
    store.statements.run([store.audit._insert(row) for row in rows])
    url = f"{PREFIX}/api/families/{family.name}/audit"

    with ui.stream("GET", url, params={"format": "csv"}) as answer:
        assert answer.status_code == 200
        lines = b"".join(answer.iter_bytes()).decode().splitlines()

    assert len(lines) == 1 + 10_020
    assert [line.split(",")[1] for line in lines[1:4]] == ["run-10019", "run-10018", "run-10017"]
    assert lines[-1].split(",")[1] == "run-00000"


def test_expect_cassandra_down_explained_not_a_stack_trace(
    ui: Any, make_families: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    families = make_families({}, shape="mapped")
    name = families.entries[0]["name"]
    closed = {"conn_type": "cassandra", "host": "127.0.0.1", "port": 9}
    monkeypatch.setenv("AIRFLOW_CONN_CASSANDRA_DEFAULT", json.dumps(closed))

    page = ui.get(f"{PREFIX}/")
    api = ui.get(f"{PREFIX}/api/families")
    family = ui.get(f"{PREFIX}/family/{name}")

    assert page.status_code == 503
    assert "Cannot read Cassandra" in page.text and "127.0.0.1:9" in page.text
    assert f'data-family="{name}"' in page.text  # the families are still listed
    assert api.status_code == 503 and "Cassandra is unreachable" in api.json()["detail"]
    assert family.status_code == 503 and "Cassandra is unreachable" in family.text
    for answer in (page, api, family):
        assert "Traceback" not in answer.text


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """Every statement the plugin's Cassandra session sends while the test runs."""
    from counters.airflow import runtime

    conn = runtime.connection(settings=runtime.server_connection_settings())
    sent: list[str] = []

    def record(future: Any) -> None:
        query = future.query
        text = getattr(query, "query_string", None) or getattr(
            getattr(query, "prepared_statement", None), "query_string", repr(query)
        )
        sent.append(" ".join(str(text).split()))

    conn.session.add_request_init_listener(record)
    yield sent
    conn.session.remove_request_init_listener(record)


def test_expect_the_pages_to_only_read(
    ui: Any, conn: Any, make_families: Any, t0: datetime, statements: list[str]
) -> None:
    families = make_families({"shards": 2}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    history(conn, family, t0, runs=2)
    statements.clear()
    for path in (
        "/",
        "/api/families",
        f"/family/{family.name}",
        f"/api/families/{family.name}",
        f"/family/{family.name}/counter?key=IBM",
        f"/api/families/{family.name}/counters/AAPL",
        f"/api/families/{family.name}/audit?format=csv",
    ):
        assert ui.get(PREFIX + path).status_code == 200, path
    assert statements, "no statement seen"
    writes = [s for s in statements if not s.upper().startswith("SELECT")]
    assert writes == []
    # bounded: each read names its partition or has a LIMIT; none scans token ranges
    unbounded = [s for s in statements if " WHERE " not in s and " LIMIT " not in s]
    assert unbounded == []
    assert [s for s in statements if "token(" in s.lower()] == []
