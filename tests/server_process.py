"""`gradwatch serve` in a process of its own, for tests and benchmarks: as in real use, the server
does not share the training process's GIL, and it can be SIGKILLed like a crashing machine."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """Started and answering /healthz on return; ``port`` fixed to restart one on the same address."""

    def __init__(self, db: str, *extra: str, port: int | None = None, timeout: float = 60.0):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gradwatch_server.cli", "serve", "--port", str(self.port), "--db", db, *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:  # the port is bound before uvicorn listens on it
            try:
                urllib.request.urlopen(self.url + "/healthz", timeout=1).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    raise RuntimeError(f"gradwatch serve did not start (exit code {self.proc.poll()})") from None
                time.sleep(0.02)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def kill(self) -> None:
        """A crash, not a clean stop."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
