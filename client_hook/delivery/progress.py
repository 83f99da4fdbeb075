"""A long delivery (a big run's finish, `gradwatch sync`): the progress line it prints, and when waiting stops."""

from __future__ import annotations

import sys
import time


class Progress:
    """`gradwatch: sending 412,000 steps to the server… 63 %` on stderr, once delivery takes > 2 s."""

    def __init__(self, total: int, unit: str = "steps"):
        self.total, self.unit = max(1, total), unit
        self.shown = 0.0
        self.tty = sys.stderr.isatty()

    def show(self, elapsed: float, pending: int) -> None:
        every = 0.5 if self.tty else 5.0
        if elapsed < 2.0 or (self.shown and elapsed - self.shown < every):
            return
        self.shown = elapsed
        done = 100 * (self.total - pending) // self.total
        line = f"gradwatch: sending {self.total:,} {self.unit} to the server… {max(0, done)} %"
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.shown and self.tty:
            sys.stderr.write("\n")


class Patience:
    """When waiting for acks stops: ``patience`` s without an ack advancing, ``grace`` s unreachable,
    or ``cap`` s in all (None: no cap)."""

    def __init__(self, patience: float, grace: float, cap: float | None, acked: int):
        self.patience, self.grace, self.cap = patience, grace, cap
        self.start = self.last_progress = time.monotonic()
        self.last_acked, self.unreachable_since = acked, None

    def over(self, acked: int, unreachable: bool) -> bool:
        """True once waiting longer is pointless, given the acks so far and whether the server is unreachable."""
        now = time.monotonic()
        if acked != self.last_acked:
            self.last_acked, self.last_progress = acked, now
        self.unreachable_since = (self.unreachable_since or now) if unreachable else None
        return bool(
            (self.unreachable_since and now - self.unreachable_since > self.grace)
            or now - self.last_progress > self.patience
            or (self.cap is not None and now - self.start > self.cap)
        )

    def elapsed(self) -> float:
        return time.monotonic() - self.start
