"""GX Data Docs, readable offline: a run's page rendered from its stored result, served by the
plugin with its CDN assets local.

A run stores only its GX validation result (``evidence.keep``); the plugin renders its Data
Docs page with GX's own renderer the first time someone opens it (``render_page``, stored
beside the result by ``evidence.page``). GX's page is HTML that loads Bootstrap, jQuery, Font
Awesome, bootstrap-table and Vega from five CDNs; without internet the pages render unstyled.
``make setup`` fetches exactly those files once, from the npm registry with ``npm pack``
(integrity pinned below), into ``.cache/datadocs-assets/``; the plugin serves them and rewrites
each page's CDN addresses (and its links into the GX site it was rendered in) as it serves the
page. The stored files stay as GX wrote them.

    python -m counters.airflow.ui.datadocs fetch [DEST]
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from functools import cache
from html import escape
from pathlib import Path
from typing import Any

from ...gx import checks

ASSETS_ENV = "COUNTERS_DATADOCS_ASSETS"
DEFAULT_ASSETS = checks.PROJECT_ROOT / ".cache" / "datadocs-assets"


@dataclass(frozen=True)
class Package:
    """An npm package version, the sha512 of its tarball, and the files the pages need (a
    path ending in ``/`` is a folder: Font Awesome's CSS loads its fonts from ``webfonts/``)."""

    name: str
    version: str
    integrity: str
    files: tuple[str, ...]

    @property
    def folder(self) -> str:
        return f"{self.name}@{self.version}"


BOOTSTRAP = Package(
    "bootstrap",
    "4.3.1",
    "sha512-rXqOmH1VilAt2DyPzluTi2blhk17bO7ef+zLLPlWvG494pDxcM234pJ8wTc/6R40UWizAIIMgxjvxZg5kmsbag==",
    ("dist/css/bootstrap.min.css", "dist/js/bootstrap.min.js"),
)
BOOTSTRAP_DARK = Package(
    "@forevolve/bootstrap-dark",
    "1.1.0",
    "sha512-A3ucpEpxPoTVO490lZZCfjPXxv832l7mm1IxX3bXyxvgwnPGXDLyh7dWrphXKO8YBAu3EswbBEu3VSW8NRMW3A==",
    ("dist/css/bootstrap-prefers-dark.css",),
)
DATEPICKER = Package(
    "bootstrap-datepicker",
    "1.9.0",
    "sha512-9rYYbaVOheGYxjOr/+bJCmRPihfy+LkLSg4fIFMT9Od8WwWB/MB50w0JO1eBgKUMbb7PFHQD5uAfI3ArAxZRXA==",
    ("dist/css/bootstrap-datepicker.min.css", "dist/js/bootstrap-datepicker.min.js"),
)
FONT_AWESOME = Package(
    "@fortawesome/fontawesome-free",
    "6.6.0",
    "sha512-60G28ke/sXdtS9KZCpZSHHkCbdsOGEhIUGlwq6yhY74UpTiToIh8np7A8yphhM4BWsvNFtIvLpi4co+h9Mr9Ow==",
    ("css/all.min.css", "webfonts/"),
)
POPPER = Package(
    "popper.js",
    "1.12.9",
    "sha512-s0EEi9xiSCdqz9lV4IiVH5yIZnDX/U1t0tCjB+0jXx9jW8lrR7kOpVupiUg175ogqVoudpDXHF1p6dKATCHMeg==",
    ("dist/umd/popper.min.js",),
)
JQUERY = Package(
    "jquery",
    "3.7.1",
    "sha512-m4avr8yL8kmFN8psrbFFFmB/If14iN5o9nw/NgnnM+kybDJpRsAynV2BsfpTYrTRysYUdADVD7CkUUizgkpLfg==",
    ("dist/jquery.min.js",),
)
TABLE = Package(
    "bootstrap-table",
    "1.19.1",
    "sha512-WvV+l1AI/C+zThaKmfHmi/IuayVNB0qdFyEhFx1jyZhO0oLtNJNANkCR3rvJf6Dkh72dsLElxpE/bzK9seEQLA==",
    (
        "dist/bootstrap-table.min.css",
        "dist/bootstrap-table.min.js",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    ),
)
TABLE_1190 = Package(  # GX takes one stylesheet of the filter-control extension from 1.19.0
    "bootstrap-table",
    "1.19.0",
    "sha512-L+USHm3X9FKocx/6yngGu12yF6r6s1Ntuc+hoIK2a2QQJjHw5kcySLiE2HY/9sEaSGAOfPbfQOtBH3uKkcpqEA==",
    (
        "dist/extensions/filter-control/bootstrap-table-filter-control.css",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    ),
)
# jsdelivr serves a bare ``npm/<name>@<major>`` as the newest release of that major version and
# the file the package names under "jsdelivr"; these are the newest releases of 2026-11.
VEGA = Package(
    "vega",
    "5.33.1",
    "sha512-1fArfVDUqVbb5z8n+/nVQb+VNBzx8svY6CrsyTK4Ujm4yrd9I1auoKxBAPXLCavY1LcrbHUskQbGUP8gXOzyQw==",
    ("build/vega.min.js",),
)
VEGA_LITE = Package(
    "vega-lite",
    "5.23.0",
    "sha512-l4J6+AWE3DIjvovEoHl2LdtCUkfm4zs8Xxx7INwZEAv+XVb6kR6vIN1gt3t2gN2gs/y4DYTs/RPoTeYAuEg6mA==",
    ("build/vega-lite.min.js",),
)
VEGA_EMBED = Package(
    "vega-embed",
    "6.29.0",
    "sha512-PmlshTLtLFLgWtF/b23T1OwX53AugJ9RZ3qPE2c01VFAbgt3/GSNI/etzA/GzdrkceXFma+FDHNXUppKuM0U6Q==",
    ("build/vega-embed.min.js",),
)
PACKAGES = (
    BOOTSTRAP,
    BOOTSTRAP_DARK,
    DATEPICKER,
    FONT_AWESOME,
    POPPER,
    JQUERY,
    TABLE,
    TABLE_1190,
    VEGA,
    VEGA_LITE,
    VEGA_EMBED,
)

CDN: dict[str, tuple[Package, str]] = {
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": (
        BOOTSTRAP,
        "dist/css/bootstrap.min.css",
    ),
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": (
        BOOTSTRAP,
        "dist/js/bootstrap.min.js",
    ),
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": (  # noqa: E501
        BOOTSTRAP_DARK,
        "dist/css/bootstrap-prefers-dark.css",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": (  # noqa: E501
        DATEPICKER,
        "dist/css/bootstrap-datepicker.min.css",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": (  # noqa: E501
        DATEPICKER,
        "dist/js/bootstrap-datepicker.min.js",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": (
        FONT_AWESOME,
        "css/all.min.css",
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": (
        POPPER,
        "dist/umd/popper.min.js",
    ),
    "https://code.jquery.com/jquery-3.7.1.min.js": (JQUERY, "dist/jquery.min.js"),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": (
        TABLE,
        "dist/bootstrap-table.min.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": (
        TABLE,
        "dist/bootstrap-table.min.js",
    ),
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js": (  # noqa: E501
        TABLE,
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css": (  # noqa: E501
        TABLE_1190,
        "dist/extensions/filter-control/bootstrap-table-filter-control.css",
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css": (  # noqa: E501
        TABLE_1190,
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    ),
    "https://cdn.jsdelivr.net/npm/vega@5": (VEGA, "build/vega.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-lite@5": (VEGA_LITE, "build/vega-lite.min.js"),
    "https://cdn.jsdelivr.net/npm/vega-embed@6": (VEGA_EMBED, "build/vega-embed.min.js"),
}
"""Every CDN address in GX's page templates and the file of the npm package it serves."""

REMOTE_LOGO = re.compile(
    r"https://great-expectations-web-assets\.s3[^\"']*/(logo-long\.png)[^\"']*"
)
"""GX's header logo, loaded from S3 with a query string: GX ships the same file in the site's
``static/images``."""
SITE_RELATIVE = re.compile(r"""(["'])(?:\.\./)+(static/[^"']*|index\.html|expectations/[^"']*)""")
"""A page's links into the GX site it was rendered in (its static files, the index, the suite's
page): the stored page is served without that site, so they point to the plugin's own."""
BODY = re.compile(r"<body\b[^>]*>", re.IGNORECASE)
ASSET_REFERENCE = re.compile(r"""<(?:script|link|img)\b[^>]*?\b(?:src|href)=["']([^"']+)["']""")


def assets_root() -> Path:
    return Path(os.environ.get(ASSETS_ENV) or DEFAULT_ASSETS)


def rewrite(html: str, assets_url: str, site_url: str, back: tuple[str, str] | None = None) -> str:
    """The page with every CDN address replaced by the local copy under ``assets_url``, the
    remote logo and the links into its GX site (static files; the index and the suite's page,
    both to the list of stored results) by ``site_url``'s, and, given ``back`` (address,
    label), a line at the top linking back to the family's page (pure)."""
    for url, (package, path) in CDN.items():
        html = html.replace(f'"{url}"', f'"{assets_url}/{package.folder}/{path}"')
    html = REMOTE_LOGO.sub(lambda m: f"{site_url}/static/images/{m.group(1)}", html)
    html = SITE_RELATIVE.sub(
        lambda m: (
            f"{m.group(1)}{site_url}/"
            + (m.group(2) if m.group(2).startswith("static/") else "index.html")
        ),
        html,
    )
    if back:
        address, label = back
        line = (
            '<div class="counters-back" style="padding:4px 16px;font-size:13px;'
            f'border-bottom:1px solid #8884">&larr; <a href="{escape(address)}">'
            f"{escape(label)}</a></div>"
        )
        html = BODY.sub(lambda m: m.group(0) + line, html, count=1)
    return html


def remote_assets(html: str) -> list[str]:
    """The scripts, stylesheets and images the page still loads from another host."""
    return [
        url
        for url in ASSET_REFERENCE.findall(html)
        if url.startswith(("http://", "https://", "//"))
    ]


def missing_assets(root: Path | None = None) -> list[str]:
    """The local asset files that are not there (all of them before ``make setup``)."""
    root = root or assets_root()
    return [
        f"{package.folder}/{path}"
        for package, path in CDN.values()
        if not (root / package.folder / path).is_file()
    ]


# --- rendering a stored result ---------------------------------------------------------------


@cache
def _page_makers() -> tuple[Any, Any]:
    """GX's validation page renderer and HTML view, made once per process: the view compiles
    its Jinja templates on first use and keeps them."""
    checks.quiet()
    from great_expectations.render.renderer import ValidationResultsPageRenderer
    from great_expectations.render.view import DefaultJinjaPageView

    return ValidationResultsPageRenderer(), DefaultJinjaPageView()


def render_page(result: dict[str, Any]) -> str:
    """The Data Docs page of a stored validation result (``result.json``), as GX's Data Docs
    site renders it."""
    from great_expectations.core import ExpectationSuiteValidationResultSchema

    renderer, view = _page_makers()
    validation = ExpectationSuiteValidationResultSchema().load(result)
    return str(view.render(renderer.render(validation), show_how_to_buttons=True))


# --- GX's own static files --------------------------------------------------------------------


def gx_static_root() -> Path:
    """GX's site assets (its logo, fonts, styles) as the installed package ships them: a
    stored page names them relative to a Data Docs site, which the store does not keep."""
    import importlib.util

    spec = importlib.util.find_spec("great_expectations")
    if spec is None or spec.origin is None:
        raise RuntimeError("great_expectations is not installed")
    return Path(spec.origin).parent / "render" / "view" / "static"


def resolve_gx_static(relative: str) -> Path | None:
    root = gx_static_root().resolve()
    target = (root / relative).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        return None
    return target


def resolve_asset(relative: str) -> Path | None:
    root = assets_root().resolve()
    target = (root / relative).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        return None
    return target


# --- fetching the assets (make setup) -------------------------------------------------------


def _sha512(path: Path) -> str:
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode()


def _extract(tarball: Path, package: Package, dest: Path) -> None:
    """The package's listed files from its tarball (members under ``package/``)."""
    wanted = [f"package/{path}" for path in package.files]
    with tarfile.open(tarball) as archive:
        members = [
            m
            for m in archive.getmembers()
            if m.isfile()
            and any(m.name == w or (w.endswith("/") and m.name.startswith(w)) for w in wanted)
        ]
        for member in members:
            target = dest / member.name.removeprefix("package/")
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            if source is None:  # not a regular file; isfile() above lets none through
                continue
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
    missing = [p for p in package.files if not p.endswith("/") and not (dest / p).is_file()]
    if missing:
        raise RuntimeError(f"{package.folder}: the tarball has no {missing}")


def fetch(dest: Path | None = None, npm: str | None = None) -> list[str]:
    """Fetch the packages that are not in ``dest`` yet (``npm pack``, integrity checked);
    returns the ones fetched. Raises ``RuntimeError`` with the reason when it cannot."""
    dest = dest or assets_root()
    todo = [p for p in PACKAGES if not (dest / p.folder / ".complete").is_file()]
    if not todo:
        return []
    npm = npm or shutil.which("npm")
    if not npm:
        raise RuntimeError("npm (Node.js) is not installed")
    with tempfile.TemporaryDirectory(prefix="datadocs-assets-") as tmp:
        done = subprocess.run(
            [npm, "pack", "--json", "--pack-destination", tmp]
            + [f"{p.name}@{p.version}" for p in todo],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp,
        )
        if done.returncode != 0:
            raise RuntimeError(f"npm pack failed: {done.stderr.strip()[-2000:]}")
        packed = {
            (p["name"], p["version"]): Path(tmp) / p["filename"] for p in json.loads(done.stdout)
        }
        for package in todo:
            tarball = packed.get((package.name, package.version))
            if tarball is None:
                raise RuntimeError(f"npm pack did not return {package.folder}")
            if _sha512(tarball) != package.integrity:
                raise RuntimeError(
                    f"{package.folder}: tarball integrity {_sha512(tarball)} is not the pinned "
                    f"{package.integrity}"
                )
            folder = dest / package.folder
            shutil.rmtree(folder, ignore_errors=True)
            _extract(tarball, package, folder)
            (folder / ".complete").write_text(package.integrity + "\n")
    return [p.folder for p in todo]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "fetch" or len(args) > 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    dest = Path(args[1]) if len(args) > 1 else assets_root()
    try:
        fetched = fetch(dest)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(
            f"[datadocs] WARNING: Data Docs assets not fetched ({exc}); the Data Docs pages the "
            "plugin serves will load them from CDNs (unstyled offline)",
            file=sys.stderr,
        )
        return 1
    where = (
        dest.relative_to(checks.PROJECT_ROOT) if dest.is_relative_to(checks.PROJECT_ROOT) else dest
    )
    if fetched:
        print(f"[datadocs] fetched {len(fetched)} npm package(s) into {where}")
    else:
        print(f"[datadocs] Data Docs assets ready in {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
