"""Slowloris protection: uvicorn's HTTP protocol with a deadline for a request's headers.

uvicorn closes an idle keep-alive connection, but not one that trickles a request's headers a byte
at a time: such connections never reach the app (so the ASGI middleware cannot count or refuse
them) and stayed open for ever. Here every connection must finish a request's headers within
``header_timeout`` seconds of opening, or of its previous response, or it is closed.
"""

from __future__ import annotations

import os


def protocol_class(header_timeout: float):
    """An HTTP protocol class for ``uvicorn.Config(http=...)``: httptools' when installed, else h11's."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # httptools has no wheel for this platform: the pure-Python parser
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class HeaderDeadline(base):
        """``base`` whose connections are closed when a request's headers take too long."""

        deadline = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.arm()

        def arm(self) -> None:
            self.disarm()
            self.deadline = self.loop.call_later(header_timeout, self.expire)

        def disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def expire(self) -> None:
            self.deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def on_headers_complete(self) -> None:  # httptools: the headers are in
            self.disarm()
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            conn = getattr(self, "conn", None)  # h11: past IDLE, the request line and headers are in
            if conn is not None and self.deadline is not None and conn.their_state.__name__ != "IDLE":
                self.disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.arm()  # the next request on this keep-alive connection has the same deadline

        def connection_lost(self, exc) -> None:
            self.disarm()
            super().connection_lost(exc)

    return HeaderDeadline


def __getattr__(name: str):
    """``WorkerProtocol``: the class for server processes started by uvicorn's supervisor, which name it
    as 'gradwatch_server.web.slow_clients:WorkerProtocol' (a string travels to them; a class would not)."""
    if name == "WorkerProtocol":
        return protocol_class(float(os.environ.get("GRADWATCH_HEADER_TIMEOUT") or 10.0))
    raise AttributeError(name)
