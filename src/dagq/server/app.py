"""The FastAPI application: routes, problem handlers, body limit, OpenAPI document."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from dagq import observability
from dagq.client import Client
from dagq.server import (
    actions,
    bulk,
    changes,
    console,
    dead_letter_routes,
    fleet,
    health,
    logs,
    problems,
    resources,
    token_routes,
    workflows,
)
from dagq.server.access import Access, document_refusals
from dagq.server.concern import Concerned
from dagq.server.context import Api, Settings
from dagq.server.idempotency import Keys
from dagq.server.limits import BodyLimit
from dagq.views import PlanCache


def create_app(settings: Settings) -> FastAPI:
    """The API of one store; the store is opened at startup and closed at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = Client(settings.store_url, create=True, plans=PlanCache())
        keys = Keys(client.store)
        app.state.api = Api(settings=settings, client=client, keys=keys)
        app.state.access = Access(client.store, required=settings.auth)
        sweeper = asyncio.create_task(keys.sweep_forever(), name="dagq-idempotency-sweep")
        try:
            # With --metrics-port: the sampled metrics, the event loop's lag among them.
            async with observability.watching(client.store):
                yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await client.close()

    app = FastAPI(
        title="dagq",
        summary="The HTTP job API of dagq: submit workflows, watch them, act on them.",
        version=_version(),
        lifespan=lifespan,
        docs_url=None,  # the console serves /docs with its own Swagger UI files
        openapi_url="/openapi.json",
        redoc_url=None,
    )
    problems.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(Concerned)  # outermost: it sees the routed scope as the answer starts
    # logs before workflows: its path would otherwise be read as a task's name
    for router in (
        logs.router,
        bulk.router,
        workflows.router,
        actions.router,
        changes.router,
        fleet.router,
        dead_letter_routes.router,
        token_routes.router,
        health.router,
    ):
        app.include_router(router)
    console.install(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


#: Every struct the OpenAPI document describes.
SCHEMAS = (*resources.SCHEMAS, logs.LogText, *fleet.SCHEMAS, *dead_letter_routes.SCHEMAS, bulk.Bulk)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with the response structs' schemas (from msgspec) added."""
    if app.openapi_schema is None:
        document = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        _, components = msgspec.json.schema_components(
            (
                *resources.SCHEMAS,
                logs.LogText,
                *fleet.SCHEMAS,
                *dead_letter_routes.SCHEMAS,
                bulk.Bulk,
                *token_routes.SCHEMAS,
            ),
            ref_template="#/components/schemas/{name}",
        )
        document.setdefault("components", {}).setdefault("schemas", {}).update(components)
        document_refusals(document)
        app.openapi_schema = document
    return app.openapi_schema


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dagq")
    except PackageNotFoundError:
        return "0"
