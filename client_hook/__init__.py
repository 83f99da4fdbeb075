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

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

from gradwatch.contract import VERSION as _VERSION
from gradwatch.integrations.distributed import NoopRun
from gradwatch.protocol import PROTOCOL_VERSION
from gradwatch.run import Run, TrainingDiverged

__version__ = _VERSION
__all__ = [
    "Api",
    "init",
    "watch",
    "log",
    "finish",
    "flush",
    "lr_find",
    "Run",
    "NoopRun",
    "TrainingDiverged",
    "PROTOCOL_VERSION",
    "run",
]

run: Run | NoopRun | None = None

# The integrations live in gradwatch.integrations; their old names import the same module objects.
ALIASES = {
    f"gradwatch.{name}": f"gradwatch.integrations.{name}"
    for name in ("lightning", "transformers", "distributed", "lr_range")
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import gradwatch.lightning`` gives ``gradwatch.integrations.lightning`` itself (loaded only then)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in ALIASES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(ALIASES[spec.name])

    def exec_module(self, module):
        """Already executed under its real name."""


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())


def __getattr__(name: str):
    """``gradwatch.Api`` on first use: reading runs back is rare in a training job, so its HTTP modules load late."""
    if name == "Api":
        from gradwatch.api import Api

        return Api
    raise AttributeError(f"module 'gradwatch' has no attribute {name!r}")


def init(
    project: str = "default",
    name: str | None = None,
    config: Mapping | None = None,
    *,
    all_ranks: bool = False,
    **kwargs,
) -> Run | NoopRun:
    """Start a run and make it the current one for ``gradwatch.log/watch/finish``.

    Args:
        project, name, config: see ``Run``.
        all_ranks: in a torch.distributed job, stream every rank (one grouped run per rank)
            instead of rank 0 only (docs/integrations/distributed.md).
        **kwargs: server, alerts, on_nan, tags, flush_interval (see ``Run``).

    Returns:
        The new ``Run`` (a ``NoopRun`` that never connects on ranks other than 0 unless
        ``all_ranks``); also usable as a context manager.
    """
    global run
    from gradwatch.integrations.distributed import rank_and_world

    rank, world = rank_and_world()
    if world > 1 and rank != 0 and not all_ranks:
        run = NoopRun(project, name, config, rank=rank, world_size=world)
    else:
        run = Run(project, name, config, all_ranks=all_ranks, **kwargs)
    return run


def lr_find(model, optimizer, loader, loss_fn, **kwargs):
    """LR range test streamed as its own run (see ``gradwatch.integrations.lr_range.lr_find``)."""
    from gradwatch.integrations.lr_range import lr_find as _lr_find

    return _lr_find(model, optimizer, loader, loss_fn, **kwargs)


def _current() -> Run | None:
    if run is None or run.finished:
        return None
    return run


def log(data: Mapping[str, Any], step: int | None = None) -> None:
    """Log to the current run (see ``Run.log``); does nothing before ``init``.

    In a worker process of the script (``multiprocessing``, fork or spawn) it records nothing and says so
    once on stderr, with what to do instead.
    """
    current = _current()
    if current is not None:
        current.log(data, step=step)
    elif isinstance(run, Run) and run.forked:
        run.log(data, step=step)  # a forked worker's copy of the parent's run: it says so
    elif run is None:
        from gradwatch import signals

        if signals.in_worker():
            signals.say_not_in_worker()


def watch(model, optimizer=None, scaler=None) -> Run | None:
    """Watch a model in the current run (see ``Run.watch``)."""
    current = _current()
    return current.watch(model, optimizer, scaler) if current is not None else None


def flush(timeout: float = 10.0) -> bool:
    """Wait until what the current run logged so far is acknowledged (see ``Run.flush``); True before ``init``."""
    current = _current()
    return current.flush(timeout) if current is not None else True


def finish(status: str = "finished", timeout: float = 30.0) -> None:
    """Finish the current run (see ``Run.finish``)."""
    current = _current()
    if current is not None:
        current.finish(status, timeout)
