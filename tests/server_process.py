"""`gradwatch serve` in a process of its own, for tests and benchmarks: as in real use, the server
does not share the training process's GIL, and it can be SIGKILLed like a crashing machine."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from waiting import wait_until


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
        try:  # the port is bound before uvicorn listens on it
            wait_until(self._answers, timeout=timeout, message="gradwatch serve never answered /healthz")
        except BaseException:
            self._kill_group()
            raise

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"gradwatch serve did not start (exit code {self.proc.poll()})")
        try:
            urllib.request.urlopen(self.url + "/healthz", timeout=1).read()
            return True
        except OSError:
            return False

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """A clean stop (SIGTERM); the whole process group is killed if it has not ended in 30 s."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        finally:
            self._kill_group()

    def kill(self) -> None:
        """A crash, not a clean stop."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._kill_group()

    def _kill_group(self) -> None:
        """SIGKILL to what is left of the server's process group (its workers; in the suite, where
        tests/children.py gives each process a group of its own); reaps the server."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def get_json(url: str):
    """A GET answered with JSON (benchmarks read the API this way)."""
    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


def rss_mib(pid: int) -> float:
    """Resident memory of a process in MiB, from /proc (0 if it has none)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
