"""Every process the suite starts lives in a process group of its own and ends with its group: the
ones a test's code starts when that test returns or fails, every other one when pytest exits."""

from __future__ import annotations

import atexit
import contextlib
import inspect
import os
import signal
import subprocess

TESTS = os.path.dirname(os.path.abspath(__file__))
_popen_init = subprocess.Popen.__init__
_started: list[subprocess.Popen] = []  # by the suite's code, ended at exit at the latest
_by_test: list[subprocess.Popen] | None = None  # by the running test's own code, ended after it
_refuse = None  # set while a unit test runs: it may start no process of its own


def _from_tests() -> bool:
    """Whether the code asking for this process is the suite's (the code under test may run tools)."""
    frame = inspect.currentframe()
    while frame and frame.f_code.co_filename in (subprocess.__file__, __file__):
        frame = frame.f_back
    return bool(frame) and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == TESTS


def _popen(self, *args, **kwargs):
    if not _from_tests():
        return _popen_init(self, *args, **kwargs)
    if _refuse is not None:
        _refuse()
    kwargs.setdefault("start_new_session", True)  # its group can be killed without touching pytest's
    _popen_init(self, *args, **kwargs)
    _started.append(self)
    if _by_test is not None:
        _by_test.append(self)


def end(proc: subprocess.Popen) -> None:
    """Kill a process and everything in its group (idempotent), reap it and close its pipes."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe:
            pipe.close()


def _end_all() -> None:
    for proc in _started:
        if proc.returncode is None or proc.poll() is None:
            end(proc)


def install() -> None:
    """Route the suite's subprocess calls through here (pytest_configure calls it once)."""
    subprocess.Popen.__init__ = _popen
    atexit.register(_end_all)


@contextlib.contextmanager
def owned_by_test():
    """Processes the test's code starts inside the block end with it, whatever happened."""
    global _by_test
    _by_test = []
    try:
        yield
    finally:
        mine, _by_test = _by_test, None
        for proc in mine:
            end(proc)


@contextlib.contextmanager
def refused(refuse):
    """While the block runs, a process started by the suite's code calls ``refuse`` instead."""
    global _refuse
    _refuse = refuse
    try:
        yield
    finally:
        _refuse = None
