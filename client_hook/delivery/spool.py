"""Spool directories: where a run's undelivered batches wait on disk, and who may use them.

One directory per run (``<root>/<run uid>/``): ``run.json`` (the hello's run section, never the
token), one ``<seq>.json`` file per batch, and ``.lock``, held (``flock``) by the process that
owns the run, so ``gradwatch sync`` never delivers a spool that a live process is still writing.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no locking; sync and a live run must then not overlap
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"
INFO_NAME = "run.json"


def default_root() -> Path:
    """$GRADWATCH_SPOOL_DIR, else $XDG_CACHE_HOME/gradwatch/spool (~/.cache/gradwatch/spool)."""
    if os.environ.get("GRADWATCH_SPOOL_DIR"):
        return Path(os.environ["GRADWATCH_SPOOL_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gradwatch" / "spool"


class Lock:
    """An exclusive, non-blocking lock on one spool directory, held until ``release``."""

    def __init__(self, spool_dir: Path):
        self.path = Path(spool_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> bool:
        """True when this process now holds the lock (or already did)."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def forget(self) -> None:
        """After fork: the child must not unlock the parent's spool (the descriptor is shared)."""
        self._fd = None


def write_run_info(spool_dir: Path, run_info: dict) -> None:
    """Keep the run's hello section next to its batches, for ``gradwatch sync``."""
    tmp = Path(spool_dir) / (INFO_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the run's secret
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(run_info, default=str))
    os.replace(tmp, Path(spool_dir) / INFO_NAME)


def read_run_info(spool_dir: Path) -> dict:
    return json.loads((Path(spool_dir) / INFO_NAME).read_text())


def batch_files(spool_dir: Path) -> list[Path]:
    """The batch files of a spool, oldest first."""
    return sorted(p for p in Path(spool_dir).glob("*.json") if p.stem.isdigit())


def pending_runs(root: Path) -> list[Path]:
    """Run spools under ``root`` that hold a run.json, oldest first."""
    if not Path(root).is_dir():
        return []
    found = [p for p in Path(root).iterdir() if p.is_dir() and (p / INFO_NAME).is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def remove(spool_dir: Path) -> None:
    """Delete a delivered (or deleted-on-the-server) run's spool directory."""
    shutil.rmtree(spool_dir, ignore_errors=True)
