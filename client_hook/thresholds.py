"""Health-rule thresholds: the defaults and their validation, shared by the client and the server.

The training side checks ``init(alerts=...)`` with ``validate`` so a typo fails at once, in the
user's script, instead of being silently ignored by the server. The server reads ``DEFAULTS``
from here (one owner); each health rule takes its own with ``of(kind)``. Pure Python: no torch or numpy import.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

DEFAULTS: dict[str, float] = {
    "nan_loss.cooldown": 10,  # finite-loss steps that end a NaN episode
    "loss_spike.factor": 10.0,  # robust z-score (median / MAD) over the window
    "loss_spike.window": 100,
    "loss_spike.min_history": 20,
    "loss_spike.cooldown": 20,  # steps back in range before a new spike episode
    "loss_spike.min_delta": 1e-4,  # absolute floor: a rise smaller than this over the median is never a spike
    "loss_divergence.factor": 10.0,  # x above the run's first loss and its recent median
    "loss_divergence.window": 10,  # recent values whose median is the short-term reference
    "loss_divergence.cooldown": 20,  # steps back under factor x the first loss to end it
    "loss_plateau.patience": 200,  # finite values of a loss after which it must have fallen
    "loss_plateau.ratio": 0.99,  # ... below this x its start (medians of its first and latest values)
    "nonfinite_gradients.cooldown": 10,  # finite-gradient steps that end an episode
    "exploding_gradients.ceiling": 1000.0,  # absolute global-norm warning level
    "exploding_gradients.factor": 100.0,  # x over the rolling median of the run's own norms
    "exploding_gradients.early_factor": 1000.0,  # x over the median of the first steps, before min_history
    "exploding_gradients.window": 50,
    "exploding_gradients.min_history": 10,
    "exploding_gradients.cooldown": 20,  # healthy steps in a row that end an episode
    "exploding_gradients.min_norm": 0.1,  # absolute floor: a global norm below this is never relatively exploding
    "vanishing_gradients.ratio": 1e-3,  # early-layer / late-layer norm ratio
    "vanishing_gradients.patience": 20,  # consecutive steps below the ratio
    "vanishing_gradients.cooldown": 20,
    "zero_gradients.patience": 20,  # consecutive steps with an exactly-zero gradient
    "zero_gradients.cooldown": 10,
    "missing_gradients.patience": 5,  # consecutive steps with .grad None
    "missing_gradients.cooldown": 5,
    "memory_pressure.fraction": 0.95,  # CUDA reserved / device total
    "memory_pressure.cooldown": 20,
    "amp_overflow.skips": 5,  # skipped AMP steps ...
    "amp_overflow.window": 100,  # ... within this many scaler updates
    "instability_warning.level": 0.1,  # median update/weight ratio (largest matrix) of the last 10 steps ...
    "instability_warning.factor": 1.5,  # ... and that many x its median over the baseline window
    "instability_warning.window": 100,  # baseline: this many steps, ending window/2 steps ago
    "instability_warning.min_history": 60,  # update ratios seen before the rule may warn
    "instability_warning.cooldown": 50,  # quiet steps that end a warning episode
    "throughput_drop.fraction": 0.3,  # throughput this far below the run's median (step time >= median / 0.7) ...
    "throughput_drop.patience": 20,  # ... as the median of this many steps
    "throughput_drop.window": 200,  # the run's median step time over this many healthy steps
    "throughput_drop.min_history": 50,  # step times seen before the rule may alert
    "throughput_drop.cooldown": 50,  # normal-pace steps that end an episode
    "throughput_drop.min_delta": 0.01,  # seconds: a slowdown smaller than this per step is never a drop
}

MAX_WINDOW = 1000  # most steps in any rule's window (loss_spike.window etc.; docs/security.md)

# (low, high, low inclusive) for each kind of setting, by the part after the dot.
_RANGES: dict[str, tuple[float, float, bool]] = {
    # a window is kept and re-sorted per check: its bound is what one run may cost the server's writer
    "window": (1, MAX_WINDOW, True),
    "min_history": (1, 1e7, True),
    "patience": (1, 1e7, True),
    "cooldown": (1, 1e7, True),
    "skips": (1, 1e7, True),
    "factor": (1.0, math.inf, False),
    "early_factor": (1.0, math.inf, False),
    "ceiling": (0.0, math.inf, False),
    "min_delta": (0.0, math.inf, True),
    "min_norm": (0.0, math.inf, True),
    "ratio": (0.0, 1.0, False),
    "fraction": (0.0, 1.0, False),
    "level": (0.0, math.inf, False),
}
_INTEGERS = ("window", "min_history", "patience", "cooldown", "skips")


def _number(name: str, value: Any) -> float:
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ValueError(f"alert threshold {name!r} must be a number, got {type(value).__name__} {value!r}")
    try:
        number = float(value)  # ints, numpy scalars, 0-dim arrays and tensors
    except (TypeError, ValueError) as exc:
        raise ValueError(f"alert threshold {name!r} must be a number, got {type(value).__name__} {value!r}") from exc
    if math.isnan(number):
        raise ValueError(f"alert threshold {name!r} must be a number, got NaN")
    return number


def check(name: str, value: Any) -> float:
    """One threshold as a float, or ValueError saying what is wrong with it."""
    if not isinstance(name, str) or name not in DEFAULTS:
        close = difflib.get_close_matches(str(name), DEFAULTS, n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown alert threshold {name!r}.{hint} Known: {', '.join(sorted(DEFAULTS))}")
    number = _number(name, value)
    part = name.split(".", 1)[1]
    low, high, inclusive = _RANGES[part]
    if not ((low <= number if inclusive else low < number) and number <= high):
        bound = f"{'>=' if inclusive else '>'} {low:g}" + (f" and <= {high:g}" if high < math.inf else "")
        raise ValueError(f"alert threshold {name!r} must be {bound}, got {number:g}")
    if part in _INTEGERS and number != int(number):
        raise ValueError(f"alert threshold {name!r} counts steps and must be a whole number, got {number:g}")
    return number


def validate(overrides: Mapping | None) -> dict[str, float]:
    """The overrides as {name: float}; ValueError for unknown names, non-numbers or out-of-range values."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ValueError(f"alerts must be a dict of threshold name -> number, got {type(overrides).__name__}")
    return {str(name): check(name, value) for name, value in overrides.items()}


def merged(overrides: Mapping | None) -> dict[str, float]:
    """DEFAULTS with every valid override applied; a bad one keeps its default (never raises)."""
    th = {k: float(v) for k, v in DEFAULTS.items()}
    if not isinstance(overrides, Mapping):
        return th
    for name, value in overrides.items():
        try:
            th[name] = check(name, value)
        except ValueError:
            pass
    return th


def of(kind: str) -> dict[str, float]:
    """The defaults of one alert kind's thresholds: the names that start with ``<kind>.``."""
    prefix = f"{kind}."
    return {name: value for name, value in DEFAULTS.items() if name.startswith(prefix)}
