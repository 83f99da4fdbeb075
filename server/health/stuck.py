"""Health rule on runs that do not learn: a loss that has not fallen at all since the run began.

A run at chance accuracy for its whole life (a learning rate far too small or too large to move,
a frozen model, clipping that zeroes every update) raises no other alert: nothing is NaN, nothing
spikes. After ``loss_plateau.patience`` finite values of a loss key, the median of its latest
values is compared with the median of its first ones; once, per key. A gentle warning, not a
verdict, and only on losses meant to fall: a GAN's D and G, an entropy bonus or a KL term are not
(``contract.rules.loss_goal``: the run's declared goals, else by name).
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

from gradwatch_server.health.common import Alert, Observation, fmt
from gradwatch_server.health.loss import divergence_start, watched
from gradwatch_server.health.rule import Columns, Rule

EDGE = 20  # values at each end whose medians are compared (fewer when patience is small)
RISE = 0.5  # a loss this far above its start is rising, which is loss_divergence's business, not this rule's


def _edge(th: dict) -> int:
    return max(1, min(EDGE, int(th["loss_plateau.patience"]) // 4))


def _key_state(state: dict, key: str, th: dict) -> dict:
    ks = state.get(key)
    if ks is None:
        edge = _edge(th)
        ks = state[key] = {"n": 0, "head": [], "tail": deque(maxlen=edge), "done": False}
    return ks


def _verdict(ks: dict, th: dict) -> tuple[bool, float, float]:
    """(stuck, start median, latest median) once the loss has its ``patience`` values."""
    start, now = statistics.median(ks["head"]), statistics.median(ks["tail"])
    scale = abs(start) or 1e-12
    fell = now < start - (1.0 - th["loss_plateau.ratio"]) * scale
    return (not fell and now <= start + RISE * scale), start, now


def check_loss_plateau(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """A loss that has not fallen at all over its first N values: the run may not be learning."""
    out = []
    patience = int(th["loss_plateau.patience"])
    for key, value in obs.scalars.items():
        if not math.isfinite(value) or not watched(state, key, th):
            continue  # a GAN's D/G, an entropy bonus, a KL term are not meant to fall (contract.rules.loss_goal)
        ks = _key_state(state, key, th)
        if ks["done"]:
            continue
        ks["n"] += 1
        if len(ks["head"]) < ks["tail"].maxlen:
            ks["head"].append(value)
        ks["tail"].append(value)
        if ks["n"] < patience:
            continue
        ks["done"] = True
        stuck, start, now = _verdict(ks, th)
        if stuck:
            out.append(
                Alert(
                    "loss_plateau",
                    obs.step,
                    now,
                    "warning",
                    key=key,
                    message=(
                        f"{key} has not fallen in {ks['n']} values: {fmt(now)} now against {fmt(start)} at the start. "
                        "If this run should be learning, check the learning rate (too small to move, or so large "
                        "that the model sits at chance), that the optimizer holds the model's parameters, frozen "
                        "layers, gradient clipping, and that the labels match the inputs."
                    ),
                )
            )
    return out


def bulk_loss_plateau(state: dict, cols: Columns) -> bool:
    """No loss key reaches its verdict in this batch: only the counts and the kept ends move."""
    patience = int(cols.th["loss_plateau.patience"])
    plans = []
    for key, _, vals in cols.losses:
        fin = vals[np.isfinite(vals)]
        ks = state.get(key)
        if not len(fin) or (ks is not None and ks["done"]) or not watched(state, key, cols.th):
            continue
        if (ks["n"] if ks else 0) + len(fin) >= patience:
            return False  # the verdict falls in this batch: record by record
        plans.append((key, fin))
    for key, fin in plans:
        ks = _key_state(state, key, cols.th)
        ks["n"] += len(fin)
        room = ks["tail"].maxlen - len(ks["head"])
        if room > 0:
            ks["head"].extend(fin[:room].tolist())
        ks["tail"].extend(fin[-ks["tail"].maxlen :].tolist())
    return True


RULES = (
    Rule("loss_plateau", "loss_plateau", check_loss_plateau, bulk_loss_plateau, losses=True, start=divergence_start),
)
