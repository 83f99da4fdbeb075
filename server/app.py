"""The app factory: ``create_app(settings)`` wires services, routers and error handlers."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gradwatch.contract import VERSION
from gradwatch_server.services import Services
from gradwatch_server.settings import Settings, from_env
from gradwatch_server.storage import retention
from gradwatch_server.storage.store import NotFound
from gradwatch_server.web import audit, authorize, routes
from gradwatch_server.web.identify import Auth
from gradwatch_server.web.security import Guard
from gradwatch_server.web.sessions import Sessions


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the ASGI app for ``settings`` (default: from GRADWATCH_* env vars)."""
    settings = settings or from_env()
    services = Services(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        services.start(asyncio.get_running_loop())
        monitor = asyncio.create_task(services.liveness.watch(min(2.0, settings.crash_timeout / 4)))
        collector = asyncio.create_task(retention.run_on_schedule(services))  # returns at once when retention is off
        try:
            yield
        finally:
            monitor.cancel()
            collector.cancel()
            services.close()

    docs = {} if settings.api_docs else {"docs_url": None, "redoc_url": None}  # CDN scripts: opt in
    app = FastAPI(title="gradwatch", version=VERSION, lifespan=lifespan, **docs)
    app.state.services = services
    app.state.auth = Auth(
        settings.token, Sessions(services.engine, services.writer, settings.session_days), services.engine
    )
    app.state.auth.start()

    def audited(identity, scope, status) -> None:
        action = f"{scope.get('method')} {scope.get('path')}"
        audit.note(services.writer, identity, action, status, authorize.project_in(scope))

    # Outermost of our layers: Host/Origin/token/role/connection checks cover every route and both
    # websockets before any of them runs; every write is recorded in the audit log.
    app.add_middleware(Guard, settings=settings, auth=app.state.auth, audit=audited)

    @app.exception_handler(NotFound)
    async def not_found(_request: Request, exc: NotFound):
        return JSONResponse({"error": str(exc)}, status_code=404)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, exc: RequestValidationError):
        # One readable line in "error" (like every other error here), FastAPI's details kept beside it.
        parts = [f"{'.'.join(str(x) for x in e.get('loc', ())[1:]) or 'request'}: {e.get('msg')}" for e in exc.errors()]
        return JSONResponse({"error": "; ".join(parts), "detail": jsonable_encoder(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException):
        return JSONResponse(
            {"error": str(exc.detail), "detail": exc.detail},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(OverflowError)
    async def out_of_range(_request: Request, exc: OverflowError):
        return JSONResponse(
            {"error": "a number in the request is out of range (64-bit integers only)"}, status_code=400
        )

    for module in routes.ALL:  # /metrics answers 501 without prometheus_client
        app.include_router(module.router)
    return app
