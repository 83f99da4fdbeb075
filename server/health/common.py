"""What every health rule shares: the Alert and Observation records, episodes with hysteresis, formatting."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gradwatch.contract import keys

GLOBAL = keys.GLOBAL_NORM  # the scalar key of the global gradient norm
GRAD_VECTOR = keys.GRAD_VECTOR  # the vector key of the per-layer gradient norms


@dataclass
class Alert:
    """One problem. ``step`` is the first bad step (onset); ``confirmed_step`` where the rule became sure."""

    kind: str
    step: int | None
    value: float | None
    severity: str
    message: str
    layer: str | None = None
    key: str | None = None
    confirmed_step: int | None = None
    update: int = 0  # > 0: not a new alert but this many more bad checks of an open episode (count, last step, worst)

    def __post_init__(self):
        if self.confirmed_step is None:
            self.confirmed_step = self.step


@dataclass
class Observation:
    """One record as the rules see it: scalars by key, per-layer gradient norms by name."""

    step: int
    scalars: dict
    layers: list = field(default_factory=list)  # parameter names, input to output
    norms: list = field(default_factory=list)  # float, or None when .grad was None


def has_grads(obs: Observation) -> bool:
    """Whether the record carries gradient information (the records the gradient rules look at)."""
    return GLOBAL in obs.scalars or bool(obs.norms)


def episode(state: dict, bad: bool, cooldown: float) -> bool:
    """Advance an episode by one check; True when a new one opens (the moment to alert).

    An open episode ends only after ``cooldown`` healthy checks in a row, so a problem that
    dips back to normal for a step or two is still the same problem, not a new alert.
    """
    if bad:
        state["healthy"] = 0
        if state.get("open"):
            return False
        state["open"] = True
        return True
    if state.get("open"):
        state["healthy"] = state.get("healthy", 0) + 1
        if state["healthy"] >= cooldown:
            state["open"] = False
    return False


def going_on(state: dict, bad: bool, opened: bool) -> bool:
    """Whether this check is one more bad step of an episode already open (the alert follows it)."""
    return bad and not opened and bool(state.get("open"))


def healthy_run(state: dict, n: int, cooldown: float) -> None:
    """``n`` healthy checks at once: the same state as ``n`` calls of ``episode(state, False, ...)``."""
    if n > 0 and state.get("open"):
        state["healthy"] = min(state.get("healthy", 0) + n, int(math.ceil(cooldown)))
        if state["healthy"] >= cooldown:
            state["open"] = False


def fmt(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return f"{x:.4g}"


def names(items: list, limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")
