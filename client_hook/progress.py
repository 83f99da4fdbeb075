"""The progress line a long delivery prints (a big run's finish, `gradwatch sync`)."""

from __future__ import annotations

import sys


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
