"""gradwatch: stream a PyTorch training run to a live dashboard.

    import gradwatch
    run = gradwatch.init(project="mnist", name="baseline", config={"lr": 1e-3})
    run.watch(model, optimizer)
    for batch in loader:
        ...; loss.backward(); optimizer.step()
        run.log({"loss": loss})
    run.finish()

This package imports neither torch (until ``watch``) nor any server dependency.
"""

from __future__ import annotations

from typing import Any, Mapping

from .protocol import PROTOCOL_VERSION
from .run import Run, TrainingDiverged

__version__ = "0.1.0"
__all__ = ["init", "watch", "log", "finish", "Run", "TrainingDiverged", "PROTOCOL_VERSION", "run"]

run: Run | None = None


def init(project: str = "default", name: str | None = None, config: Mapping | None = None, **kwargs) -> Run:
    """Start a run and make it the current one for ``gradwatch.log/watch/finish``.

    Args:
        project, name, config: see ``Run``.
        **kwargs: server, alerts, on_nan, tags, flush_interval (see ``Run``).

    Returns:
        The new ``Run``; also usable as a context manager.
    """
    global run
    run = Run(project, name, config, **kwargs)
    return run


def _current() -> Run | None:
    if run is None or run._finished:
        return None
    return run


def log(data: Mapping[str, Any], step: int | None = None) -> None:
    """Log to the current run (see ``Run.log``); does nothing before ``init``."""
    current = _current()
    if current is not None:
        current.log(data, step=step)


def watch(model, optimizer=None, scaler=None) -> Run | None:
    """Watch a model in the current run (see ``Run.watch``)."""
    current = _current()
    return current.watch(model, optimizer, scaler) if current is not None else None


def finish(status: str = "finished", timeout: float = 30.0) -> None:
    """Finish the current run (see ``Run.finish``)."""
    current = _current()
    if current is not None:
        current.finish(status, timeout)
