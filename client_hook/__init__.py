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

import dataclasses
import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

from gradwatch.compat import init_args, stubs
from gradwatch.compat.config import Config, as_mapping
from gradwatch.compat.disabled import DisabledRun
from gradwatch.compat.stubs import Artifact, log_artifact, log_code, restore, save, use_artifact
from gradwatch.compat.summary import Summary
from gradwatch.contract import VERSION as _VERSION
from gradwatch.integrations.distributed import NoopRun
from gradwatch.media import Histogram, Image, Table
from gradwatch.protocol import PROTOCOL_VERSION
from gradwatch.run import Run, RunOptions, TrainingDiverged

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
    # W&B's surface (docs/wandb.md)
    "config",
    "summary",
    "define_metric",
    "alert",
    "Histogram",
    "Image",
    "Table",
    "Artifact",
    "save",
    "restore",
    "log_code",
    "use_artifact",
    "log_artifact",
    "unwatch",
]

run: Run | NoopRun | DisabledRun | None = None
config: Config = Config()  # the current run's config (W&B's wandb.config); before init, a placeholder
summary: Summary = Summary()  # the current run's summary (W&B's wandb.summary)
RUN_OPTIONS = frozenset(f.name for f in dataclasses.fields(RunOptions))

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
    project: str | None = "default",
    name: str | None = None,
    config: Mapping | None = None,
    *,
    all_ranks: bool = False,
    mode: str | None = None,
    **kwargs,
) -> Run | NoopRun | DisabledRun:
    """Start a run and make it the current one for ``gradwatch.log/watch/finish``.

    Args:
        project, name, config: see ``Run`` (``config`` may also be an ``argparse.Namespace``).
        all_ranks: in a torch.distributed job, stream every rank (one grouped run per rank)
            instead of rank 0 only (docs/integrations/distributed.md).
        mode: "online" (default), "offline" (spooled on disk for ``gradwatch sync``) or "disabled"
            (nothing at all, cheaply); default $GRADWATCH_MODE, else $WANDB_MODE.
        **kwargs: server, alerts, on_nan, tags, flush_interval (see ``Run``); W&B's group, job_type,
            entity, notes (kept with the run) and its other arguments (ignored, one warning line):
            docs/wandb.md.

    Returns:
        The new ``Run`` (a ``NoopRun`` that never connects on ranks other than 0 unless
        ``all_ranks``; a ``DisabledRun`` when disabled); also usable as a context manager.
    """
    global run
    from gradwatch.integrations.distributed import rank_and_world

    chosen = init_args.mode_of(mode)
    options, meta, ignored = init_args.split(kwargs, RUN_OPTIONS)
    init_args.warn_ignored(ignored)
    project, config = project or "default", as_mapping(config)
    rank, world = rank_and_world()
    if chosen == "disabled":
        run = DisabledRun(project, name, config)
    elif world > 1 and rank != 0 and not all_ranks:
        run = NoopRun(project, name, config, rank=rank, world_size=world)
    else:
        meta = {("run_group" if k == "group" else k): v for k, v in meta.items()}
        run = Run(project, name, config, all_ranks=all_ranks, meta=meta, offline=chosen == "offline", **options)
    _set_module_state(run)
    return run


def _set_module_state(current) -> None:
    """``gradwatch.config`` and ``gradwatch.summary`` follow the current run (W&B's module attributes)."""
    globals()["config"] = current.config if isinstance(current.config, Config) else Config(current.config)
    held = getattr(current, "summary", None)  # (an empty Summary is falsy: compare with None)
    globals()["summary"] = held if held is not None else Summary()


def lr_find(model, optimizer, loader, loss_fn, **kwargs):
    """LR range test streamed as its own run (see ``gradwatch.integrations.lr_range.lr_find``)."""
    from gradwatch.integrations.lr_range import lr_find as _lr_find

    return _lr_find(model, optimizer, loader, loss_fn, **kwargs)


def _current() -> Run | None:
    if run is None or run.finished:
        return None
    return run


def log(data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
    """Log to the current run (see ``Run.log``); does nothing before ``init``.

    In a worker process of the script (``multiprocessing``, fork or spawn) it records nothing and says so
    once on stderr, with what to do instead.
    """
    current = _current()
    if current is not None:
        if commit is None:
            current.log(data, step=step)
        elif isinstance(current, (Run, DisabledRun)):
            current.log(data, step=step, commit=commit)
    elif isinstance(run, Run) and run.forked:
        run.log(data, step=step)  # a forked worker's copy of the parent's run: it says so
    elif run is None:
        from gradwatch import signals

        if signals.in_worker():
            signals.say_not_in_worker()


def watch(model, optimizer=None, scaler=None, **kwargs) -> Run | None:
    """Watch a model in the current run (see ``Run.watch``; W&B's ``log=``, ``log_freq=`` too)."""
    current = _current()
    if current is None:
        return None
    return current.watch(model, optimizer, scaler, **kwargs) if isinstance(current, Run) else current.watch(model)


def define_metric(name: str, step_metric: str | None = None, summary: str | None = None, **kwargs) -> dict:
    """How a metric is shown (see ``Run.define_metric``); does nothing before ``init``."""
    current = _current()
    if isinstance(current, Run):
        return current.define_metric(name, step_metric=step_metric, summary=summary, **kwargs)
    return {}


def alert(title: str, text: str = "", level: str = "INFO", wait_duration=None) -> None:
    """An alert on the current run (see ``Run.alert``)."""
    current = _current()
    if isinstance(current, Run):
        current.alert(title, text, level, wait_duration)


def unwatch(*_args) -> None:
    stubs.say_once("unwatch", "does nothing: gradwatch stops watching at finish()")


def flush(timeout: float = 10.0) -> bool:
    """Wait until what the current run logged so far is acknowledged (see ``Run.flush``); True before ``init``."""
    current = _current()
    return current.flush(timeout) if current is not None else True


def finish(status: str = "finished", timeout: float = 30.0, exit_code: int | None = None, quiet=None) -> None:
    """Finish the current run (see ``Run.finish``; W&B's ``exit_code``: non-zero marks it failed)."""
    current = _current()
    if current is not None:
        if exit_code is not None:
            status = "failed" if exit_code else "finished"
        current.finish(status, timeout)
