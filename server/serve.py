"""Running the app under uvicorn: in the foreground (``gradwatch serve``) or in a thread."""

from __future__ import annotations

import socket
import threading
import time

from .settings import Settings


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

    from .app import create_app

    config = uvicorn.Config(create_app(settings), log_level=settings.log_level, ws_max_size=64 << 20,
                            ws_ping_interval=20, ws_ping_timeout=60, timeout_graceful_shutdown=3)
    return uvicorn.Server(config)


def url_for(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"


def serve_forever(settings: Settings) -> None:
    """Serve in the foreground until Ctrl-C."""
    sock = bind(settings.host, settings.port)
    server = _server(settings)
    print(f"gradwatch: dashboard at {url_for(sock)}  (database: {settings.db_url})", flush=True)
    server.run(sockets=[sock])


class BackgroundServer:
    """A real uvicorn server on its own thread (demo and tests); ``url`` once started."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.sock = bind(settings.host, settings.port)
        self.url = url_for(self.sock)
        self.server = _server(settings)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, timeout: float = 20.0) -> "BackgroundServer":
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

    @property
    def services(self):
        return self.server.config.app.state.services
