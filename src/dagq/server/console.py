"""The web console: static files shipped inside the package, served at ``/``.

``/`` answers the console's page; its scripts, styles and vendored libraries are under
``/console/``, and ``/docs`` is Swagger UI from the package's own copy. Everything the
browser needs is in the package (built from npm by ``console/bundle/build.sh`` and
committed), so serving it needs no Node. The console is a client of the ``/v1`` API like
any other: it sends the caller's bearer token on every request and holds no state on
the server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.staticfiles import StaticFiles

#: The console's files (package data).
ASSETS = Path(__file__).with_name("console")
#: Revalidate on every load: a new dagq version must not run an old cached script.
NO_CACHE = {"Cache-Control": "no-cache"}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def index() -> FileResponse:
    """The console's single page (it routes by the URL's fragment)."""
    return FileResponse(ASSETS / "index.html", headers=NO_CACHE)


@router.get("/docs")
async def docs() -> HTMLResponse:
    """The OpenAPI document in Swagger UI, from the package's own copy (no CDN)."""
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="dagq API",
        swagger_js_url="/console/vendor/swagger-ui/swagger-ui-bundle.js",
        swagger_css_url="/console/vendor/swagger-ui/swagger-ui.css",
        swagger_favicon_url="data:,",
    )


class _Assets(StaticFiles):
    """Static files that a browser revalidates (ETag) before reusing."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(NO_CACHE)
        return response


def install(app: FastAPI) -> None:
    """Serve the console at ``/``, its assets under ``/console/``, and ``/docs`` (the app
    is created with ``docs_url=None``)."""
    app.include_router(router)
    app.mount("/console", _Assets(directory=ASSETS), name="console")
