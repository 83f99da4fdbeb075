"""``run.summary`` / ``gradwatch.summary``: values a script sets for the run as a whole (best accuracy, final loss).

Each change is sent as a ``summary`` event; the server keeps them beside the automatic summaries
(last/min/max of every key), shows them on the run page and the runs table, and the runs language
reads them as ``summary.<key>``.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping


class Summary(MutableMapping):
    """Dict-like: ``summary["best"] = 0.93``, ``summary.update({...})``, ``del summary["x"]``, ``summary.best``."""

    def __init__(self, on_change: Callable[[dict, list], None] | None = None):
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_on_change", on_change)

    def __getitem__(self, key):
        return self._values[key]

    def __setitem__(self, key, value) -> None:
        self.update({key: value})

    def __delitem__(self, key) -> None:
        del self._values[key]
        if self._on_change is not None:
            self._on_change({}, [key])

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str):
        try:
            return object.__getattribute__(self, "_values")[name]
        except KeyError:
            raise AttributeError(f"summary has no key {name!r}") from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value

    def update(self, other=(), **kwargs) -> None:  # one event for the lot
        changes = {str(k): _plain(v) for k, v in {**dict(other), **kwargs}.items()}
        self._values.update(changes)
        if changes and self._on_change is not None:
            self._on_change(changes, [])

    def __repr__(self) -> str:
        return f"Summary({self._values!r})"


def _plain(value):
    """A summary value as JSON can hold it: a tensor or numpy scalar becomes a number (read once, off the hot path)."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return value.item()
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    return value
