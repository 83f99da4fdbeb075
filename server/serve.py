"""Running the app under uvicorn: in the foreground (``gradwatch serve``) or in a thread."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from gradwatch_server.settings import Settings


def bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket ourselves so port 0 yields a known free port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _server(settings: Settings):
    import uvicorn

    from gradwatch_server.app import create_app
    from gradwatch_server.web.security import guard_logs
    from gradwatch_server.web.slow_clients import protocol_class

    guard_logs()
    config = uvicorn.Config(
        create_app(settings),
        http=protocol_class(settings.header_timeout),
        **_common(settings),
    )
    return uvicorn.Server(config)


def _common(settings: Settings) -> dict:
    """uvicorn options of one process and of every worker."""
    return {
        "proxy_headers": bool(settings.trusted_proxy),  # X-Forwarded-* believed only from a --trusted-proxy
        "forwarded_allow_ips": settings.trusted_proxy or None,
        "log_level": settings.log_level,
        # websockets' sans-I/O protocol: a live link's frame costs the server ~10 % less CPU than the
        # default (legacy) one (docs/benchmarks.md, "Live path, round 5")
        "ws": "websockets-sansio",
        "ws_max_size": settings.max_frame_bytes,
        "ws_ping_interval": 20,
        "ws_ping_timeout": 60,
        "timeout_graceful_shutdown": 3,
    }


def url_for(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def login_link(app, url: str) -> str:
    """A one-time link that logs a browser in (the token itself is never printed)."""
    return f"{url}/login?once={app.state.auth.new_once_code()}"


EXPOSED_WARNING = """\
gradwatch: WARNING ==========================================================
gradwatch: WARNING  Listening on {host}, reachable from other machines, with NO TOKEN.
gradwatch: WARNING  Anyone who can reach port {port} can read, change and delete every run
gradwatch: WARNING  and write fake data. Start it with --token <secret> (or GRADWATCH_TOKEN),
gradwatch: WARNING  or listen on 127.0.0.1 only. See docs/security.md.
gradwatch: WARNING =========================================================="""


def announce(settings: Settings, server, url: str) -> None:
    """What a person starting the server must see: the address, a login link, or a warning."""
    print(f"gradwatch: dashboard at {url}  (database: {_safe_db(settings.db_url)})", flush=True)
    if settings.token:
        print(f"gradwatch: token required; one-time login link: {login_link(server.config.app, url)}", flush=True)
    elif not settings.on_loopback:
        print(EXPOSED_WARNING.format(host=settings.host, port=url.rsplit(":", 1)[-1]), file=sys.stderr, flush=True)


def _safe_db(db_url: str) -> str:
    """The database URL without its password."""
    scheme, sep, rest = db_url.partition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return db_url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{hostpart}"


def serve_forever(settings: Settings) -> None:
    """Serve in the foreground until Ctrl-C."""
    if settings.workers > 1:
        serve_workers(settings)
        return
    sock = bind(settings.host, settings.port)
    server = _server(settings)
    announce(settings, server, url_for(sock))
    server.run(sockets=[sock])


def serve_workers(settings: Settings) -> None:
    """``settings.workers`` server processes on one socket, over one PostgreSQL database.

    Each process ingests and serves on its own; exactly-once storage holds across them (the batch's
    seq is claimed in its transaction) and pages see every process's data (fanout.py).
    """
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from gradwatch_server.settings import to_env
    from gradwatch_server.web.security import guard_logs

    if not settings.db_url.startswith(("postgresql", "postgres")):
        raise ValueError(
            "--workers > 1 needs a PostgreSQL database (--db postgresql://...): SQLite takes one writer process"
        )
    os.environ.update(to_env(settings))  # each worker builds its app from the same GRADWATCH_* settings
    sock = bind(settings.host, settings.port)
    guard_logs()
    config = uvicorn.Config(
        "gradwatch_server.app:create_app",
        factory=True,
        http="gradwatch_server.web.slow_clients:WorkerProtocol",  # each process builds it from GRADWATCH_*
        workers=settings.workers,
        **_common(settings),
    )
    url = url_for(sock)
    print(
        f"gradwatch: dashboard at {url}  ({settings.workers} processes; database: {_safe_db(settings.db_url)})",
        flush=True,
    )
    if settings.token:
        print(f"gradwatch: token required; log in at {url}/login", flush=True)
    elif not settings.on_loopback:
        print(EXPOSED_WARNING.format(host=settings.host, port=url.rsplit(":", 1)[-1]), file=sys.stderr, flush=True)
    Multiprocess(config, sockets=[sock]).run()


class BackgroundServer:
    """A real uvicorn server on its own thread (demo and tests); ``url`` once started."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.sock = bind(settings.host, settings.port)
        self.url = url_for(self.sock)
        self.server = _server(settings)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, timeout: float = 20.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gradwatch server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()

    def login_link(self) -> str:
        """A fresh one-time login link (tests, demo)."""
        return login_link(self.server.config.app, self.url)

    @property
    def services(self):
        return self.server.config.app.state.services
