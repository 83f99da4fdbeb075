"""The background thread that batches records and delivers them to the server."""

from __future__ import annotations

import collections
import math
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from . import protocol
from .outbox import Outbox, write_run_info
from .values import Deferred, resolve

MAX_RECORDS_PER_BATCH = 2000
# The training thread gives up the GIL inside many torch calls; if this thread is busy encoding
# it keeps the GIL until Python's switch interval (5 ms) forces it out, and the training thread
# waits that long. Records are serialised one by one (a 300-layer record takes ~0.3 ms; a whole
# 256-record batch in one json.dumps call held the GIL for ~70 ms) and the GIL is handed back
# every few records, so the training thread never waits long.
YIELD_EVERY = 4


def ingest_url(server: str) -> str:
    """http(s)://host:port -> ws(s)://host:port/ws/ingest."""
    server = server.rstrip("/")
    if server.startswith("https://"):
        server = "wss://" + server[len("https://"):]
    elif server.startswith("http://"):
        server = "ws://" + server[len("http://"):]
    elif not server.startswith(("ws://", "wss://")):
        server = "ws://" + server
    return server + protocol.INGEST_PATH


class Sender(threading.Thread):
    """Drains records handed over by ``put`` and sends them in numbered, acked batches.

    ``put`` is a deque append: it never blocks and never raises. The thread reconnects
    with backoff, resends what the server has not acked, and keeps everything (memory,
    then disk) until it is acked.
    """

    def __init__(self, server: str, run_info: dict, spool_dir: Path, *, flush_interval: float = 0.2,
                 max_memory_bytes: int = 32 << 20, inspect: Callable | None = None, outbox: Outbox | None = None):
        super().__init__(name="gradwatch-sender", daemon=True)
        self.url = ingest_url(server)
        self.run_info = run_info
        self.flush_interval = flush_interval
        self.inspect = inspect
        self.outbox = outbox or Outbox(spool_dir, max_memory_bytes)
        self._queue: collections.deque = collections.deque()
        self._seq = max(self.outbox.seqs_from(0), default=0)
        self._layouts: dict[str, list[str]] = {}  # every vector layout sent so far (repeated in each hello)
        self._acked = 0
        self._sent_upto = 0
        self._put_count = 0
        self._done_count = 0
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._drain_lock = threading.Lock()
        # What the server announced in its last welcome; until one arrives, batches use the plain
        # JSON forms every server takes (they may wait in the outbox for a server of any version).
        self.features: set[str] = set()
        self._idle = threading.Condition()
        self.run_id: int | None = None
        self.fatal_error: str | None = None
        self.connected = False
        self.errors = 0
        write_run_info(self.outbox.spool_dir, run_info)

    # -- called from the training thread ------------------------------------------------
    def put(self, item: tuple) -> None:
        """Hand over ('rec', step, t, scalars, vectors), ('event', dict) or ('layout', key, names)."""
        self._put_count += 1
        self._queue.append(item)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything put so far is acked; True on success."""
        deadline = time.monotonic() + timeout
        wanted, target = self._put_count, None
        while time.monotonic() < deadline:
            self._wake.set()
            if target is None and self._done_count >= wanted:
                target = self._seq
            if target is not None and self._acked >= target:
                return True
            if not self.is_alive() or self.fatal_error:
                return False
            time.sleep(0.01)
        return False

    def close(self, timeout: float = 10.0) -> int:
        """Flush, stop the thread, and spill what is left; returns the batches left undelivered."""
        self.flush(timeout)
        self._stopping.set()
        self._wake.set()
        self.join(timeout=max(1.0, timeout / 4))
        self._drain()  # anything put after the thread stopped
        return self.outbox.spill_all()

    # -- the thread ----------------------------------------------------------------------
    def run(self) -> None:
        conn = None
        backoff = 0.1
        next_connect = 0.0
        while not self._stopping.is_set():
            try:
                self._drain()
                if conn is None and self.fatal_error is None and time.monotonic() >= next_connect and len(self.outbox):
                    conn = self._connect()
                    if conn is None:
                        next_connect = time.monotonic() + backoff
                        backoff = min(backoff * 2, 5.0)
                    else:
                        backoff = 0.1
                if conn is not None:
                    conn = self._pump(conn)
                else:
                    self._wake.wait(self.flush_interval)
                    self._wake.clear()
            except Exception as exc:  # never let the thread die: the data is still queued
                self.errors += 1
                conn = self._drop(conn)
                if self.errors <= 3:
                    print(f"gradwatch: sender error (will retry): {exc!r}", file=sys.stderr)
                time.sleep(0.1)
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def _drop(self, conn):
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
        self.connected = False
        return None

    def _connect(self):
        from websockets.sync.client import connect

        try:
            conn = connect(self.url, open_timeout=3, close_timeout=1, max_size=None).__enter__()
        except Exception:
            return None
        try:
            conn.send(protocol.dumps(protocol.hello(self.run_info, resume_from=self.outbox.first(),
                                                    layouts=self._layouts)))
            reply = protocol.loads(conn.recv(timeout=10))
        except Exception:
            return self._drop(conn)
        if reply.get("type") == "error":
            self.fatal_error = str(reply.get("message"))
            print(f"gradwatch: server refused the run: {self.fatal_error}; data kept in "
                  f"{self.outbox.spool_dir}", file=sys.stderr)
            return self._drop(conn)
        self.run_id = reply.get("run_id")
        self.features = set(reply.get("features") or [])
        self._on_ack(int(reply.get("acked_seq", 0)))
        self._sent_upto = self._acked
        self.connected = True
        return conn

    def _pump(self, conn):
        """Send what is unsent, then wait briefly for acks; returns None when the link broke."""
        for seq in self.outbox.seqs_from(self._sent_upto + 1):
            data = self.outbox.get(seq)
            if data is not None:
                conn.send(data.decode())
            self._sent_upto = seq
        deadline = time.monotonic() + self.flush_interval
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._wake.is_set():
                    self._wake.clear()
                    return conn
                try:
                    frame = conn.recv(timeout=remaining)
                except TimeoutError:
                    return conn
                self._handle(protocol.loads(frame))
        except Exception:
            return self._drop(conn)

    def _handle(self, message: dict) -> None:
        kind = message.get("type")
        if kind == "ack":
            self._on_ack(int(message["seq"]))
        elif kind == "nack":
            self._sent_upto = int(message["expected"]) - 1
        elif kind == "error":
            print(f"gradwatch: server error: {message.get('message')}", file=sys.stderr)
            raise ConnectionError(message.get("message"))

    def _on_ack(self, seq: int) -> None:
        if seq > self._acked:
            self._acked = seq
        self.outbox.ack(self._acked)

    def _drain(self) -> None:
        """Move queued items into numbered batches in the outbox."""
        with self._drain_lock:  # close() may drain from the caller's thread while this one still runs
            self._drain_locked()

    def _drain_locked(self) -> None:
        while self._queue:
            items = []
            while self._queue and len(items) < MAX_RECORDS_PER_BATCH:
                items.append(self._queue.popleft())
            self._seq += 1
            self.outbox.add(self._seq, self._encode(self._seq, items).encode())
            self._done_count += len(items)

    def _encode(self, seq: int, items: list) -> str:
        """One batch as JSON text, built record by record with the GIL handed back in between."""
        deferred = [d for item in items if item[0] == "rec" for d in _deferred_in(item)]
        resolved = dict(zip(map(id, deferred), resolve(deferred))) if deferred else {}
        records, events, layouts = [], [], {}
        for n, item in enumerate(items):
            if n % YIELD_EVERY == YIELD_EVERY - 1:
                time.sleep(0)  # hand the GIL back often: see YIELD_EVERY
            if item[0] == "event":
                events.append(item[1])
            elif item[0] == "layout":
                layouts[item[1]] = self._layouts[item[1]] = list(item[2])
            else:
                records.append(protocol.dumps(self._encode_record(item, resolved)))
        return protocol.batch_text(seq, records, layouts, events)

    def _encode_record(self, item: tuple, resolved: dict) -> dict:
        _, step, wall, scalars, vectors = item
        plain = {}
        for key, value in scalars.items():
            plain[key] = resolved[id(value)][0] if isinstance(value, Deferred) else value
        if self.inspect is not None:
            self.inspect(step, plain)
        out_vectors = {}
        binary = protocol.VECTOR_F64 in self.features
        for key, (value, missing, size) in vectors.items():
            values = resolved[id(value)] if isinstance(value, Deferred) else list(value)
            if missing or len(values) != size:
                full: list = [None] * size
                it = iter(values)
                missing_set = set(missing)
                for i in range(size):
                    if i not in missing_set:
                        full[i] = next(it)
                values = full
            if binary:  # base64 float64: NaN/inf exact, and ~8x less work than JSON numbers
                out_vectors[key] = protocol.encode_vector_f64(values)
            elif not missing and math.isfinite(sum(values)):
                out_vectors[key] = values  # all finite (a NaN/inf would make the sum non-finite): no encoding
            else:
                out_vectors[key] = [protocol.encode_float(v) for v in values]
        record = {"step": step, "t": wall, "scalars": {k: protocol.encode_float(v) for k, v in plain.items()}}
        if out_vectors:
            record["vectors"] = out_vectors
        return record


def _deferred_in(item: tuple):
    _, _, _, scalars, vectors = item
    for value in scalars.values():
        if isinstance(value, Deferred):
            yield value
    for value, _, _ in vectors.values():
        if isinstance(value, Deferred):
            yield value
