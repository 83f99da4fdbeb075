"""Health rules on the loss: NaN/inf, spikes against the recent spread, divergence from the run's start."""

from __future__ import annotations

import math
import statistics
from collections import deque

from gradwatch.protocol import is_loss_key
from gradwatch_server.health.common import Alert, Observation, episode, fmt

SPIKE_REFRESH = 8  # steps between recomputing the spike baseline (median / MAD of the window)


def check_nan_loss(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """A loss that is NaN or +/-inf: training has diverged at this exact step."""
    out = []
    for key, value in obs.scalars.items():
        if not is_loss_key(key):
            continue
        ks = state.setdefault(key, {})
        if episode(ks, not math.isfinite(value), th["nan_loss.cooldown"]):
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


def is_spike(value: float, med: float, scale: float, factor: float) -> bool:
    return (value - med) / scale > factor and value - med > 0.5 * abs(med)


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
            spike = is_spike(value, med, scale, th["loss_spike.factor"])
        # Aftershocks of one bad batch are the same episode until the loss is back in range for a while.
        if episode(ks, spike, th["loss_spike.cooldown"]):
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
        if episode(ks, bad, th["loss_divergence.cooldown"]):
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
