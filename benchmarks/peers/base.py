"""The interface every adapter implements; the worker only ever talks to this."""

from __future__ import annotations

import os
import time
from pathlib import Path


class Tool:
    name = "?"
    # what "visible" means for this tool, printed next to the latency row
    visible_means = "?"
    # why a row does not apply, by row name ("chart" ...); absent: it applies
    not_applicable: dict[str, str] = {}

    def __init__(self, root: Path):
        self.root = root  # everything the tool writes goes under here (for bytes per point)

    def version(self) -> str:
        raise NotImplementedError

    def open(self, run: str) -> None:
        """Start a run, as a training script would."""
        raise NotImplementedError

    def log(self, metrics: dict, step: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """End the run the way the tool's docs say (flushes what is buffered)."""
        raise NotImplementedError

    def flush_for_read(self) -> None:
        """What a user must call for a just-logged point to become readable at all (often nothing)."""

    def visible(self, key: str, step: int) -> bool:
        """Whether ``step`` of ``key`` is readable through the tool's own reader yet."""
        raise NotImplementedError

    def bulk_write(self, key: str, n: int) -> None:
        """Store n points of ``key`` the fastest way the tool offers (setup for the chart read)."""
        self.open("bulk")
        for s in range(n):
            self.log({key: s * 1e-6}, s)
        self.close()

    def read_series(self, key: str, max_points: int | None = None) -> int:
        """Read the whole series of ``key`` with a fresh reader, as a chart would; returns its length."""
        raise NotImplementedError

    def stored_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file() and not p.is_symlink())


def wait_until(predicate, timeout: float, poll: float = 0.001) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("not visible in time")
        time.sleep(poll)


def env_dir(var: str, root: Path, sub: str) -> Path:
    path = root / sub
    path.mkdir(parents=True, exist_ok=True)
    os.environ[var] = str(path)
    return path
