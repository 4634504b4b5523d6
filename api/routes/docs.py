"""GET /docs and /redoc: the API's interactive docs from this server's own files, never a CDN.

FastAPI's pages load Swagger UI and ReDoc from a CDN (broken offline, and a third party's script on the API's
origin) with an inline script that the Content-Security-Policy forbids. Here /docs shows Swagger UI from the
files of the `swagger-ui-bundle-v2` package when it is installed (served with the console's files, started by
static/docs.js), else a plain page pointing at /openapi.json and docs/api.md; /redoc leads to /docs. No package
ships ReDoc's files, and none of these is a dependency: the docs page is a convenience, the schema is the API's.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

SWAGGER_ASSETS = "/console/swagger"  # public like the console's own files: no data in them
# Swagger UI sets style attributes from JavaScript: its page allows inline styles, still no inline script.
DOCS_CSP = ("default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; object-src 'none'; "
            "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")

router = APIRouter(include_in_schema=False)


def swagger_files() -> Path | None:
    """The folder of Swagger UI's files (swagger-ui-bundle.js, swagger-ui.css) when a package installed them
    (swagger-ui-bundle-v2, module swagger_ui_bundle) in a version that reads FastAPI's OpenAPI 3.1: 5 or later
    (the older swagger-ui-bundle package ships Swagger UI 4, which shows only "Unable to render")."""
    try:
        from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = Path(str(swagger_ui_path))
    version = re.fullmatch(r"swagger-ui-(\d+)\..*", path.name)
    return path if version and int(version[1]) >= 5 and (path / "swagger-ui-bundle.js").is_file() else None


def swagger_assets() -> StaticFiles | None:
    folder = swagger_files()
    return None if folder is None else StaticFiles(directory=folder)


SWAGGER_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{title}} - API docs</title>
<link rel="icon" href="data:,"><link rel="stylesheet" href="{SWAGGER_ASSETS}/swagger-ui.css"></head>
<body><div id="swagger-ui"></div>
<script src="{SWAGGER_ASSETS}/swagger-ui-bundle.js"></script><script src="/console/docs.js"></script></body></html>
"""

PLAIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} - API docs</title><link rel="icon" href="data:,">
<link rel="stylesheet" href="/console/console.css"></head>
<body><main><h1>{title}: API docs</h1>
<p>The interactive docs need Swagger UI's files, which this server does not have: it loads nothing from a CDN.
Install them with <code>pip install swagger-ui-bundle-v2</code> and restart to get them here.</p>
<p>The API's OpenAPI schema: <a href="/openapi.json">/openapi.json</a> (any OpenAPI viewer reads it); every
endpoint, status and setting is described in <code>docs/api.md</code>; the console is at <a href="/">/</a>.</p>
</main></body></html>
"""


@router.get("/docs")
async def docs(request: Request) -> HTMLResponse:
    title = html.escape(request.app.title)
    page = SWAGGER_PAGE if request.app.state.swagger else PLAIN_PAGE
    return HTMLResponse(page.format(title=title), headers={"Content-Security-Policy": DOCS_CSP,
                                                          "Cache-Control": "no-cache"})


@router.get("/redoc")
async def redoc() -> RedirectResponse:
    return RedirectResponse("/docs")


__all__ = ["DOCS_CSP", "SWAGGER_ASSETS", "router", "swagger_assets", "swagger_files"]
