"""The ingest websocket: a training process streams its run here (protocol in gradwatch.protocol).

Batches are read, decoded and queued for the writer while earlier ones are still being
committed (a pipeline of at most ``IN_FLIGHT`` per connection), and answered in order: ``ack``
once committed and on disk (with ``refused`` when part of it could not be stored; pages see it at
the commit, the ack waits for the writer's group fsync), ``ack`` again for a duplicate, ``nack``
for a gap, and ``error`` + close for a run deleted meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from sqlalchemy import select, update

from gradwatch import protocol
from gradwatch_server.storage import db
from gradwatch_server.web import pools
from gradwatch_server.web.roles import identity_of

router = APIRouter()
log = logging.getLogger("gradwatch.ingest")
IN_FLIGHT = 16  # batches of one connection queued for the writer at once (back-pressure beyond)
BIG_FRAME = 256 << 10  # frames above this are decoded on a worker thread, off the event loop
MAX_HELLO_BYTES = 4 << 20  # a hello (config, meta, layer names) past this is refused before it is parsed


async def _refuse(ws: WebSocket, message: str, code: int, reason: str | None = None) -> None:
    body = {"type": "error", "message": message}
    if reason:
        body["code"] = reason
    try:
        await ws.send_text(protocol.dumps(body))
        await ws.close(code=code, reason=message[:120])
    except (WebSocketDisconnect, RuntimeError):
        pass


async def _receive(ws: WebSocket) -> str:
    # Frame size is capped by uvicorn (ws_max_size = the max_frame_bytes setting): a bigger frame is
    # refused with close code 1009 and a reason before it reaches this code.
    return await ws.receive_text()


@router.websocket(protocol.INGEST_PATH)
async def ingest(ws: WebSocket) -> None:
    """Hello, welcome, then batches acked once committed; duplicates acked, not stored twice."""
    services = ws.app.state.services
    pipeline = services.pipeline
    await ws.accept()
    identity = identity_of(ws)
    try:
        text = await _receive(ws)
        if len(text) > MAX_HELLO_BYTES:
            raise protocol.ProtocolError(f"hello of {len(text)} bytes is over {MAX_HELLO_BYTES} bytes")
        hello = await pools.run("decodes", protocol.loads, text) if len(text) > BIG_FRAME else protocol.loads(text)
        info = protocol.check_hello(hello)
        denied = await pools.run("sessions", _denied, services.engine, identity, info)
        if denied:
            await _refuse(ws, denied, 1008, "forbidden")
            return
        opened = await pipeline.open_run(info, _resume_from(hello), protocol.hello_layouts(hello))
        if opened.get("created") and identity.digest is not None:
            services.writer.submit(_created_by, opened["run_id"], identity.name)
    except protocol.ProtocolError as exc:
        code = protocol.CLOSE_PROTOCOL_MISMATCH if "version" in str(exc) else protocol.CLOSE_BAD_MESSAGE
        await _refuse(ws, str(exc), code)
        return
    except WebSocketDisconnect:
        return
    run_id = opened["run_id"]
    services.liveness.connect(run_id)
    replies: asyncio.Queue = asyncio.Queue(IN_FLIGHT)
    budget = Budget(services.settings.max_buffered_bytes)
    answering = asyncio.ensure_future(_answer(ws, pipeline, run_id, replies, budget))
    try:
        await ws.send_text(
            protocol.dumps(
                {
                    "type": "welcome",
                    "protocol": protocol.PROTOCOL_VERSION,
                    "run_id": run_id,
                    "acked_seq": opened["acked_seq"],
                    "features": services.settings.announced_features,
                    "max_frame_bytes": services.settings.max_frame_bytes,
                }
            )
        )
        while not answering.done():
            text = await _receive(ws)
            received, size = time.monotonic(), len(text)
            # Past max_buffered_bytes, stop reading: the client's window waits. If the answers stop (the run
            # was deleted, the database failed a batch), stop waiting too: the connection is over. Waiting
            # (a task and asyncio.wait) only when it has to: most frames find room at once.
            if not budget.try_take(size):
                await _unless_done(answering, budget.take(size))
            batch = await pools.run("decodes", pipeline.decode, text) if size > BIG_FRAME else pipeline.decode(text)
            item = (batch.seq, pipeline.submit(run_id, batch), size, received)
            if replies.full():
                await _unless_done(answering, replies.put(item))
            else:
                replies.put_nowait(item)
    except (WebSocketDisconnect, RuntimeError, _Over):
        pass
    except protocol.ProtocolError as exc:
        log.warning("run %s sent a frame that is not a batch: %s", run_id, exc)
        if not answering.done():
            await replies.put((None, exc, 0, 0.0))
    finally:
        services.liveness.disconnect(run_id)
        if not answering.done():
            await replies.put(None)
        await asyncio.gather(answering, return_exceptions=True)


class _Over(Exception):
    """The answering side of a connection ended while the reading side waited."""


async def _unless_done(answering: asyncio.Future, awaitable) -> None:
    waiting = asyncio.ensure_future(awaitable)
    await asyncio.wait({waiting, answering}, return_when=asyncio.FIRST_COMPLETED)
    if not waiting.done():
        waiting.cancel()
        raise _Over


def ack_text(seq: int, gap: float = 0.0, refused=None) -> str:
    """The ack of batch ``seq`` as it goes on the wire, with ``gap`` and ``refused`` when set."""
    ack = {"type": "ack", "seq": seq}
    if gap:
        ack["gap"] = gap
    if refused:
        ack["refused"] = refused
    return protocol.dumps(ack)


def _denied(engine, identity, info: dict) -> str | None:
    """Why this token may not write this run (another project; for ingest tokens, a run another token made)."""
    project = info.get("project") or "default"
    if not identity.sees(project):
        return f"the token {identity.name!r} may not write to the project {project!r}"
    if identity.role != "ingest":
        return None
    with engine.connect() as conn:
        row = conn.execute(select(db.runs.c.created_by).where(db.runs.c.uid == info["uid"])).first()
    if row is not None and row.created_by != identity.name:
        return f"the token {identity.name!r} (role ingest) may write only the runs it created"
    return None


def _created_by(conn, run_id: int, name: str) -> None:
    conn.execute(update(db.runs).where(db.runs.c.id == run_id, db.runs.c.created_by.is_(None)).values(created_by=name))


def _resume_from(hello: dict) -> int | None:
    resume = hello.get("resume_from")
    return resume if type(resume) is int and resume >= 1 else None


class Budget:
    """Bytes of frames a connection holds (read, not yet answered), capped at ``limit``."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._freed = asyncio.Event()

    def try_take(self, n: int) -> bool:
        """Take ``n`` bytes if they fit now (then True); False changes nothing (``take`` waits for room)."""
        if self.used and self.used + n > self.limit:  # one frame always fits (its size is capped apart)
            return False
        self.used += n
        return True

    async def take(self, n: int) -> None:
        while self.used and self.used + n > self.limit:
            self._freed.clear()
            await self._freed.wait()
        self.used += n

    def give(self, n: int) -> None:
        self.used -= n
        self._freed.set()


async def _answer(ws: WebSocket, pipeline, run_id: int, replies: asyncio.Queue, budget: Budget) -> None:
    """Send each batch's answer in order, once the writer has dealt with it."""
    while True:
        item = await replies.get()
        if item is None:
            return
        seq, pending, size, received = item
        if isinstance(pending, Exception):
            await _refuse(ws, f"bad frame (nothing of it was stored): {pending}", protocol.CLOSE_BAD_MESSAGE)
            return
        try:
            result = await pending
        except Exception as exc:  # the database failed this batch: the client keeps it and resends
            log.warning("run %s batch %s could not be stored: %r", run_id, seq, exc)
            await _refuse(ws, "the server could not store a batch (it will be resent)", 1011)
            return
        finally:
            budget.give(size)  # the batch left the writer queue: its bytes are free
        try:
            if "deleted" in result:
                await _refuse(
                    ws,
                    f"run {run_id} was deleted on the server; stop sending it",
                    protocol.CLOSE_RUN_DELETED,
                    "run_deleted",
                )
                return
            if "expected" in result:
                await ws.send_text(protocol.dumps({"type": "nack", "expected": result["expected"]}))
                continue
            refused = None
            if "duplicate" not in result:
                pipeline.publish(run_id, result)  # pages get it at commit; the ack waits until it is on disk
                refused = result.get("refused")
            synced = pipeline.synced()
            if synced is not None:
                try:
                    await synced
                except OSError as exc:  # committed, but not known on disk: no ack; the client resends it
                    log.warning("run %s batch %s: the WAL could not be synced: %r", run_id, seq, exc)
                    await _refuse(ws, "the server could not store a batch (it will be resent)", 1011)
                    return
            gap = pipeline.preferred_gap(received, run_id)  # many runs, or a busy server: fewer, larger batches
            await ws.send_text(ack_text(seq, gap, refused))
        except (WebSocketDisconnect, RuntimeError):
            return
