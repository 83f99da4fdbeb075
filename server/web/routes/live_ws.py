"""Websockets that push committed points, alerts and status changes to open pages."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from gradwatch_server.live.hub import RUNS_CHANNEL, encode

router = APIRouter()


async def _pump(ws: WebSocket, channel) -> None:
    hub = ws.app.state.services.hub
    await ws.accept()
    queue = hub.subscribe(channel)
    # Watch the socket while waiting for data: a page that goes away (or a server shutting down)
    # ends this loop at once instead of when the next send fails.
    closed = asyncio.ensure_future(_until_closed(ws))
    try:
        await ws.send_text(encode({"type": "subscribed", "channel": channel}))
        while True:
            get = asyncio.ensure_future(queue.get())
            await asyncio.wait({get, closed}, return_when=asyncio.FIRST_COMPLETED)
            if closed.done():
                get.cancel()
                return
            await ws.send_text(get.result())  # encoded once by the hub, for every page
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        closed.cancel()
        hub.unsubscribe(channel, queue)


async def _until_closed(ws: WebSocket) -> None:
    while (await ws.receive())["type"] != "websocket.disconnect":
        pass


@router.websocket("/ws/runs")
async def runs_feed(ws: WebSocket) -> None:
    """Run created / status / alert-count / last-step changes, for the runs list."""
    await _pump(ws, RUNS_CHANNEL)


@router.websocket("/ws/runs/{run_id}")
async def run_feed(ws: WebSocket, run_id: int) -> None:
    """New points (scalars and per-layer vectors), alerts and status of one run."""
    await _pump(ws, run_id)
