"""GET /: the web console, a single page of plain HTML, CSS and JavaScript modules shipped in api/static/.

The page and its assets hold no data (everything they show comes from the API with the visitor's token), so they
are public even with EARL_PROTECT_READS (deps.needs_token); no CDN, no build step.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parents[1] / "static"
ASSETS = "/console"  # where StaticFiles serves STATIC (index.html refers to its files there)

router = APIRouter(tags=["console"])


@router.get("/", include_in_schema=False)
async def console() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8",
                        headers={"Cache-Control": "no-cache"})


def assets() -> StaticFiles:
    """The console's files (follow_symlink off: nothing outside STATIC is served)."""
    return StaticFiles(directory=STATIC)
