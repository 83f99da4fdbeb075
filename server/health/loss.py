"""Health rules on the loss: NaN/inf, spikes against the recent spread, divergence from the run's start.

Each rule has its per-record check and its numpy bulk check (see rule.py) here, declared in ``RULES``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

from gradwatch.protocol import is_loss_key
from gradwatch_server.health.common import Alert, Observation, episode, fmt, going_on, healthy_run
from gradwatch_server.health.rule import Columns, Rule

SPIKE_REFRESH = 8  # steps between recomputing the spike baseline (median / MAD of the window)


def check_nan_loss(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """A loss that is NaN or +/-inf: training has diverged at this exact step."""
    out = []
    for key, value in obs.scalars.items():
        if not is_loss_key(key):
            continue
        ks = state.setdefault(key, {})
        bad = not math.isfinite(value)
        opened = episode(ks, bad, th["nan_loss.cooldown"])
        if going_on(ks, bad, opened):
            out.append(Alert("nan_loss", obs.step, value, "critical", "", key=key, update=1))
        if opened:
            out.append(
                Alert(
                    "nan_loss",
                    obs.step,
                    value,
                    "critical",
                    key=key,
                    message=(
                        f"{key} is {fmt(value)} at step {obs.step}. Likely causes: learning rate too high, "
                        "exploding gradients (clip them: torch.nn.utils.clip_grad_norm_), log or division of zero "
                        "(add an epsilon), or bad input (NaN in the data)."
                    ),
                )
            )
    return out


def spike_state(state: dict, key: str, th: dict) -> dict:
    ks = state.get(key)
    if ks is None:
        ks = state[key] = {"window": deque(maxlen=int(th["loss_spike.window"])), "age": SPIKE_REFRESH}
    return ks


def spike_baseline(window) -> tuple[float, float]:
    """(median, robust scale) of the window: MAD x 1.4826, floored so a flat loss has a scale."""
    med = statistics.median(window)
    mad = statistics.median(abs(x - med) for x in window) * 1.4826
    return med, max(mad, 1e-12 + 1e-6 * abs(med))


def is_spike(value: float, med: float, scale: float, factor: float, floor: float) -> bool:
    """Far outside the robust spread, half the median above it, and above the absolute floor (a converged
    loss at 1e-7 wiggling to 3e-6 is noise, however many MADs that is)."""
    return (value - med) / scale > factor and value - med > max(0.5 * abs(med), floor)


def check_loss_spike(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """A finite loss far outside its recent robust spread (median + factor x MAD)."""
    out = []
    for key, value in obs.scalars.items():
        if not is_loss_key(key) or not math.isfinite(value):
            continue
        ks = spike_state(state, key, th)
        window = ks["window"]
        spike = False
        if len(window) >= th["loss_spike.min_history"]:
            # The robust baseline moves slowly: refreshing it every few steps instead of every step
            # keeps the writer fast and changes no verdict that matters.
            if ks["age"] >= SPIKE_REFRESH:
                ks["baseline"], ks["age"] = spike_baseline(window), 0
            (med, scale), ks["age"] = ks["baseline"], ks["age"] + 1
            spike = is_spike(value, med, scale, th["loss_spike.factor"], th["loss_spike.min_delta"])
        # Aftershocks of one bad batch are the same episode until the loss is back in range for a while.
        opened = episode(ks, spike, th["loss_spike.cooldown"])
        if going_on(ks, spike, opened):
            out.append(Alert("loss_spike", obs.step, value, "warning", "", key=key, update=1))
        if opened:
            out.append(
                Alert(
                    "loss_spike",
                    obs.step,
                    value,
                    "warning",
                    key=key,
                    message=(
                        f"{key} jumped to {fmt(value)} at step {obs.step}, far above its recent median {fmt(med)}. "
                        "Often a bad batch, a learning-rate schedule step, or the start of divergence: watch the "
                        "gradient norm; consider clipping or a lower learning rate."
                    ),
                )
            )
        if not spike:
            window.append(value)
    return out


def divergence_state(state: dict, key: str, th: dict) -> dict:
    ks = state.get(key)
    if ks is None:
        ks = state[key] = {"first": None, "recent": deque(maxlen=int(th["loss_divergence.window"]))}
    return ks


def check_loss_divergence(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """A finite loss that jumps to many times both the run's first loss and its recent median."""
    out = []
    factor = th["loss_divergence.factor"]
    for key, value in obs.scalars.items():
        if not is_loss_key(key) or not math.isfinite(value):
            continue
        ks = divergence_state(state, key, th)
        first, recent = ks["first"], ks["recent"]
        if first is None:
            # The reference is the first non-zero loss: a loss that starts at exactly 0 has no scale yet.
            if value != 0.0:
                ks["first"] = abs(value)
            recent.append(value)
            continue
        above = value > factor * first
        if ks.get("open"):
            bad = above  # the episode lasts while the loss stays far above where it started
        else:  # ... and starts with a jump: a loss that creeps up (a KL term, a regulariser) is not one
            bad = above and value > factor * statistics.median(recent)
        opened = episode(ks, bad, th["loss_divergence.cooldown"])
        if going_on(ks, bad, opened):
            out.append(Alert("loss_divergence", obs.step, value, "critical", "", key=key, update=1))
        if opened:
            med = statistics.median(recent)
            out.append(
                Alert(
                    "loss_divergence",
                    obs.step,
                    value,
                    "critical",
                    key=key,
                    message=(
                        f"{key} diverged at step {obs.step}: {fmt(value)} is {value / first:,.0f}x its first value "
                        f"{fmt(first)} (recent median {fmt(med)}), without going NaN. Unless it comes straight back down (one bad "
                        "batch does), the learning rate is too high for this model: lower it (try 10x), add warmup, clip "
                        "gradients (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))."
                    ),
                )
            )
        recent.append(value)
    return out


# -- the same rules over a whole batch (numpy) -------------------------------------------------------------
def bulk_nan_loss(state: dict, cols: Columns) -> bool:
    """No loss of the batch is non-finite: every open episode sees that many healthy steps."""
    if any(not np.isfinite(vals).all() for _, _, vals in cols.losses):
        return False
    for key, _, vals in cols.losses:
        healthy_run(state.setdefault(key, {}), len(vals), cols.th["nan_loss.cooldown"])
    return True


def bulk_loss_spike(state: dict, cols: Columns) -> bool:
    """No finite loss of the batch is a spike against the baseline it would have been checked with."""
    th = cols.th
    plans = []
    for key, _, vals in cols.losses:
        fin = vals[np.isfinite(vals)]
        if len(fin):
            plan = _spike_plan(state.get(key), fin, th)
            if plan is None:
                return False
            plans.append((key, fin, plan))
    for key, fin, (window, age, baseline) in plans:
        ks = spike_state(state, key, th)
        ks["window"].extend(window)
        ks["age"] = age
        if baseline is not None:
            ks["baseline"] = baseline
        healthy_run(ks, len(fin), th["loss_spike.cooldown"])
    return True


def _spike_plan(ks: dict | None, fin: np.ndarray, th):
    """(values to append, final age, final baseline) when no value of ``fin`` is a spike, else None."""
    W, mh, factor = int(th["loss_spike.window"]), th["loss_spike.min_history"], th["loss_spike.factor"]
    old = list(ks["window"]) if ks else []
    age, baseline = (ks["age"], ks.get("baseline")) if ks else (SPIKE_REFRESH, None)
    arr = np.concatenate([np.asarray(old, dtype=np.float64), fin])
    L0, m = len(old), len(fin)
    # The i-th new value is checked when the window before it (the last W of arr[:L0 + i]) holds min_history.
    first = max(0, int(np.ceil(mh)) - L0) if mh <= W else m
    tail = fin[-W:].tolist()
    if first >= m:
        return tail, age, baseline
    c = m - first
    offset = 0 if age >= SPIKE_REFRESH else SPIKE_REFRESH - age  # checked index of the first recompute
    recompute = np.arange(offset, c, SPIKE_REFRESH)
    if offset > 0 and baseline is None:
        return None  # cannot happen with a state built by the rules
    meds = np.empty(len(recompute) + 1)
    scales = np.empty(len(recompute) + 1)
    if baseline is not None:
        meds[0], scales[0] = baseline
    ends = L0 + first + recompute  # window before value i is arr[max(0, end - W): end]
    full = ends >= W
    if full.any():
        wins = np.lib.stride_tricks.sliding_window_view(arr, W)[ends[full] - W]
        med = np.median(wins, axis=1)
        mad = np.median(np.abs(wins - med[:, None]), axis=1) * 1.4826
        meds[1:][full], scales[1:][full] = med, np.maximum(mad, 1e-12 + 1e-6 * np.abs(med))
    for j in np.flatnonzero(~full):
        win = arr[: ends[j]]
        med = float(np.median(win))
        mad = float(np.median(np.abs(win - med))) * 1.4826
        meds[1 + j], scales[1 + j] = med, max(mad, 1e-12 + 1e-6 * abs(med))
    # Which baseline each checked value uses: the latest recompute at or before it (0 = the old one).
    which = np.searchsorted(recompute, np.arange(c), side="right")
    v = fin[first:]
    med, scale = meds[which], scales[which]
    floor = th["loss_spike.min_delta"]
    if (((v - med) / scale > factor) & (v - med > np.maximum(0.5 * np.abs(med), floor))).any():
        return None
    if len(recompute):
        final_age = c - int(recompute[-1])
        baseline = (float(meds[-1]), float(scales[-1]))
    else:
        final_age = age + c
    return tail, final_age, baseline


def bulk_loss_divergence(state: dict, cols: Columns) -> bool:
    """No finite loss of the batch is above factor x the run's first loss (nor is an episode open)."""
    th = cols.th
    factor = th["loss_divergence.factor"]
    plans = []
    for key, _, vals in cols.losses:
        fin = vals[np.isfinite(vals)]
        if not len(fin):
            continue
        ks = state.get(key)
        first = ks["first"] if ks else None
        checked = fin
        if first is None:
            nonzero = np.flatnonzero(fin != 0.0)
            if len(nonzero):
                first, checked = abs(float(fin[nonzero[0]])), fin[nonzero[0] + 1 :]
            else:
                checked = fin[:0]
        if len(checked) and (checked > factor * first).any():
            return False  # possibly a divergence (or an open one going on): record by record
        plans.append((key, fin, first, len(checked)))
    W = int(th["loss_divergence.window"])
    for key, fin, first, n_checked in plans:
        ks = divergence_state(state, key, th)
        ks["first"] = first
        ks["recent"].extend(fin[-W:].tolist())
        healthy_run(ks, n_checked, th["loss_divergence.cooldown"])
    return True


RULES = (
    Rule("nan", "nan_loss", check_nan_loss, bulk_nan_loss, losses=True, nonfinite_value=True),
    Rule("spike", "loss_spike", check_loss_spike, bulk_loss_spike, losses=True),
    Rule("divergence", "loss_divergence", check_loss_divergence, bulk_loss_divergence, losses=True),
)
