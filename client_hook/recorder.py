"""The ``Recorder``: what everything that produces data for a run hands it to.

``Run.log`` and the producers that are not the training script (the watchers, ``lr_find``, the
framework callbacks, ``gradwatch import-tb``) all record through ``run.recorder``; it owns the
run's step counter and its step clock (``recorder.clock``), the shape of the items handed to the sender, and the rule that a producer's
failure is reported once and never reaches training.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from gradwatch import protocol
from gradwatch.delivery.sender import Sender
from gradwatch.step_clock import StepClock


class Recorder:
    """One run's seam between the code that measures and the sender that delivers.

    Every ``put_*`` is a deque append on the sender: it never blocks and never raises.

    Args:
        sender: the run's ``Sender``; ``sender.flush`` and ``sender.outbox`` are there for tools and tests.
    """

    def __init__(self, sender: Sender):
        self.sender = sender
        self.finished = False  # the run's finish() began, or a forked child disowned it: log() does nothing
        self._step = 0
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.clock = StepClock(self)  # the optimizer steps everything step-shaped reads (gradwatch.step_clock)

    # -- the step -------------------------------------------------------------------------
    def current_step(self) -> int:
        """The step the next ``log`` without ``step=`` will use (what a capture is recorded at)."""
        return self._step

    def claim_step(self, step: int | None) -> int:
        """The step a ``log`` call records at (the next one when None); later default steps follow it.

        Raises:
            ValueError: ``step`` is not an int from 0 to 2**63-1.
        """
        with self._lock:
            if step is None:
                step = self._step
            elif not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= protocol.MAX_STEP:
                raise ValueError(f"step must be an int from 0 to 2**63-1, got {step!r}")
            self._step = max(self._step, step + 1)
        return step

    # -- what producers hand over ------------------------------------------------------------
    def put_record(self, step: int, scalars: dict, vectors: dict, wall: float | None = None) -> None:
        """Record scalars and vectors at ``step``, stamped ``wall`` (default now; an import keeps the original)."""
        self.sender.put(("rec", step, time.time() if wall is None else wall, scalars, vectors))

    def put_event(self, event: dict) -> None:
        """Record a run event (status, alert, exception)."""
        self.sender.put(("event", event))

    def put_layout(self, key: str, names: list[str]) -> None:
        """Name the entries of vector ``key``; put before the first record that uses it."""
        self.sender.put(("layout", key, names))

    def guarded(self, fn: Callable[[], None]) -> None:
        """Run a hook body; a failure there is reported once and never reaches training."""
        try:
            fn()
        except Exception as exc:
            self.warn_once(f"hook:{type(exc).__name__}", f"gradwatch: gradient capture failed: {exc!r}")

    def warn_once(self, tag: str, message: str) -> None:
        """Print ``message`` on stderr the first time ``tag`` comes up."""
        if tag not in self._warned:
            self._warned.add(tag)
            print(message, file=sys.stderr)

    # -- delivery ---------------------------------------------------------------------------
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything recorded so far is acked by the server; True on success."""
        return self.sender.flush(timeout)

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until everything recorded so far is acked, or on disk while the server is away (``Run.flush``)."""
        return self.sender.settle(timeout)

    def disown(self) -> None:
        """In a forked child: never send, finish or spill the parent's run."""
        self.finished = True
        self.sender.closed_for_puts = True
        self.sender.outbox.forget_lock()
