"""``run.config`` / ``gradwatch.config``: a dict with W&B's attribute access, ``update`` and ``setdefaults``, kept live.

Every change after ``init`` is sent to the server as a ``config`` event (merged into the run's
config there), so the run page and the runs table show what the script set, when it set it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


class Config(dict):
    """The run's hyperparameters: ``config.lr``, ``config["lr"]``, ``config.update({...})``, nested dicts as they are.

    A plain ``dict`` underneath (anything that takes the config as a dict still does); ``on_change``
    gets each change as a dict of the top-level keys it touched.
    """

    def __init__(self, initial: Mapping | None = None, on_change: Callable[[dict], None] | None = None):
        super().__init__(as_mapping(initial))
        object.__setattr__(self, "_on_change", on_change)

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no key {name!r}") from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        del self[name]

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self._changed({key: value})

    def update(self, other=None, allow_val_change: bool | None = None, **kwargs) -> None:
        """Merge keys in (a dict, an ``argparse.Namespace``, or keyword arguments); ``allow_val_change`` is accepted."""
        changes = {**as_mapping(other), **kwargs}
        super().update(changes)
        self._changed(changes)

    def setdefaults(self, other=None, **kwargs) -> None:
        """Set only the keys not set yet (W&B's ``config.setdefaults``)."""
        changes = {k: v for k, v in {**as_mapping(other), **kwargs}.items() if k not in self}
        super().update(changes)
        self._changed(changes)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def as_dict(self) -> dict:
        return dict(self)

    def persist(self) -> None:
        """W&B's explicit save: every change is already sent."""

    def _changed(self, changes: dict) -> None:
        callback = object.__getattribute__(self, "_on_change")
        if changes and callback is not None:
            callback(dict(changes))


def as_mapping(value) -> dict:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if hasattr(value, "__dict__"):  # argparse.Namespace, a simple object of settings
        return {k: v for k, v in vars(value).items() if not k.startswith("_")}
    raise TypeError(f"config takes a dict or an argparse.Namespace, got {type(value).__name__}")
