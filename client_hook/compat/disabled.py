"""``mode="disabled"`` (or ``GRADWATCH_MODE=disabled``): a run that does nothing, cheaply, with no network and no files."""

from __future__ import annotations

from gradwatch.compat.config import Config
from gradwatch.compat.summary import Summary


def _nothing(*_args, **_kwargs) -> None:
    return None


class DisabledRun:
    """Every ``Run`` (and W&B run) method, doing nothing; ``config`` and ``summary`` still hold what is set."""

    id = None
    uid = None
    url = ""
    should_stop = False
    diverged = None
    recorder = None  # producers (watchers, callbacks) skip a run without one
    disabled = True
    mode = "disabled"

    def __init__(self, project: str = "default", name: str | None = None, config=None, **_ignored):
        self.project, self.name = str(project), name or "disabled"
        self.config = Config(config if config is not None else {})
        self.summary = Summary()
        self.finished = False
        self.step = 0

    def log(self, data=None, step: int | None = None, commit: bool | None = None, **_kwargs) -> None:
        if commit is not False:
            self.step = max(self.step, (step if step is not None else self.step) + 1)

    def watch(self, *_args, **_kwargs) -> DisabledRun:
        return self

    def define_metric(self, *_args, **_kwargs) -> dict:
        return {}

    def finish(self, *_args, **_kwargs) -> None:
        self.finished = True

    def flush(self, *_args, **_kwargs) -> bool:
        return True

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _nothing  # alert, save, log_artifact, use_artifact, record_exception...

    def __enter__(self) -> DisabledRun:
        return self

    def __exit__(self, *exc) -> None:
        self.finish()
