"""The ingest websocket: a training process streams its run here (protocol in gradwatch.protocol)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from gradwatch import protocol

router = APIRouter()
log = logging.getLogger("gradwatch.ingest")


async def _refuse(ws: WebSocket, message: str, code: int) -> None:
    await ws.send_text(protocol.dumps({"type": "error", "message": message}))
    await ws.close(code=code, reason=message[:120])


@router.websocket(protocol.INGEST_PATH)
async def ingest(ws: WebSocket) -> None:
    """Hello, welcome, then batches acked once committed; duplicates acked, not stored twice."""
    services = ws.app.state.services
    await ws.accept()
    try:
        hello = protocol.loads(await ws.receive_text())
        info = protocol.check_hello(hello)
    except protocol.ProtocolError as exc:
        code = protocol.CLOSE_PROTOCOL_MISMATCH if "version" in str(exc) else protocol.CLOSE_BAD_MESSAGE
        await _refuse(ws, str(exc), code)
        return
    except WebSocketDisconnect:
        return
    resume = hello.get("resume_from")
    resume = resume if isinstance(resume, int) and not isinstance(resume, bool) else None
    layouts = hello.get("layouts") if isinstance(hello.get("layouts"), dict) else None
    try:
        opened = await services.open_run(info, resume, layouts)
    except protocol.ProtocolError as exc:
        await _refuse(ws, str(exc), protocol.CLOSE_BAD_MESSAGE)
        return
    run_id, last_seq = opened["run_id"], opened["acked_seq"]
    services.connected[run_id] += 1
    try:
        await ws.send_text(protocol.dumps({"type": "welcome", "protocol": protocol.PROTOCOL_VERSION,
                                           "run_id": run_id, "acked_seq": last_seq,
                                           "features": protocol.SERVER_FEATURES}))
        while True:
            message = protocol.loads(await ws.receive_text())
            seq = message.get("seq")
            if message.get("type") != "batch" or not isinstance(seq, int):
                raise protocol.ProtocolError("expected a batch with an integer seq")
            if seq <= last_seq:
                await ws.send_text(protocol.dumps({"type": "ack", "seq": seq}))
                continue
            if seq != last_seq + 1:
                await ws.send_text(protocol.dumps({"type": "nack", "expected": last_seq + 1}))
                continue
            result = await services.ingest_batch(run_id, message)
            if "expected" in result:  # another connection of this run moved on meanwhile
                last_seq = result["expected"] - 1
                await ws.send_text(protocol.dumps({"type": "nack", "expected": result["expected"]}))
                continue
            last_seq = seq
            await ws.send_text(protocol.dumps({"type": "ack", "seq": seq}))
    except WebSocketDisconnect:
        pass
    except protocol.ProtocolError as exc:
        log.warning("run %s sent a bad batch: %s", run_id, exc)
        await _refuse(ws, f"bad batch (nothing of it was stored): {exc}", protocol.CLOSE_BAD_MESSAGE)
    finally:
        services.connected[run_id] -= 1
