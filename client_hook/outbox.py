"""Batches waiting for the server's ack: bounded memory, the overflow spilled to disk."""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path


class Outbox:
    """Encoded batches by sequence number, oldest first, until the server acks them.

    At most ``max_memory_bytes`` stay in memory; older batches are written to
    ``spool_dir`` (one file per batch) and read back when it is their turn to be sent,
    so a long outage costs disk, never points.
    """

    def __init__(self, spool_dir: Path, max_memory_bytes: int = 32 << 20):
        self.spool_dir = Path(spool_dir)
        self.max_memory_bytes = max_memory_bytes
        self._items: OrderedDict[int, bytes | None] = OrderedDict()
        self._memory = 0
        self._lock = threading.Lock()
        self.spilled_total = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def add(self, seq: int, data: bytes) -> None:
        """Keep batch ``seq``; spills the oldest in-memory batches when over budget."""
        with self._lock:
            self._items[seq] = data
            self._memory += len(data)
            if self._memory > self.max_memory_bytes:
                self._spill_locked(keep_newest=1)

    def _spill_locked(self, keep_newest: int) -> None:
        in_memory = [s for s, d in self._items.items() if d is not None]
        for seq in in_memory[: max(0, len(in_memory) - keep_newest)]:
            if self._memory <= self.max_memory_bytes // 2 and keep_newest:
                break
            data = self._items[seq]
            self._write(seq, data)
            self._items[seq] = None
            self._memory -= len(data)
            self.spilled_total += 1

    def _write(self, seq: int, data: bytes) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.spool_dir / f"{seq:012d}.json.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.spool_dir / f"{seq:012d}.json")

    def spill_all(self) -> int:
        """Write every pending batch to disk (used when giving up at exit); returns how many."""
        with self._lock:
            self._spill_locked(keep_newest=0)
            return len(self._items)

    def seqs_from(self, first: int) -> list[int]:
        """Pending sequence numbers >= first, in order."""
        with self._lock:
            return [s for s in self._items if s >= first]

    def get(self, seq: int) -> bytes | None:
        """The batch's bytes, from memory or disk; None if it was acked meanwhile."""
        with self._lock:
            if seq not in self._items:
                return None
            data = self._items[seq]
        if data is None:
            return (self.spool_dir / f"{seq:012d}.json").read_bytes()
        return data

    def ack(self, upto: int) -> None:
        """Forget every batch with seq <= upto."""
        with self._lock:
            for seq in [s for s in self._items if s <= upto]:
                data = self._items.pop(seq)
                if data is None:
                    try:
                        (self.spool_dir / f"{seq:012d}.json").unlink()
                    except FileNotFoundError:
                        pass
                else:
                    self._memory -= len(data)

    def first(self) -> int | None:
        with self._lock:
            return next(iter(self._items), None)

    @classmethod
    def load(cls, spool_dir: Path, max_memory_bytes: int = 32 << 20) -> "Outbox":
        """Rebuild an outbox from batches left on disk by an earlier process."""
        box = cls(spool_dir, max_memory_bytes)
        for path in sorted(Path(spool_dir).glob("*.json")):
            if path.stem.isdigit():
                box._items[int(path.stem)] = None
        return box


def write_run_info(spool_dir: Path, run_info: dict) -> None:
    """Keep the run's hello section next to its spilled batches, for ``gradwatch sync``."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    (spool_dir / "run.json").write_text(json.dumps(run_info, default=str))
