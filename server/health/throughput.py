"""Health rule on the training loop's pace: a sustained throughput drop against the run's own median step time.

The client's step timer (gradwatch/capture/step_timer.py) sends ``perf/step_time`` per optimizer step. A step
time whose median over the last ``patience`` steps is so far above the run's median over ``window`` steps
that throughput fell by ``fraction`` or more (step time >= median / (1 - fraction), and slower by at least
``min_delta`` seconds, so the jitter of millisecond steps on a busy machine is not a drop) opens an episode: a
slow data loader, thermal throttling, a noisy neighbour, a straggler rank, swapping.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

from gradwatch.contract import keys
from gradwatch_server.health.common import Alert, Observation, episode, fmt
from gradwatch_server.health.rule import Columns, Rule

STEP_TIME, DATA_WAIT = keys.STEP_TIME, keys.DATA_WAIT


def check_throughput_drop(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Step time sustained far above the run's own median (throughput down by a fraction), naming data waits."""
    t = obs.scalars.get(STEP_TIME)
    wait = obs.scalars.get(DATA_WAIT)
    if wait is not None and math.isfinite(wait):
        state.setdefault("waits", deque(maxlen=int(th["throughput_drop.patience"]))).append(wait)
    if t is None or not math.isfinite(t) or t <= 0:
        return []
    patience = int(th["throughput_drop.patience"])
    history = state.setdefault("history", deque(maxlen=int(th["throughput_drop.window"])))
    recent = state.setdefault("recent", deque(maxlen=patience))
    recent.append(t)
    bad = False
    if len(history) >= th["throughput_drop.min_history"] and len(recent) == patience:
        base = statistics.median(history)
        now = statistics.median(recent)
        bad = (
            base > 0
            and now >= base / (1.0 - th["throughput_drop.fraction"])
            and now - base >= th["throughput_drop.min_delta"]  # jitter of millisecond steps is not a drop
        )
    if not bad:
        history.append(t)  # the baseline learns from healthy steps only: a slow stretch does not become normal
    if not episode(state, bad, th["throughput_drop.cooldown"]):
        return []
    return [_alert(state, obs, statistics.median(recent), statistics.median(history))]


def _alert(state: dict, obs: Observation, now: float, base: float) -> Alert:
    drop = 1.0 - base / now
    waits = state.get("waits")
    wait = statistics.median(waits) if waits else None
    where = (
        f" Most of it is data-loader wait ({fmt(wait)} s of each step): more DataLoader workers, pin_memory, "
        "or faster storage."
        if wait is not None and wait >= 0.5 * (now - base)
        else " The step itself got slower: thermal or power throttling, another process on the device, "
        "swapping, or a straggler rank."
    )
    return Alert(
        "throughput_drop",
        obs.step,
        now,
        "warning",
        key=STEP_TIME,
        message=(
            f"Throughput fell {drop:.0%} at step {obs.step}: a step takes {fmt(now)} s (median of the last steps) "
            f"against the run's usual {fmt(base)} s." + where
        ),
    )


def bulk_throughput_drop(state: dict, cols: Columns) -> bool:
    """A batch without step times changes nothing but the data waits; one with them is checked record by record."""
    got = cols.scalars.get(STEP_TIME)
    if got is not None and len(got[0]):
        return False
    waits = cols.scalars.get(DATA_WAIT)
    if waits is not None and len(waits[0]):
        vals = waits[1][np.argsort(waits[0], kind="stable")]
        vals = vals[np.isfinite(vals)]
        state.setdefault("waits", deque(maxlen=int(cols.th["throughput_drop.patience"]))).extend(vals.tolist())
    return True


RULES = (
    Rule(
        "throughput",
        "throughput_drop",
        check_throughput_drop,
        bulk_throughput_drop,
        reads=frozenset({STEP_TIME, DATA_WAIT}),
    ),
)
