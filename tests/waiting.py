"""The suite's one wait helper: poll an observable condition instead of sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 15.0, interval: float = 0.02, message: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Args:
        predicate: called with no arguments; a truthy result ends the wait.
        timeout: seconds before giving up (generous: the suite runs on busy machines).
        interval: seconds between two calls.
        message: what was awaited, for the error (a callable is called for it at the end).

    Returns:
        The predicate's first truthy result.

    Raises:
        AssertionError: the predicate stayed falsy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"after {timeout:g} s: {text or 'condition never held'}")
        time.sleep(interval)
