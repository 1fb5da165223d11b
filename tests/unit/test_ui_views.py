"""The UI plugin's pure parts: charts, formatting, page data, and the Data Docs rewrite."""

from __future__ import annotations

import importlib.util
import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from counters.airflow.ui import charts, datadocs, views
from counters.status import AuditRow

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 22, 12, 0, 0)
GX = importlib.util.find_spec("great_expectations")
GX_TEMPLATES = Path(GX.origin).parent / "render" / "view" / "templates"  # type: ignore[union-attr, arg-type]


def row(minute: int, **fields: object) -> AuditRow:
    values: dict[str, object] = {
        "started_at": NOW + timedelta(minutes=minute),
        "run_id": f"run-{minute}",
        "outcome": "success",
        "epoch_after": NOW + timedelta(minutes=minute - 1),
        "counters": 2,
        "rows_folded": minute * 10,
        "checks": json.dumps({"a": "pass"}),
        "durations": json.dumps({"compact": 1.5}),
    }
    values.update(fields)
    return AuditRow.from_record(values)


# --- charts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "step"), [(0, 1.0), (7, 2.0), (10, 5.0), (95, 50.0), (1234, 500.0), (0.3, 0.1)]
)
def test_expect_round_axis_steps(span: float, step: float) -> None:
    assert charts.nice_step(span) == pytest.approx(step)


@pytest.mark.parametrize(
    ("value", "text"), [(0, "0"), (12, "12"), (1.5, "1.5"), (0.333, "0.33"), (1500, "1.5k")]
)
def test_expect_compact_axis_labels(value: float, text: str) -> None:
    assert charts.format_number(value) == text


def test_expect_one_bar_per_run_with_its_tooltip_and_the_title_escaped() -> None:
    points = [charts.Point(NOW + timedelta(minutes=i), i * 10, f"run <{i}>") for i in range(5)]
    svg = charts.time_chart(points, title="Rows & more", unit="rows", bars=True)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count('class="chart-bar"') == 5
    assert "<title>run &lt;3&gt;</title>" in svg
    assert 'aria-label="Rows &amp; more"' in svg
    heights = [float(h) for h in re.findall(r'class="chart-bar"[^>]*height="([\d.]+)"', svg)]
    assert heights == sorted(heights) and heights[0] == 0.0  # taller bar, larger value


def test_expect_a_line_with_a_dot_per_point_and_the_limit_drawn() -> None:
    points = [charts.Point(NOW + timedelta(minutes=i), 60.0 + i) for i in range(3)]
    svg = charts.time_chart(points, title="Lag", limit=660, limit_label="limit")
    assert svg.count('class="chart-dot"') == 3
    assert 'class="chart-limit"' in svg and "<title>limit</title>" in svg
    assert svg.count("<polyline") == 1


def test_expect_an_empty_chart_to_say_there_is_nothing_to_plot() -> None:
    assert "no runs to plot" in charts.time_chart([], title="x")


def test_expect_a_single_point_to_be_plotted_inside_the_frame() -> None:
    svg = charts.time_chart([charts.Point(NOW, 5)], title="one")
    x = float(re.search(r'cx="([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    assert charts.LEFT < x < charts.WIDTH - charts.RIGHT


# --- formatting and page data -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (0.412, "0.41 s"),
        (12.34, "12.3 s"),
        (65, "1 min 05 s"),
        (600, "10 min"),
        (3720, "1 h 02 min"),
        (7200, "2 h"),
        (timedelta(days=3, hours=1), "3 d 01 h"),
        (-90, "-1 min 30 s"),
    ],
)
def test_expect_spans_readable_at_every_scale(value: object, text: str) -> None:
    assert views.span(value) == text  # type: ignore[arg-type]


def test_expect_ago_to_say_never_and_just_now() -> None:
    assert views.ago(None, NOW) == "never"
    assert views.ago(NOW, NOW) == "just now"
    assert views.ago(NOW - timedelta(seconds=90), NOW) == "1 min 30 s ago"


def test_expect_the_check_summary_to_count_and_show_the_newest_failure() -> None:
    rows = [
        row(3, checks=json.dumps({"a": "FAIL: newest"})),
        row(2, checks=json.dumps({"a": "FAIL: older", "b": "pass"})),
        row(1),
    ]
    summary = {s["check"]: s for s in views.check_summary(rows)}
    assert (summary["a"]["passed"], summary["a"]["failed"]) == (1, 2)
    assert summary["a"]["last_failure"]["detail"] == "newest"
    assert summary["a"]["last_failure"]["run_id"] == "run-3"
    assert summary["b"] == {"check": "b", "passed": 1, "failed": 0, "last_failure": None}


def test_expect_late_reports_only_for_runs_that_found_late_rows() -> None:
    rows = [row(2, late_rows=3, late_sum=12, max_lateness_ms=95_000), row(1)]
    assert views.late_reports(rows) == [
        {
            "started_at": "2026-11-22T12:02:00.000Z",
            "run_id": "run-2",
            "late_rows": 3,
            "late_sum": 12,
            "max_lateness": "1 min 35 s",
            "max_lateness_ms": 95_000,
        }
    ]


def test_expect_three_charts_and_dry_runs_left_out() -> None:
    from counters.config import Family

    family = Family.model_validate(
        {"name": "f", "keyspace": "k", "raw_table": "r", "compact_table": "c", "lag": "1m"}
    )
    plots = views.charts([row(2), row(1, dry_run=True), row(0)], family)
    assert set(plots) == {"rows_folded", "duration", "lag"}
    assert plots["rows_folded"].count('class="chart-bar"') == 2
    assert "freshness limit + lag: 11 min" in plots["lag"]


# --- Data Docs ----------------------------------------------------------------------------


def gx_template_assets() -> set[str]:
    """Every remote script, stylesheet and image address in GX's own page templates."""
    found: set[str] = set()
    for template in GX_TEMPLATES.glob("*.j2"):
        found.update(datadocs.remote_assets(template.read_text()))
    return found


def test_expect_every_cdn_asset_of_the_installed_gx_to_have_a_local_copy() -> None:
    """Fails when a GX upgrade loads a new CDN file: add it to ``datadocs.CDN``."""
    remote = gx_template_assets()
    assert remote, f"no CDN address found in {GX_TEMPLATES}"
    assert remote - set(datadocs.CDN) == set()


def test_expect_a_rewritten_page_to_load_nothing_from_another_host() -> None:
    page = "\n".join(t.read_text() for t in GX_TEMPLATES.glob("*.j2"))
    page += (
        '<body class="x"><img src="https://great-expectations-web-assets.s3.us-east-2.'
        'amazonaws.com/logo-long.png?d=20261123&dataContextId=1"></body>'
    )
    html = datadocs.rewrite(page, "/counters/assets/datadocs", "/counters/family/f/datadocs")
    assert datadocs.remote_assets(html) == []
    assert '"/counters/assets/datadocs/bootstrap@4.3.1/dist/css/bootstrap.min.css"' in html
    assert '"/counters/family/f/datadocs/static/images/logo-long.png"' in html


def test_expect_the_back_link_right_after_the_body_tag() -> None:
    html = datadocs.rewrite(
        "<html><body class='a'><p>x</p></body></html>", "/a", "/s", back=("/f?a=1&b", "F <1>")
    )
    assert "<body class='a'><div class=\"counters-back\"" in html
    assert 'href="/f?a=1&amp;b">F &lt;1&gt;</a>' in html


def test_expect_a_stored_pages_links_into_its_gx_site_to_point_at_the_plugin() -> None:
    page = (
        '<link rel="icon" href="../../../static/images/favicon.ico">'
        '<a href="../../../../index.html">Home</a>'
        "<a href='../../../../expectations/counters_fam.html'>suite</a>"
    )
    html = datadocs.rewrite(page, "/a", "/c/family/fam/datadocs")
    assert 'href="/c/family/fam/datadocs/static/images/favicon.ico"' in html
    assert 'href="/c/family/fam/datadocs/index.html">Home' in html
    assert "href='/c/family/fam/datadocs/index.html'>suite" in html
    assert "../" not in html


def test_expect_gx_static_files_served_from_the_package_and_nothing_outside() -> None:
    assert datadocs.resolve_gx_static("images/logo-long.png") is not None
    assert datadocs.resolve_gx_static("../__init__.py") is None
    assert datadocs.resolve_gx_static("images/none.png") is None


def test_expect_make_setup_to_have_fetched_every_asset_with_its_pinned_integrity() -> None:
    """``make setup`` (which ``make test`` runs first) fetches them with npm."""
    missing = datadocs.missing_assets()
    assert missing == [], (
        f"Data Docs assets missing in {datadocs.assets_root()}: {missing[:3]}... "
        "(`make setup` fetches them with npm)"
    )
    for package in datadocs.PACKAGES:
        marker = datadocs.assets_root() / package.folder / ".complete"
        assert marker.read_text().strip() == package.integrity
