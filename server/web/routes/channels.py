"""A project's notification channels over HTTP: read and replace them, send a test, list the deliveries."""

from __future__ import annotations

from fastapi import APIRouter, Body, HTTPException, Request

from gradwatch_server.notify import channels, kinds
from gradwatch_server.notify.dispatcher import TooSoon
from gradwatch_server.web import pools

router = APIRouter()


def _services(request: Request):
    return request.app.state.services


@router.get("/api/projects/{project}/channels")
def get_channels(request: Request, project: str) -> dict:
    """The project's channels, each with its min_severity, and every channel kind's option schema (the form)."""
    chans = channels.masked(_services(request).read(channels.load, project))  # secrets are write-only
    return {"project": project, "channels": chans, "kinds": kinds.schema()}


@router.put("/api/projects/{project}/channels")
async def put_channels(request: Request, project: str, body: dict = Body(...)) -> dict:
    """Replace the project's channels (validated: 400 says what is wrong; a masked secret keeps its value)."""
    services = _services(request)

    def job(conn):
        return channels.save(conn, project, channels.validate(body, channels.load(conn, project)))

    try:
        chans = await services.writer.submit_here(job)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return {"project": project, "channels": channels.masked(chans)}


@router.post("/api/projects/{project}/channels/test")
async def test_channels(request: Request, project: str) -> dict:
    """Send a test notification to every channel of the project now; returns each outcome."""
    services = _services(request)
    try:
        results = await pools.run("notify", services.notifier.test, project)
    except TooSoon as exc:
        raise HTTPException(429, str(exc), headers={"Retry-After": str(int(exc.wait) + 1)}) from None
    return {"project": project, "results": results}


@router.get("/api/projects/{project}/deliveries")
def get_deliveries(request: Request, project: str) -> list[dict]:
    """The latest notifications of the project: channel, status (delivered / failed / limited), reason, attempts."""
    return _services(request).read(channels.deliveries, project)
