"""One websocket to the server's ingest endpoint: hello/welcome, frames in and out, refusals.

Failures come out as ``LinkClosed`` (try again later) or ``Refused`` (do not retry: wrong
token, run refused); exceptions from the websocket library are dropped on the spot rather
than chained, so their tracebacks (and the frames they hold) never outlive the failure.
"""

from __future__ import annotations

from gradwatch import protocol

RUN_DELETED = "run_deleted"


class LinkClosed(Exception):
    """The connection is gone or could not be made; retry with backoff."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Refused(Exception):
    """The server will not take this run as it is: stop trying (``kind`` and ``text`` for the user)."""

    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind, self.text = kind, text


def ingest_url(server: str) -> str:
    """http(s)://host:port -> ws(s)://host:port/ws/ingest."""
    server = server.rstrip("/")
    if server.startswith("https://"):
        server = "wss://" + server[len("https://") :]
    elif server.startswith("http://"):
        server = "ws://" + server[len("http://") :]
    elif not server.startswith(("ws://", "wss://")):
        server = "ws://" + server
    return server + protocol.INGEST_PATH


class Link:
    """The connection state of one run: at most one open websocket at a time."""

    def __init__(self, server: str, run_info: dict, token: str | None = None):
        self.server = server.rstrip("/")
        self.url = ingest_url(server)
        self.run_info = run_info
        self._headers = {"Authorization": f"Bearer {token}"} if token else None  # never logged or spooled
        self.conn = None
        self.run_id: int | None = None
        # What the server announced in its last welcome; until one arrives, batches use the plain
        # JSON forms every server takes (they may wait in the outbox for a server of any version).
        self.features: set[str] = set()
        self.ever_connected = False
        self.fatal: str | None = None  # why this run will not be sent again by this process
        self.deleted = False

    def open(self, resume_from: int | None, layouts: dict) -> dict:
        """Connect and say hello; returns the welcome. Raises LinkClosed or Refused."""
        conn, status, reason = self._upgrade()
        if status in (401, 403):
            self.fatal = "auth"
            raise Refused(
                "auth",
                f"gradwatch: the server at {self.server} refused the token (HTTP {status}): set "
                "GRADWATCH_TOKEN or init(token=...); your data is kept in <spool> — send it later "
                "with `gradwatch sync <spool>`",
            )
        if conn is None:
            raise LinkClosed(reason)
        self.conn = conn
        reply = None
        try:
            conn.send(protocol.dumps(protocol.hello(self.run_info, resume_from=resume_from, layouts=layouts)))
            reply = protocol.loads(conn.recv(timeout=10))
        except Exception:  # dropped, not chained: see the module docstring
            pass
        if reply is None:
            self.close()
            raise LinkClosed("no welcome from the server")
        if reply.get("type") == "error":
            self.close()
            self.on_error(reply)
            raise Refused(
                self.fatal or "refused",
                f"gradwatch: the server refused the run: {reply.get('message')}; your data is kept in <spool>",
            )
        self.run_id = reply.get("run_id")
        self.features = set(reply.get("features") or [])
        self.ever_connected = True
        return reply

    def _upgrade(self):
        """(connection, None, None), or (None, HTTP status or None, reason) when it failed."""
        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect

        try:
            # No permessage-deflate: packed float64 barely compresses, and deflating every frame cost
            # the sender (and the server) about a fifth of their time per point.
            conn = connect(
                self.url,
                open_timeout=3,
                close_timeout=1,
                max_size=None,
                compression=None,
                additional_headers=self._headers,
            )
            return conn.__enter__(), None, None  # a connection kept across calls, closed by close()
        except InvalidStatus as exc:
            status = exc.response.status_code
            return None, status, f"HTTP {status}"
        except Exception as exc:
            return None, None, _reason(exc)

    def on_error(self, message: dict) -> None:
        """An ``error`` frame: a deleted run is final; anything else closes this connection."""
        if message.get("code") == RUN_DELETED:
            self.fatal, self.deleted = "deleted", True
        elif self.fatal is None and self.conn is None:
            self.fatal = "refused"  # refused at hello: the same hello would be refused again

    def send(self, data: bytes) -> None:
        failed = False
        try:
            self.conn.send(data, text=True)
        except Exception:
            failed = True
        if failed:
            self.close()
            raise LinkClosed("connection lost while sending")

    def receive(self, timeout: float) -> dict | None:
        """The next message, or None when none came within ``timeout`` s."""
        frame, failed = None, False
        try:
            frame = self.conn.recv(timeout=timeout)
        except TimeoutError:
            return None
        except Exception:
            failed = True
        if failed:
            self.close()
            raise LinkClosed("connection lost")
        return protocol.loads(frame)

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()  # joins its reader thread; the socket is closed even when this fails
            except Exception:
                pass


def _reason(exc: BaseException) -> str:
    """A short human reason for a failed connection attempt."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc) or type(exc).__name__
    return text[:200]
