"""The plugin's FastAPI app: the "Counter families" pages and their JSON API.

Mounted by the Airflow API server (:mod:`counters.airflow.plugin`, the package's
``airflow.plugins`` entry point), shown in the UI as an external view, and behind Airflow's own
login: every page and endpoint resolves the user from the UI's session cookie (or an
``Authorization: Bearer`` token) with Airflow's ``get_user``, and shows a family only to users
who may read its DAG. Everything is read through ``counters.status`` with bounded reads;
nothing here writes to Cassandra.

Importing this module is cheap (FastAPI and Jinja only): Airflow loads the plugin in
schedulers and task processes too, where the Cassandra driver and Airflow's API modules are
imported only when a request needs them.

    /                                 overview, one row per family
    /family/{name}                    health, plots, checks, late writes, audit rows, config
    /family/{name}/counter?key=K      a counter's value, checkpoint and history
    /family/{name}/datadocs/...       the family's GX Data Docs, with local CSS/JS
    /api/families[/{name}]            the same as JSON
    /api/families/{name}/counters/K   a counter as JSON
    /api/families/{name}/audit        audit rows of a time range, CSV or JSON
"""

from __future__ import annotations

import logging
import mimetypes
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...config import ConfigError, Family, load_families_leniently
from ...core import parse_epoch, to_text
from ...gx import evidence
from . import datadocs, views

if TYPE_CHECKING:
    from jinja2 import Environment

    from ...connection import Connection
    from ...store import Store

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
DEFAULT_PAGE = 60
"""Audit rows on the family page (and in its plots) unless ``limit`` says otherwise."""


class Problem(Exception):
    """A request that cannot be answered: the status and a message for a person (never a
    stack trace)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# --- errors -------------------------------------------------------------------------------


@contextmanager
def reading(what: str) -> Iterator[None]:
    """Turn what a read can raise into a ``Problem`` that says what failed and what to do."""
    from cassandra import DriverException, InvalidRequest
    from cassandra.cluster import NoHostAvailable

    from ...connection import CassandraUnavailable
    from ...schema import SchemaError

    try:
        yield
    except Problem:
        raise
    except (CassandraUnavailable, NoHostAvailable) as exc:
        raise Problem(503, f"Cassandra is unreachable while reading {what}: {exc}") from None
    except InvalidRequest as exc:
        raise Problem(
            500,
            f"Cassandra refused the read of {what}: {exc.args[0] if exc.args else exc}. Are the "
            "family's tables created (`counterctl init`)?",
        ) from None
    except DriverException as exc:
        raise Problem(
            503, f"Cassandra did not answer the read of {what}: {type(exc).__name__}: {exc}"
        ) from None
    except SchemaError as exc:
        raise Problem(500, f"{what}: {exc}") from None
    except ConfigError as exc:
        raise Problem(500, str(exc)) from None


# --- access -------------------------------------------------------------------------------


async def current_user(request: Request) -> Any:
    """The logged-in Airflow user, exactly as the API server's own endpoints resolve it."""
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    return await get_user(request, None, await bearer_scheme(request))


User = Annotated[Any, Depends(current_user)]


def readable(user: Any, families: list[Family]) -> list[Family]:
    """The families whose DAG the user may read."""
    from airflow.api_fastapi.app import get_auth_manager

    allowed = get_auth_manager().filter_authorized_dag_ids(
        dag_ids={f.dag_id for f in families}, user=user
    )
    return [f for f in families if f.dag_id in allowed]


# --- data ---------------------------------------------------------------------------------


def catalog() -> tuple[list[Family], dict[str, str]]:
    """The families YAML, entry by entry (a broken entry is listed, not fatal)."""
    try:
        return load_families_leniently()
    except ConfigError as exc:
        raise Problem(500, str(exc)) from None


def family_for(user: Any, name: str) -> Family:
    families, broken = catalog()
    found = next((f for f in families if f.name == name), None)
    if found is None or not readable(user, [found]):
        if name in broken:
            raise Problem(500, broken[name])
        known = ", ".join(f.name for f in readable(user, families)) or "(none)"
        raise Problem(404, f"unknown family {name!r}; known families: {known}")
    return found


def connection() -> Connection:
    """The API server's Cassandra connection, from the Airflow connection ``cassandra_default``
    (shared with nothing else in this process; rebuilt when that connection changes)."""
    from airflow.exceptions import AirflowNotFoundException

    from .. import runtime

    try:
        settings = runtime.server_connection_settings()
    except AirflowNotFoundException:
        raise Problem(
            503,
            f"the Airflow connection {runtime.CASSANDRA_CONN_ID!r} is not defined (Admin > "
            "Connections, or `make airflow-db`)",
        ) from None
    with reading("the connection"):
        return runtime.connection(settings=settings)


def store_for(family: Family) -> Store:
    from ...store import Store

    return Store(connection(), family)


def alert_channels(family: Family) -> str:
    from ..notifiers import Channels

    return Channels.for_family(family).describe()


def moment(text: str | None, name: str) -> datetime | None:
    if not text:
        return None
    try:
        return parse_epoch(text)
    except ValueError as exc:
        raise Problem(400, f"{name}: {exc}") from None


# --- rendering ----------------------------------------------------------------------------


@cache
def templates() -> Environment:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["span"] = views.span
    env.filters["num"] = lambda n: "-" if n is None else f"{n:,}"
    env.filters["urlq"] = lambda s: quote(str(s), safe="")
    return env


@dataclass(frozen=True)
class Page:
    """Where a page is: the app's base URL (mount prefix included) and Airflow's."""

    base: str
    airflow: str
    now: datetime

    @classmethod
    def of(cls, request: Request) -> Page:
        base = request.scope.get("root_path", "").rstrip("/")
        mount = request.app.state.mount_prefix
        airflow = base.removesuffix(mount) if mount and base.endswith(mount) else ""
        return cls(base, airflow, datetime.now(UTC).replace(tzinfo=None))


def render(request: Request, template: str, code: int = 200, **context: Any) -> HTMLResponse:
    page = Page.of(request)
    html = (
        templates()
        .get_template(template)
        .render(
            base=page.base,
            airflow=page.airflow,
            now=page.now,
            **context,
        )
    )
    return HTMLResponse(html, status_code=code)


def wants_json(request: Request) -> bool:
    return request.url.path.removeprefix(request.scope.get("root_path", "")).startswith("/api/")


# --- the app ------------------------------------------------------------------------------


class GuardedRoute(APIRoute):
    """A route whose unexpected errors become a ``Problem`` (logged with their traceback,
    shown as one line), so no page ever shows a stack trace."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (Problem, StarletteHTTPException, RequestValidationError):
                raise
            except Exception as exc:
                log.exception("counter families: %s failed", request.url.path)
                raise Problem(500, f"unexpected error: {type(exc).__name__}: {exc}") from None

        return guarded


def create_app(mount_prefix: str = "") -> FastAPI:
    """The app; ``mount_prefix`` is where the plugin mounts it (its pages link back to
    Airflow's own pages from there)."""
    app = FastAPI(title="Counter families", docs_url=None, redoc_url=None, openapi_url=None)
    app.router.route_class = GuardedRoute
    app.state.mount_prefix = mount_prefix.rstrip("/")

    @app.exception_handler(Problem)
    async def problem(request: Request, exc: Problem) -> Response:
        if wants_json(request):
            return JSONResponse({"detail": exc.message}, status_code=exc.status)
        return render(request, "error.html", exc.status, status=exc.status, message=exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = str(exc.detail)
        if exc.status_code == 401:  # from Airflow's get_user
            message = f"{message}: log in to Airflow first"
        return await problem(request, Problem(exc.status_code, message))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        message = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'][1:]) or 'request'}: {error['msg']}"
            for error in exc.errors()
        )
        return await problem(request, Problem(400, message))

    register_pages(app)
    register_api(app)
    register_files(app)
    return app


def overview_data(user: Any) -> dict[str, Any]:
    from ...status import family_health

    families, broken = catalog()
    families = readable(user, families)
    now = datetime.now(UTC)
    rows: list[dict[str, Any]] = []
    problem: str | None = None
    try:
        conn = connection()
    except Problem as exc:
        conn, problem = None, exc.message
    for family in families:
        row: dict[str, Any] = {"name": family.name, "kind": family.kind.value}
        if conn is None:
            row["error"] = "not read: Cassandra is unreachable"
        else:
            from ...store import Store

            try:
                with reading(f"family {family.name!r}"):
                    row = views.health_dict(family_health(Store(conn, family), now), now)
            except Problem as exc:
                row["error"] = exc.message
        row["data_docs"] = latest_docs(family.name)
        rows.append(row)
    return {
        "families": rows,
        "broken": broken,
        "error": problem,
        "generated_at": to_text(now),
    }


def family_data(
    user: Any, name: str, limit: int, before: str | None, plots: bool = True
) -> dict[str, Any]:
    from ...status import audit_page, family_health

    family = family_for(user, name)
    if not 1 <= limit <= 1000:
        raise Problem(400, f"limit must be between 1 and 1000, got {limit}")
    until = moment(before, "before")
    store = store_for(family)
    now = datetime.now(UTC)
    with reading(f"family {family.name!r}"):
        health = family_health(store, now)
        rows = audit_page(store, limit, before=until)
    audit = []
    for row in rows:
        stored = evidence.stored_of(family.name, row.gx_result)
        audit.append(
            {
                **row.as_dict(),
                "duration": views.span(row.duration_s),
                "failed_checks": row.failed_checks,
                "data_docs": f"{stored.relative}/{evidence.PAGE_FILE}" if stored else None,
            }
        )
    return {
        "family": views.health_dict(health, now),
        "config": views.family_config(family, alert_channels(family)),
        "quarantined": views.quarantine_dicts(health),
        "checks": views.check_summary(rows),
        "late_writes": views.late_reports(rows),
        "audit": audit,
        "next_before": to_text(rows[-1].started_at) if len(rows) == limit else None,
        "data_docs": latest_docs(family.name),
        **({"charts": views.charts(rows, family)} if plots else {}),
    }


def latest_docs(family: str) -> str | None:
    """The newest stored Data Docs page of the family (relative to its ``datadocs/``), or
    None when there is none or the results store cannot be listed (logged)."""
    try:
        latest = evidence.latest(family)
    except Exception:
        log.warning("counter families: cannot list the GX results of %s", family, exc_info=True)
        return None
    return f"{latest.relative}/{evidence.PAGE_FILE}" if latest else None


def counter_data(user: Any, name: str, key: str) -> dict[str, Any]:
    from ...status import look_up

    family = family_for(user, name)
    store = store_for(family)
    with reading(f"counter {key!r} of family {family.name!r}"):
        try:
            state = look_up(store, key)
        except ValueError as exc:
            raise Problem(400, str(exc)) from None
    return {
        "family": family.name,
        "kind": family.kind.value,
        "newer_rows": family.rules.newer_rows,
        **views.counter_dict(state),
    }


def register_pages(app: FastAPI) -> None:
    @app.get("/", response_class=HTMLResponse)
    def overview(request: Request, user: User) -> HTMLResponse:
        data = overview_data(user)
        return render(request, "overview.html", 503 if data["error"] else 200, **data)

    @app.get("/lookup")
    def lookup(request: Request, user: User, family: str = "", key: str = "") -> Response:
        if not family:
            raise Problem(400, "choose a family")
        return RedirectResponse(
            f"{Page.of(request).base}/family/{quote(family, safe='')}/counter"
            f"?key={quote(key, safe='')}",
            status_code=303,
        )

    @app.get("/family/{name}", response_class=HTMLResponse)
    def family_page(
        request: Request,
        user: User,
        name: str,
        limit: int = DEFAULT_PAGE,
        before: str | None = None,
    ) -> HTMLResponse:
        data = family_data(user, name, limit, before)
        return render(request, "family.html", limit=limit, before=before, **data)

    @app.get("/family/{name}/counter", response_class=HTMLResponse)
    def counter_page(request: Request, user: User, name: str, key: str = "") -> HTMLResponse:
        family = family_for(user, name)
        if not key.strip():
            return render(request, "counter.html", family=family.name, counter=None, key="")
        data = counter_data(user, name, key)
        return render(request, "counter.html", family=family.name, counter=data, key=key)


def register_api(app: FastAPI) -> None:
    @app.get("/api/families")
    def api_overview(user: User) -> dict[str, Any]:
        data = overview_data(user)
        if data["error"]:
            raise Problem(503, data["error"])
        return data

    @app.get("/api/families/{name}")
    def api_family(
        user: User, name: str, limit: int = DEFAULT_PAGE, before: str | None = None
    ) -> dict[str, Any]:
        return family_data(user, name, limit, before, plots=False)

    @app.get("/api/families/{name}/counters/{key:path}")
    def api_counter(user: User, name: str, key: str) -> dict[str, Any]:
        return counter_data(user, name, key)

    @app.get("/api/families/{name}/audit")
    def api_audit(
        user: User,
        name: str,
        since: str | None = None,
        until: str | None = None,
        limit: Annotated[int | None, Query(ge=1)] = None,
        format: str = "json",
    ) -> Response:
        """Every audit row started in ``[since, until)`` (or the newest ``limit``), streamed
        as CSV, JSON or Parquet a page at a time: no row cap, one page in memory."""
        from itertools import islice

        from ... import audit_export
        from ...status import audit_stream

        family = family_for(user, name)
        if format not in audit_export.FORMATS:
            raise Problem(
                400, f"format must be one of {', '.join(audit_export.FORMATS)}, got {format!r}"
            )
        low, high = moment(since, "since"), moment(until, "until")
        if low and high and low >= high:
            raise Problem(400, f"since ({since}) must be before until ({until})")
        store = store_for(family)
        what = f"the audit of family {family.name!r}"
        with reading(what):
            rows = audit_stream(store, low, high)
            first = list(islice(rows, 1))  # Cassandra's errors before the response starts
        if limit is not None:
            rows = islice(rows, max(limit - len(first), 0))
        chunks = audit_export.chunks(format, chain(first, rows), family.name, low, high)
        headers = {
            "Content-Disposition": "attachment; "
            f'filename="{audit_export.filename(family.name, format)}"'
        }
        return StreamingResponse(
            _logged(chunks, what), media_type=audit_export.MEDIA_TYPES[format], headers=headers
        )


def _logged(chunks: Iterator[bytes], what: str) -> Iterator[bytes]:
    """The export's chunks; an error once the response has started cannot become an error
    page any more: it is logged and the response ends short (the client sees a cut file)."""
    try:
        yield from chunks
    except Exception:
        log.exception("counter families: streaming %s failed", what)
        raise


def register_files(app: FastAPI) -> None:
    """The family's GX results and Data Docs pages, read from the results store
    (``evidence``: where the verify steps of every worker copy them)."""

    def no_docs(family: Family) -> Problem:
        return Problem(
            404,
            f"family {family.name!r} has no Data Docs yet: a result is stored by the "
            f"{family.dag_id} DAG's verify step when a run folds rows (results store: "
            f"{evidence.results_root()})",
        )

    @app.get("/family/{name}/datadocs/latest")
    def latest_docs_page(request: Request, user: User, name: str) -> Response:
        family = family_for(user, name)
        relative = latest_docs(family.name)
        if relative is None:
            raise no_docs(family)
        return RedirectResponse(
            f"{Page.of(request).base}/family/{quote(family.name)}/datadocs/{relative}",
            status_code=307,
        )

    @app.get("/family/{name}/datadocs/", response_class=HTMLResponse)
    @app.get("/family/{name}/datadocs/index.html", response_class=HTMLResponse)
    def docs_index(request: Request, user: User, name: str, limit: int = 200) -> HTMLResponse:
        family = family_for(user, name)
        if not 1 <= limit <= 1000:
            raise Problem(400, f"limit must be between 1 and 1000, got {limit}")
        stored = evidence.runs(family.name, limit)
        return render(
            request,
            "results.html",
            family=family.name,
            runs=stored,
            limit=limit,
            keep_days=evidence.keep_days(),
            store=str(evidence.family_root(family.name)),
        )

    @app.get("/family/{name}/datadocs/static/{path:path}")
    def docs_static(user: User, name: str, path: str) -> Response:
        family_for(user, name)
        target = datadocs.resolve_gx_static(path)
        if target is None:
            raise Problem(404, f"no GX static file {path!r}")
        return FileResponse(target, headers={"Cache-Control": "max-age=86400"})

    @app.get("/family/{name}/datadocs/{day}/{folder}/{file}")
    def docs_file(
        request: Request, user: User, name: str, day: str, folder: str, file: str
    ) -> Response:
        family = family_for(user, name)
        if file == evidence.PAGE_FILE:
            page = evidence.page(family.name, day, folder, datadocs.render_page)
        else:
            target = evidence.open_file(family.name, day, folder, file)
            if target is not None:
                return Response(target.read_bytes(), media_type="application/json")
            page = None
        if page is None:
            raise Problem(
                404, f"no stored GX file {day}/{folder}/{file} for family {family.name!r}"
            )
        base = Page.of(request).base
        html = datadocs.rewrite(
            page,
            assets_url=f"{base}/assets/datadocs",
            site_url=f"{base}/family/{quote(family.name)}/datadocs",
            back=(f"{base}/family/{quote(family.name)}", f"Counter family {family.name}"),
        )
        return HTMLResponse(html)

    @app.get("/assets/datadocs/{path:path}")
    def docs_asset(path: str) -> Response:
        target = datadocs.resolve_asset(path)
        if target is None:
            raise Problem(404, f"no Data Docs asset {path!r} (run `make setup`)")
        return FileResponse(target, headers={"Cache-Control": "max-age=86400"})

    @app.get("/assets/{name}")
    def own_asset(name: str) -> Response:
        target = (STATIC / name).resolve()
        if not target.is_relative_to(STATIC) or not target.is_file():
            raise Problem(404, f"no asset {name!r}")
        media, _ = mimetypes.guess_type(target.name)
        return FileResponse(target, media_type=media, headers={"Cache-Control": "max-age=3600"})
