"""Live pushes across server processes over PostgreSQL LISTEN/NOTIFY: no broker beyond the database.

Every process publishes what it ingests to its own pages (live.Hub) and, on PostgreSQL, as a
NOTIFY on one channel; every other process LISTENs and hands the message to its own pages. A
NOTIFY payload is capped (8000 bytes), so a big points push travels as a reference (run, keys,
step range) and the receiving process reads those points from the database, only when one of
its pages shows that run.
"""

from __future__ import annotations

import json
import logging
import select
import threading
import uuid

from sqlalchemy import text

from gradwatch_server.live.hub import encode

log = logging.getLogger("gradwatch.server")
CHANNEL = "gradwatch_live"
MAX_PAYLOAD = 7500


class PgFanout:
    """One LISTEN connection on a thread; ``send`` NOTIFYs the other processes."""

    def __init__(self, engine, deliver):
        self.engine = engine
        self.deliver = deliver  # called on the event loop thread with (channel, message, reference)
        self.origin = uuid.uuid4().hex[:12]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.loop = None

    def start(self, loop) -> None:
        self.loop = loop
        self._thread = threading.Thread(target=self._listen, name="gradwatch-fanout", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def payload(self, channel, message: dict | None = None, ref: dict | None = None, encoded: str | None = None) -> str:
        """The NOTIFY text: the message itself, or a reference to it (when it is too big, or given).

        ``encoded``: the message as the hub already encoded it for this process's pages, reused as is.
        """
        if message is not None:
            head = json.dumps({"o": self.origin, "c": channel})
            body = f'{head[:-1]}, "m": {encode(message) if encoded is None else encoded}}}'
            if len(body.encode()) <= MAX_PAYLOAD:
                return body
            ref = reference(message)
        return json.dumps({"o": self.origin, "c": channel, "r": ref})

    def send(
        self, conn, channel, message: dict | None = None, ref: dict | None = None, encoded: str | None = None
    ) -> None:
        """NOTIFY the other processes (on a worker thread: a database round trip)."""
        conn.execute(
            text("SELECT pg_notify(:c, :p)"), {"c": CHANNEL, "p": self.payload(channel, message, ref, encoded)}
        )

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen_once()
            except Exception as exc:  # a dropped connection: listen again shortly
                log.warning("gradwatch: live fan-out connection lost (%r); reconnecting", exc)
                self._stop.wait(1.0)

    def _listen_once(self) -> None:
        raw = self.engine.raw_connection()
        try:
            dbapi = raw.driver_connection
            dbapi.autocommit = True
            cur = dbapi.cursor()
            cur.execute(f"LISTEN {CHANNEL}")
            while not self._stop.is_set():
                for payload in _wait_for_notifies(dbapi, timeout=0.5):
                    self._received(payload)
        finally:
            raw.invalidate()  # never hand a LISTENing connection back to the pool

    def _received(self, payload: str) -> None:
        try:
            note = json.loads(payload)
        except ValueError:
            return
        if note.get("o") == self.origin or self.loop is None:
            return  # our own NOTIFY: our pages already have it
        self.loop.call_soon_threadsafe(self.deliver, note.get("c"), note.get("m"), note.get("r"))


def _wait_for_notifies(dbapi, timeout: float) -> list[str]:
    """Payloads that arrived within ``timeout`` (psycopg2 or psycopg 3)."""
    if hasattr(dbapi, "poll"):  # psycopg2
        if select.select([dbapi], [], [], timeout)[0]:
            dbapi.poll()
        out = [n.payload for n in dbapi.notifies]
        dbapi.notifies.clear()
        return out
    return [n.payload for n in dbapi.notifies(timeout=timeout, stop_after=64)]  # psycopg 3.2+


def reference(message: dict) -> dict:
    """What a receiving process needs to read a big message back from the database: a run's summary
    (with its config and traceback) by id, a points push by keys and step range; anything else: resync."""
    if message.get("type") == "run":
        return {"type": "run", "run_id": (message.get("run") or {}).get("id")}
    if message.get("type") != "points":
        return {"type": "resync"}
    steps = [s for part in ("series", "vectors") for v in (message.get(part) or {}).values() for s in v["steps"]]
    keys = sorted({*(message.get("series") or {}), *(message.get("vectors") or {})})
    return {
        "type": message.get("type"),
        "run_id": message.get("run_id"),
        "keys": keys,
        "lo": min(steps) if steps else None,
        "hi": max(steps) if steps else None,
        "last_step": message.get("last_step"),
    }


def stored_reference(run_id: int, stored: dict, last_step: int | None = None) -> dict:
    """A reference to a committed batch's points (ingest's ``stored``), without building the push."""
    steps = [s for _kind, s, _walls, _col in stored.values() if len(s)]
    lo = min(int(s.min()) for s in steps) if steps else None
    hi = max(int(s.max()) for s in steps) if steps else None
    return {"type": "points", "run_id": run_id, "keys": sorted(stored), "lo": lo, "hi": hi, "last_step": last_step}
