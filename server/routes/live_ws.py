"""Websockets that push committed points, alerts and status changes to open pages."""

from __future__ import annotations

import json

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from ..live import RUNS_CHANNEL

router = APIRouter()


async def _pump(ws: WebSocket, channel) -> None:
    hub = ws.app.state.services.hub
    await ws.accept()
    queue = hub.subscribe(channel)
    try:
        await ws.send_text(json.dumps({"type": "subscribed", "channel": channel}))
        while True:
            await ws.send_text(json.dumps(await queue.get(), allow_nan=False))
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        hub.unsubscribe(channel, queue)


@router.websocket("/ws/runs")
async def runs_feed(ws: WebSocket) -> None:
    """Run created / status / alert-count / last-step changes, for the runs list."""
    await _pump(ws, RUNS_CHANNEL)


@router.websocket("/ws/runs/{run_id}")
async def run_feed(ws: WebSocket, run_id: int) -> None:
    """New points (scalars and per-layer vectors), alerts and status of one run."""
    await _pump(ws, run_id)
