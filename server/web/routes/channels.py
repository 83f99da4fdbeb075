"""A project's notification channels over HTTP: read and replace them, send a test, list the deliveries."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Body, HTTPException, Request

from gradwatch_server.notify import channels, kinds

router = APIRouter()


def _services(request: Request):
    return request.app.state.services


@router.get("/api/projects/{project}/channels")
def get_channels(request: Request, project: str) -> dict:
    """The project's channels, each with its min_severity, and every channel kind's option schema (the form)."""
    return {"project": project, "channels": _services(request).read(channels.load, project), "kinds": kinds.schema()}


@router.put("/api/projects/{project}/channels")
async def put_channels(request: Request, project: str, body: dict = Body(...)) -> dict:
    """Replace the project's channels (validated: 400 says what is wrong)."""
    try:
        chans = channels.validate(body)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    services = _services(request)
    await asyncio.wrap_future(services.writer.submit(channels.save, project, chans))
    return {"project": project, "channels": chans}


@router.post("/api/projects/{project}/channels/test")
async def test_channels(request: Request, project: str) -> dict:
    """Send a test notification to every channel of the project now; returns each outcome."""
    services = _services(request)
    return {"project": project, "results": await asyncio.to_thread(services.notifier.test, project)}


@router.get("/api/projects/{project}/deliveries")
def get_deliveries(request: Request, project: str) -> list[dict]:
    """The latest notifications of the project: channel, status (delivered / failed / limited), reason, attempts."""
    return _services(request).read(channels.deliveries, project)
