"""Process lifecycle of runs: normal exit, uncaught exceptions, SIGTERM, Ctrl-C and fork.

Every way out of a training process keeps what was logged (delivered or spooled) and then
ends the process exactly as it would have ended without gradwatch: the previous SIGTERM
handler runs, or the signal's default action kills the process; exceptions propagate.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading

# How long an interrupted process (SIGTERM, Ctrl-C) may spend delivering before it spools the rest.
INTERRUPT_BUDGET_S = 4.0

_live: list = []
_installed = False


def track(run) -> None:
    """Finish ``run`` at exit / on SIGTERM / on an uncaught exception, unless finished before."""
    global _installed
    _live.append(run)
    if not _installed:
        _installed = True
        _install_excepthook()
        atexit.register(finish_all)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        _install_sigterm()


def untrack(run) -> None:
    if run in _live:
        _live.remove(run)


def finish_all(status: str = "finished", budget: float | None = None) -> None:
    """Finish every live run (at exit, or with a time budget when interrupted)."""
    for run in list(_live):
        run.finish(status, timeout=10.0, _budget=budget)


def _install_excepthook() -> None:
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        interrupted = issubclass(exc_type, KeyboardInterrupt)
        for run in list(_live):
            if not interrupted:
                run.record_exception(exc)
            run.finish("failed", _budget=INTERRUPT_BUDGET_S if interrupted else None)
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook


def _install_sigterm() -> None:
    """Catch SIGTERM (SLURM, Kubernetes, systemd) unless it is ignored or owned by non-Python code."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_IGN, None):
        return

    def on_sigterm(signum, frame):
        with blocked():  # a second SIGTERM while spooling must not cut the spool short
            finish_all("failed", budget=INTERRUPT_BUDGET_S)
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)  # then die of it, as without gradwatch
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_sigterm)


@contextlib.contextmanager
def blocked():
    """Hold SIGINT and SIGTERM back (on the main thread) while the spool is written."""
    mask = {signal.SIGINT, signal.SIGTERM}
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, mask)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


WORKER_NOTICE = (
    "gradwatch: log() in a worker process (pid {pid}) of the process that started the run: nothing is "
    "recorded from here. Log from the process that called gradwatch.init() (send the workers' numbers back, "
    "e.g. through a multiprocessing.Queue), or start one run per worker inside it with "
    "gradwatch.init(..., name=f'worker {{rank}}', tags=[...]) to see every worker. (Said once.)"
)
_told: list = []


def say_not_in_worker() -> None:
    """Say once, on stderr, that a worker process's log() records nothing, and what to do instead."""
    if os.getpid() not in _told:
        _told.append(os.getpid())
        print(WORKER_NOTICE.format(pid=os.getpid()), file=sys.stderr, flush=True)


def in_worker() -> bool:
    """Whether this is a multiprocessing child (spawn or fork) rather than the process the script started."""
    import multiprocessing

    return multiprocessing.parent_process() is not None


def _after_fork_in_child() -> None:
    """A forked child (DataLoader worker, multiprocessing) must never send, finish or spill the parent's run."""
    for run in list(_live):
        run.recorder.disown()
    _live.clear()
