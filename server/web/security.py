"""Who may talk to the server: Host, Origin, token, role and connection checks as one ASGI middleware.

It wraps the whole app, so every HTTP route, both websockets and the pages are covered without
any route knowing about it. It identifies the caller (``identify.Auth``), checks its role and projects
(``authorize``), puts the identity on the request and records every write in the audit log. A refused
websocket is answered with a plain HTTP status before the upgrade (401 for the token, 403 for
Host/Origin or the role, 503 when full, 429 when one client holds too many), so a client sees why at
once. Request bodies are cut at max_frame_bytes as they are read (chunked ones too) and must keep
coming (MIN_BODY_RATE); /healthz is never refused for load.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from urllib.parse import quote, urlsplit

from starlette.exceptions import HTTPException

from gradwatch_server.settings import LOOPBACK_NAMES, Settings, strip_port
from gradwatch_server.web.authorize import Denied, authorize
from gradwatch_server.web.identify import Auth
from gradwatch_server.web.roles import OPEN, Identity

NOBODY = Identity("nobody", "viewer", frozenset())  # on the open paths (/login) before logging in

OPEN_PATHS = frozenset({"/healthz", "/login", "/logout"})  # reachable without the token
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Refusal(Exception):
    """Why a request is turned away: an HTTP status, a message, extra headers."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def client_address(scope) -> str:
    """The peer's address (no port): what the per-client connection limit counts."""
    client = scope.get("client")
    return str(client[0]) if client else ""


def header_dict(scope) -> dict:
    """Request headers, lower-case names, latin-1 decoded; repeated cookies joined."""
    out: dict = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        out[name] = f"{out[name]}; {value}" if name == "cookie" and name in out else value
    return out


def _host_port(netloc: str) -> str:
    """host[:port] lower-cased, default ports dropped: TLS proxies and browsers differ on writing them."""
    netloc = netloc.strip().lower()
    for default in (":80", ":443"):
        if netloc.endswith(default):
            return netloc[: -len(default)]
    return netloc


def check_host(settings: Settings, headers: dict) -> None:
    """DNS-rebinding protection: only names this server answers to."""
    allowed = settings.allowed_host_names
    if "*" in allowed or not (settings.on_loopback or allowed):
        return
    host = headers.get("host", "")
    if not host:
        raise Refusal(400, "the request has no Host header (required while the server listens on loopback)")
    name = strip_port(host).lower()
    if name not in LOOPBACK_NAMES | allowed:
        raise Refusal(
            403,
            f"Host {host!r} is not a name this server answers to (DNS-rebinding protection); "
            f"if you reach it by that name, start it with --allowed-hosts {name}",
        )


def check_origin(scope, headers: dict) -> None:
    """Cross-site protection: a browser page of another site may not open a websocket or write."""
    origin = headers.get("origin")
    if origin is None or not (scope["type"] == "websocket" or scope.get("method") in UNSAFE_METHODS):
        return  # training clients send no Origin; cross-site GETs cannot read the answer (no CORS)
    if _host_port(urlsplit(origin).netloc) != _host_port(headers.get("host", "")):
        raise Refusal(
            403, f"cross-site request refused: Origin {origin!r} is not this server ({headers.get('host', '')!r})"
        )


def check_size(settings: Settings, headers: dict) -> None:
    """A request body larger than max_frame_bytes is refused before it is read."""
    length = headers.get("content-length", "")
    if length.isdigit() and int(length) > settings.max_frame_bytes:
        raise Refusal(413, f"request body of {length} bytes is over max_frame_bytes ({settings.max_frame_bytes})")


async def check_token(auth: Auth, scope, headers: dict) -> Identity:
    """With a token set, everything but /healthz and /login needs one; pages go to the login form."""
    if not auth.enabled:
        return OPEN
    found = await auth.identify(headers)
    if found is not None:
        return found
    if scope.get("path") in OPEN_PATHS:
        return NOBODY
    path = scope.get("path", "/")
    wants_page = (
        scope["type"] == "http"
        and scope.get("method") in ("GET", "HEAD")
        and not path.startswith("/api/")
        and "text/html" in headers.get("accept", "")
    )
    if wants_page:
        query = scope.get("query_string", b"").decode("latin-1")
        target = path + ("?" + query if query else "")
        raise Refusal(303, "login required", {"location": "/login?next=" + quote(target, safe="/")})
    raise Refusal(
        401,
        "a valid token is required: send 'Authorization: Bearer <token>' "
        "(the server's --token / GRADWATCH_TOKEN), or log in at /login",
        {"www-authenticate": 'Bearer realm="gradwatch"'},
    )


class BodyTooLarge(HTTPException):
    """A request body (chunked, or longer than it said) went past max_frame_bytes while being read.

    An HTTPException, so the app's handler answers it as a 413 wherever a route was reading the body."""

    def __init__(self, message: str):
        super().__init__(413, message, headers={"connection": "close"})  # the rest is never read


MIN_BODY_RATE = 16 << 10  # bytes a second a request body must average (after header_timeout's grace)


class BodyTooSlow(HTTPException):
    """A request body that trickles (a slow POST holding a connection slot): answered 408, not read further."""

    def __init__(self, message: str):
        super().__init__(408, message, headers={"connection": "close"})


class Guard:
    """The middleware: refuses what the checks refuse, counts what it lets through (in all and per client)."""

    def __init__(self, app, settings: Settings, auth: Auth, audit=None):
        self.app, self.settings, self.auth = app, settings, auth
        self.audit = audit  # audit(identity, scope, status): every write through the API is recorded
        self.active = 0
        self.per_client: dict[str, int] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if scope.get("path") == "/healthz":  # never refused for load: a probe must see a busy server is up
            return await self.app(scope, receive, send)
        try:
            headers = self.check(scope)
        except Refusal as refusal:
            return await refuse(scope, receive, send, refusal)
        client = client_address(scope)
        self.active += 1  # counted from here: a session check may wait on the database
        self.per_client[client] = self.per_client.get(client, 0) + 1
        started, status, identity = False, None, None

        async def watched_send(message):
            nonlocal started, status
            started = started or message["type"] in ("http.response.start", "websocket.accept")
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            identity = await check_token(self.auth, scope, headers)
            if scope.get("path") not in OPEN_PATHS:
                try:
                    await authorize(identity, scope, self.auth.engine)
                except Denied as exc:
                    raise Refusal(403, str(exc)) from None
            scope.setdefault("state", {})["identity"] = identity
            await self.app(scope, self.limited(scope, receive), watched_send)
        except Refusal as refusal:
            status = refusal.status
            await refuse(scope, receive, send, refusal)
        except (BodyTooLarge, BodyTooSlow) as exc:
            status = exc.status_code
            if not started:
                await refuse(scope, receive, send, Refusal(exc.status_code, exc.detail, exc.headers))
        finally:
            if self.audit and identity is not None and scope.get("method") in UNSAFE_METHODS:
                if scope.get("path") not in OPEN_PATHS:
                    self.audit(identity, scope, status)
            self.active -= 1
            self.per_client[client] -= 1
            if not self.per_client[client]:
                del self.per_client[client]

    def limited(self, scope, receive):
        """``receive`` that stops a request body at max_frame_bytes, however it is sent (chunked too)."""
        if scope["type"] != "http":
            return receive  # websocket messages: uvicorn's ws_max_size
        limit, seen, reading = self.settings.max_frame_bytes, 0, True
        start, grace = time.monotonic(), self.settings.header_timeout

        async def receive_limited():
            nonlocal seen, reading
            if not reading:  # the body is in: what follows is the disconnect, waited for as long as it takes
                return await receive()
            # A body must keep coming: header_timeout, plus a second per MIN_BODY_RATE bytes so far (slow POST)
            left = start + grace + seen / MIN_BODY_RATE - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), max(left, 0.001))
            except asyncio.TimeoutError:
                raise BodyTooSlow(f"request body slower than {MIN_BODY_RATE // 1024} KiB/s; not read further") from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                reading = bool(message.get("more_body"))
                if seen > limit:
                    raise BodyTooLarge(f"request body is over max_frame_bytes ({limit} bytes); not read further")
            return message

        return receive_limited

    def check(self, scope) -> dict:
        """Raise Refusal if this request may not go on (the token is checked after); returns its headers."""
        if self.active >= self.settings.max_connections:
            raise Refusal(
                503,
                f"server full: {self.active} connections open (max_connections="
                f"{self.settings.max_connections}); try again later",
            )
        held = self.per_client.get(client_address(scope), 0)
        if held >= self.settings.max_connections_per_client:
            raise Refusal(
                429,
                f"too many connections from this address: {held} open (max_connections_per_client="
                f"{self.settings.max_connections_per_client}); close some or try again later",
            )
        headers = header_dict(scope)
        check_host(self.settings, headers)
        check_origin(scope, headers)
        check_size(self.settings, headers)
        return headers


async def refuse(scope, receive, send, refusal: Refusal) -> None:
    """Answer with the refusal's status and a JSON {"error": ...}; a websocket before its upgrade."""
    if scope["type"] == "websocket":
        await receive()  # the websocket.connect event comes first
    body = json.dumps({"error": refusal.message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.encode(), v.encode()) for k, v in refusal.headers.items()),
    ]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # a server without denial responses: closing before accept still answers 403
        await send({"type": "websocket.close", "code": 1008, "reason": refusal.message[:120]})


SECRET_HEADER = re.compile(r"((?:authorization|cookie|set-cookie)\s*:\s*)\S.*", re.I)
ONCE_CODE = re.compile(r"(once=)[^&\s\"]+")


class LogGuard:
    """Keeps secrets out of uvicorn's logs and drops one false ERROR it logs after a denial."""

    # uvicorn's websockets-sansio protocol (the default since 0.35) does not mark the handshake done
    # after a denial response, so every refused websocket logged this ERROR (Kludex/uvicorn PR
    # #3138); our routes always accept, so here it never means anything else.
    DENIAL_NOISE = "ASGI callable returned without completing handshake."

    def filter(self, record) -> bool:
        if record.name == "uvicorn.access" and isinstance(record.args, tuple):
            # the access line's path may carry a one-time login code
            record.args = tuple(ONCE_CODE.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args)
            return True
        message = record.getMessage()
        if message == self.DENIAL_NOISE:
            return False
        redacted = ONCE_CODE.sub(r"\1***", SECRET_HEADER.sub(r"\1***", message))
        if redacted != message:  # at debug level the websocket handshake headers are logged
            record.msg, record.args = redacted, ()
        return True


def guard_logs() -> None:
    """Install LogGuard once on the loggers uvicorn (and websockets through it) write to."""
    for name in ("uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, LogGuard) for f in logger.filters):
            logger.addFilter(LogGuard())
