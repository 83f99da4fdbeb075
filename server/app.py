"""The app factory: ``create_app(settings)`` wires services, routers and error handlers."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .routes import api, ingest_ws, live_ws, pages
from .services import Services
from .settings import Settings, from_env
from .store import NotFound


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the ASGI app for ``settings`` (default: from GRADWATCH_* env vars)."""
    settings = settings or from_env()
    services = Services(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        services.hub.loop = asyncio.get_running_loop()
        monitor = asyncio.create_task(services.watch_for_crashes(min(2.0, settings.crash_timeout / 4)))
        try:
            yield
        finally:
            monitor.cancel()
            services.close()

    app = FastAPI(title="gradwatch", version="0.1.0", lifespan=lifespan)
    app.state.services = services

    @app.exception_handler(NotFound)
    async def not_found(_request: Request, exc: NotFound):
        return JSONResponse({"error": str(exc)}, status_code=404)

    for module in (api, ingest_ws, live_ws, pages):
        app.include_router(module.router)
    return app
