"""The Counter families pages as a person sees them: Debian's chromium, driven by playwright,
logs in to a real ``airflow standalone`` (own home, free ports) that serves the demo families
(in a keyspace of their own) after a few minutes of history, opens the page from Airflow's nav,
checks the families, a family page, a counter's value and the Data Docs, and saves screenshots
in ``var/screenshots/``.

``make test`` installs chromium with apt-get on Debian as root (or with passwordless sudo);
elsewhere this test is skipped and says why, except under CI (``CI`` set: ``.ci/run`` sets
``CI=true``), where a missing browser fails it: a skip there would hide that the UI went
untested.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from .conftest import DAGS, PROJECT, answers, fernet_key, free_port
from .ui_seed import Seeded, seed

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.browser]

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = PROJECT / "var" / "screenshots"
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
START_TIMEOUT_S = 240


def browser_missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    if not CHROMIUM.exists():
        return (
            f"Debian's chromium is not installed ({CHROMIUM}); `make test` installs it with "
            "apt-get on Debian when run as root or with passwordless sudo"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (`make setup` installs requirements-dev.txt)"
    return None


@dataclass
class Standalone:
    """``airflow standalone`` in its own process group; stopped by its process group id."""

    home: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}"

    def log_tail(self, lines: int = 60) -> str:
        text = (self.home / "standalone.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_until_serving(self) -> float:
        started = time.monotonic()
        passwords = self.home / "simple_auth_manager_passwords.json.generated"
        while not (
            passwords.exists()
            and answers(f"{self.url}/api/v2/monitor/health", timeout=3)
            and answers(f"{self.url}/counters/assets/icon.svg", timeout=3)
        ):
            assert self.proc.poll() is None, f"standalone exited:\n{self.log_tail()}"
            assert time.monotonic() - started < START_TIMEOUT_S, (
                f"standalone not serving after {START_TIMEOUT_S} s:\n{self.log_tail()}"
            )
            time.sleep(1)
        return time.monotonic() - started

    def password(self) -> str:
        passwords = self.home / "simple_auth_manager_passwords.json.generated"
        return json.loads(passwords.read_text())["admin"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def under_ci() -> bool:
    """Whether this is a CI run: ``CI`` set and not false (CI systems set ``CI=true``;
    ``scripts/setup.sh`` reads it too)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture
def chromium() -> None:
    """Skips the test, saying why, where the browser cannot run (before Airflow is started);
    fails it instead under CI, whose ``make test`` installs chromium and playwright."""
    problem = browser_missing()
    if problem and under_ci():
        pytest.fail(
            f"the browser test must run under CI (CI={os.environ['CI']}): {problem}",
            pytrace=False,
        )
    if problem:
        pytest.skip(problem)


@pytest.fixture
def demo_families(
    conn: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[Any]]:
    """The demo families (include/examples/counter_families.yaml) in a fresh keyspace, with
    tables."""
    from counters.config import load_catalog
    from counters.demo import create_demo_tables
    from counters.schema import ensure_schema

    keyspace = f"t_ui_{secrets.token_hex(3)}"
    doc = yaml.safe_load((PROJECT / "include" / "examples" / "counter_families.yaml").read_text())
    for entry in doc["families"]:
        entry["keyspace"] = keyspace
    path = tmp_path / "families.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.setenv("COUNTERS_CONFIG", str(path))
    monkeypatch.setenv("COUNTERS_GX_RESULTS", str(tmp_path / "gx-results"))
    families = list(load_catalog(path).families)
    replication = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    create_demo_tables(conn.session, families, replication)
    for family in families:
        ensure_schema(conn.session, family, replication)
    yield families
    conn.session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)


@pytest.fixture
def standalone(
    demo_families: list[Any], tmp_path: Path, migrated_airflow_db: Path
) -> Iterator[Standalone]:
    """A private ``airflow standalone``: a fresh home and a fresh metadata DB (a copy of one just
    migrated, which standalone's own migrate finds current; a copy of the session's DB would
    bring other tests' DAG runs along), free ports, the DAGs paused (the history is written by
    the test, through the DAG's task bodies)."""
    home = tmp_path / "airflow"
    home.mkdir()
    shutil.copy(migrated_airflow_db, home / "airflow.db")
    port = free_port()
    env = {
        **os.environ,  # the families YAML, the Data Docs folder, AIRFLOW_CONN_CASSANDRA_DEFAULT
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(48),
        "AIRFLOW__CORE__FERNET_KEY": fernet_key(),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "PYTHONWARNINGS": "ignore",
    }
    with open(home / "standalone.log", "wb") as log:
        proc = subprocess.Popen(
            [AIRFLOW, "standalone"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = Standalone(home, port, proc)
    try:
        yield server
    finally:
        server.stop()


def test_expect_a_person_to_see_the_families_a_family_a_counter_and_data_docs(
    chromium: None, conn: Any, demo_families: list[Any], standalone: Standalone
) -> None:
    """Over 30 s, and why: what a person sees needs the UI served by a real Airflow
    (``standalone``: api-server, scheduler, dag-processor, triggerer) and a real browser; the
    history is written while it starts."""
    from playwright.sync_api import expect, sync_playwright

    started = time.monotonic()
    seeded: Seeded = seed(conn, demo_families, datetime.now(UTC))  # while Airflow starts
    seeding_s = time.monotonic() - started
    waited_s = standalone.wait_until_serving()
    print(f"history written in {seeding_s:.1f} s; standalone serving {waited_s:.1f} s after that")
    assert seeded.outcomes["likes"][-1] == "success" and seeded.outcomes["trades"][-1] == "partial"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    trades = next(f for f in demo_families if f.name == "trades")
    key, value = next(iter(seeded.expected["trades"].items()))
    from counters.store import Store

    epoch = Store(conn, trades).state.family_epoch()
    assert epoch is not None

    remote: list[str] = []
    broken: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.on(
            "request",
            lambda r: (
                remote.append(r.url)
                if urlparse(r.url).hostname not in ("localhost", "127.0.0.1", None)
                and not r.url.startswith("data:")
                else None
            ),
        )
        page.on(
            "response",
            lambda r: (
                broken.append(f"{r.status} {r.url}")
                if "/counters/" in r.url and r.status >= 400
                else None
            ),
        )
        page.goto(f"{standalone.url}/auth/login", wait_until="networkidle")
        page.fill("input[name=username]", "admin")
        page.fill("input[name=password]", standalone.password())
        page.keyboard.press("Enter")
        page.wait_for_url(lambda url: "/auth/login" not in url, timeout=30_000)

        # from Airflow's own navigation: Browse > Counter families
        page.goto(f"{standalone.url}/plugin/counter-families", wait_until="networkidle")
        frame = page.frame_locator("iframe[title='Counter families']")
        rows = frame.locator("#families tbody tr[data-family]")
        expect(rows).to_have_count(4, timeout=30_000)
        names = rows.evaluate_all("rows => rows.map(r => r.dataset.family)")
        assert names == ["trades", "likes", "orders", "acceptances"]
        trades_row = frame.locator("tr[data-family=trades]")
        expect(trades_row).to_contain_text(epoch.strftime("%Y-%m-%d %H:%M:%S"))
        expect(trades_row).to_contain_text("partial")
        expect(trades_row.locator(".badge.lag-fresh, .badge.lag-late")).to_have_count(1)
        assert trades_row.locator("a", has_text="DAG").get_attribute("href") == (
            "/dags/compact_trades"
        )
        page.screenshot(path=str(SCREENSHOTS / "overview.png"))

        # the family page, by its link
        trades_row.locator("a.family").click()
        heading = frame.locator("h1")
        expect(heading).to_contain_text("trades")
        expect(frame.locator("svg.chart")).to_have_count(3)
        expect(frame.locator("#audit-rows tbody tr")).to_have_count(5)
        expect(frame.locator("#quarantine")).to_contain_text("BROKEN")

        # the counter look-up, typed in
        frame.locator("form.lookup input[name=key]").fill(key[0])
        frame.locator("form.lookup button").click()
        expect(frame.locator("#value")).to_have_text(f"{value:,}", timeout=30_000)
        page.screenshot(path=str(SCREENSHOTS / "counter-in-airflow.png"))

        # each page on its own, whole, for the README
        for name, path in (
            ("family", "/counters/family/trades"),
            ("counter", f"/counters/family/trades/counter?key={key[0]}"),
        ):
            page.goto(standalone.url + path, wait_until="networkidle")
            page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)

        # Data Docs: styled and scripted from the local copies
        page.goto(
            f"{standalone.url}/counters/family/likes/datadocs/latest", wait_until="networkidle"
        )
        expect(page.locator("body")).to_contain_text("Expectation Validation Result")
        loaded = page.evaluate(
            """() => ({
                jquery: typeof window.jQuery === 'function',
                vega: typeof window.vegaEmbed === 'function',
                bootstrap: getComputedStyle(document.querySelector('.btn')).borderTopLeftRadius,
                icons: getComputedStyle(document.querySelector('[class*="fa-"]')).fontFamily,
                fonts: [...document.fonts].filter(f => f.status === 'loaded')
                    .map(f => f.family.replaceAll('"', '')),
            })"""
        )
        assert (loaded["jquery"], loaded["vega"], loaded["bootstrap"]) == (True, True, "4px")
        assert "Font Awesome 6 Free" in loaded["icons"], loaded
        assert "Font Awesome 6 Free" in loaded["fonts"], loaded
        page.screenshot(path=str(SCREENSHOTS / "datadocs.png"))
        browser.close()

    assert remote == [], f"the pages loaded from outside: {remote}"
    assert broken == [], broken
