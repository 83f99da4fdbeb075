"""Batches waiting for the server's ack: bounded memory, the overflow spilled to disk."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

from gradwatch import protocol
from gradwatch.contract import OUTBOX_MEMORY_BYTES
from gradwatch.delivery import spool
from gradwatch.delivery.gaps import gap_alert

# After a failed write (disk full, quota, file size limit) the disk is left alone this long, so a
# full disk costs one failed write a second, never a loop of them.
DISK_RETRY_S = 1.0


class Outbox:
    """Encoded batches by sequence number, oldest first, until the server acks them.

    At most ``max_memory_bytes`` stay in memory; older batches are written to ``spool_dir``
    (one file per batch) and read back when it is their turn to be sent, so a long outage
    costs disk, never points. When the disk refuses writes too, ``full()`` turns True and
    the caller stops adding (and counts what it could not keep) instead of growing.
    """

    def __init__(
        self,
        spool_dir: Path,
        max_memory_bytes: int = OUTBOX_MEMORY_BYTES,
        run_info: dict | None = None,
        *,
        resume: bool = False,
    ):
        self.spool_dir = Path(spool_dir)
        self.max_memory_bytes = max_memory_bytes
        self.run_info = run_info  # written to run.json when the first batch goes to disk
        self._items: OrderedDict[int, bytes | None] = OrderedDict()
        self._records: dict[int, int] = {}  # seq -> records in it (0 when unknown: loaded from disk)
        self._memory = 0
        self._lock = threading.Lock()
        self._dir_lock = spool.Lock(self.spool_dir)
        self._disk_ready = False
        self._disk_failed_at = -1e9
        self.disk_error: str | None = None  # the last write failure, for the user
        self.spilled_total = 0
        self.pending_records = 0
        if resume:  # batches an earlier process left on disk: they are sent from there
            self._disk_ready = True
            for path in spool.batch_files(self.spool_dir):
                self._items[int(path.stem)] = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def add(self, seq: int, data: bytes, records: int = 0) -> None:
        """Keep batch ``seq``; spills the oldest in-memory batches when over budget."""
        with self._lock:
            self._items[seq] = data
            self._records[seq] = records
            self.pending_records += records
            self._memory += len(data)
            if self._memory > self.max_memory_bytes:
                self._spill_locked(keep_newest=1)

    def full(self) -> bool:
        """True while memory is over budget because the disk refuses writes: stop adding."""
        return self._memory > self.max_memory_bytes and self.disk_error is not None

    def _spill_locked(self, keep_newest: int) -> None:
        if time.monotonic() - self._disk_failed_at < DISK_RETRY_S:
            return
        in_memory = [s for s, d in self._items.items() if d is not None]
        for seq in in_memory[: max(0, len(in_memory) - keep_newest)]:
            if self._memory <= self.max_memory_bytes // 2 and keep_newest:
                break
            data = self._items[seq]
            try:
                self._write(seq, data)
            except OSError as exc:  # disk full, quota, RLIMIT_FSIZE: keep it in memory, try later
                self.disk_error = f"{exc.strerror or exc} ({self.spool_dir})"
                self._disk_failed_at = time.monotonic()
                return
            self.disk_error = None
            self._items[seq] = None
            self._memory -= len(data)
            self.spilled_total += 1

    def _write(self, seq: int, data: bytes) -> None:
        self._prepare_dir()
        tmp = self.spool_dir / f"{seq:012d}.json.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
        except OSError:
            _unlink(tmp)  # a half-written file only takes space away
            raise
        os.replace(tmp, self.spool_dir / f"{seq:012d}.json")

    def _prepare_dir(self) -> None:
        """Create the spool (locked, with run.json) before its first batch file."""
        if self._disk_ready:
            return
        self.spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # run.json holds the run's secret
        self._dir_lock.acquire()
        if self.run_info is not None:
            spool.write_run_info(self.spool_dir, self.run_info)
        self._disk_ready = True

    def spill_all(self) -> tuple[int, int]:
        """Write every pending batch to disk (at exit); returns (batches kept on disk, batches lost)."""
        with self._lock:
            self._disk_failed_at = -1e9
            self._spill_locked(keep_newest=0)
            lost = [s for s, d in self._items.items() if d is not None]
            return len(self._items) - len(lost), len(lost)

    def seqs_from(self, first: int) -> list[int]:
        """Pending sequence numbers >= first, in order."""
        with self._lock:
            return [s for s in self._items if s >= first]

    def next_after(self, seq: int) -> int | None:
        """The first pending seq > ``seq`` (cheap for the usual case of consecutive seqs)."""
        with self._lock:
            if seq + 1 in self._items:
                return seq + 1
            return next((s for s in self._items if s > seq), None)

    def get(self, seq: int) -> bytes | None:
        """The batch's bytes, from memory or disk; None if it was acked meanwhile."""
        with self._lock:
            if seq not in self._items:
                return None
            data = self._items[seq]
        if data is not None:
            return data
        try:
            return (self.spool_dir / f"{seq:012d}.json").read_bytes()
        except OSError as exc:  # the file is gone or unreadable: keep the numbering, say what was lost
            alert = gap_alert(self._records.get(seq, 0), None, None, f"spool file unreadable: {exc.strerror}")
            return protocol.dumps(protocol.batch(seq, [], events=[alert])).encode()

    def ack(self, upto: int) -> int:
        """Forget every batch with seq <= upto; returns how many records that acked."""
        done = 0
        with self._lock:
            while self._items:
                seq = next(iter(self._items))
                if seq > upto:
                    break
                data = self._items.pop(seq)
                done += self._records.pop(seq, 0)
                if data is None:
                    _unlink(self.spool_dir / f"{seq:012d}.json")
                else:
                    self._memory -= len(data)
            self.pending_records -= done
        return done

    def first(self) -> int | None:
        with self._lock:
            return next(iter(self._items), None)

    def last(self) -> int | None:
        with self._lock:
            return next(reversed(self._items), None) if self._items else None

    def discard(self) -> None:
        """Drop everything, on disk too (the run was deleted on the server)."""
        with self._lock:
            self._items.clear()
            self._records.clear()
            self._memory = self.pending_records = 0
        self.close()
        spool.remove(self.spool_dir)

    def close(self) -> None:
        """Release the spool; remove it when nothing is left in it to deliver."""
        if self._disk_ready and not len(self):
            spool.remove(self.spool_dir)
        self._dir_lock.release()

    def forget_lock(self) -> None:
        self._dir_lock.forget()

    @classmethod
    def load(cls, spool_dir: Path, max_memory_bytes: int = OUTBOX_MEMORY_BYTES) -> Outbox:
        """Rebuild an outbox from batches left on disk by an earlier process (the caller locks it)."""
        return cls(spool_dir, max_memory_bytes, resume=True)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
