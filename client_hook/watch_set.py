"""The models a run watches: ``run.watch()`` called again adds one (it never replaces another).

The first model keeps its parameter names; every later one, and each of ``watch([netD, netG], [optD, optG])``,
is named (``name=`` or its index) and its layers are ``<name>.<parameter>`` in the run's one layout. The
run-wide parts (update ratios and output RMS, the step timer, the machine's counters) follow the first
model that has them; watching the same model again replaces its watcher.
"""

from __future__ import annotations


def pairs(model, optimizer, name) -> list[tuple]:
    """[(model, optimizer, name)] from one model or from lists of them (optimizers and names by position)."""
    if not isinstance(model, (list, tuple)):
        return [(model, optimizer, name)]
    models = list(model)
    opts = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer] * len(models)
    names = list(name) if isinstance(name, (list, tuple)) else [None] * len(models)
    if len(opts) != len(models) or len(names) != len(models):
        raise ValueError(f"watch() got {len(models)} models, {len(opts)} optimizers and {len(names)} names")
    return [(m, o, n if n is not None else str(i)) for i, (m, o, n) in enumerate(zip(models, opts, names))]


class WatchSet:
    """A run's watchers, one per model.

    Args:
        recorder: the run's ``Recorder``.
    """

    def __init__(self, recorder):
        self.recorder = recorder
        self.watchers: list = []

    def add(self, model, optimizer, name: str | None, options: dict):
        """Watch ``model`` (replacing a watcher of the same model); returns the new ``Watcher``."""
        from gradwatch.watcher import Watcher

        for old in [w for w in self.watchers if w.model is model]:
            old.remove()
            self.watchers.remove(old)
            name = name if name is not None else (old.label or None)
        if name is None and self.watchers:
            name = str(len(self.watchers))
        options = dict(options)
        if any(w.signals is not None for w in self.watchers):
            options["signals"] = False  # the layer signals follow one model per run
        if any(w.system is not None for w in self.watchers):
            options["system_every"] = None
        timer = not any(w.timer for w in self.watchers)
        watcher = Watcher(self.recorder, model, optimizer, name=name, timer=timer, **options)
        self.watchers.append(watcher)
        return watcher

    def first(self):
        """The first watcher (its memory counters describe the process), or None."""
        return self.watchers[0] if self.watchers else None

    def remove_all(self) -> None:
        """Detach every watcher's hooks."""
        for watcher in self.watchers:
            watcher.remove()
        self.watchers.clear()
