"""Time spent inside a torch DataLoader's ``next()``: the data-loader wait the throughput rule may name.

The step timer's ``perf/data_wait`` is everything between an optimizer step and the next forward (a
``time.sleep`` of the script's own counts too), so it cannot say "the loader". This wraps
``_BaseDataLoaderIter.__next__`` once per process and records ``perf/loader_wait`` (seconds of that
fetch) at the attached runs' current step; with no run attached the wrapper only passes through.
"""

from __future__ import annotations

import threading
import time

from gradwatch.capture.step_timer import microseconds
from gradwatch.contract.keys import LOADER_WAIT

_recorders: list = []  # the runs that record fetch times (a process may hold several)
_lock = threading.Lock()
_installed = False


def attach(recorder) -> None:
    """Record this run's DataLoader fetch times from now on (installs the wrapper on first use)."""
    with _lock:
        if recorder not in _recorders:
            _recorders.append(recorder)
        _install()


def detach(recorder) -> None:
    """Stop recording for this run."""
    with _lock:
        if recorder in _recorders:
            _recorders.remove(recorder)


def _install() -> None:
    global _installed
    if _installed:
        return
    try:
        from torch.utils.data import dataloader
    except Exception:  # no torch: nothing to time
        return
    cls = dataloader._BaseDataLoaderIter
    original = cls.__next__

    def timed_next(self):
        if not _recorders:
            return original(self)
        start = time.perf_counter()
        try:
            return original(self)
        finally:
            _record(microseconds(time.perf_counter() - start))

    cls.__next__ = timed_next
    _installed = True


def _record(seconds: float) -> None:
    for rec in list(_recorders):
        if not getattr(rec, "finished", False):
            rec.guarded(lambda r=rec: r.put_record(r.current_step(), {LOADER_WAIT: seconds}, {}))
