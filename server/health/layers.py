"""Health rules per layer: vanishing towards the input, exactly-zero gradients, missing gradients (None).

Each rule has its per-record check and its numpy bulk check (see rule.py) here, declared in ``RULES``.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from gradwatch.contract.keys import GLOBAL_NORM_CLIPPED
from gradwatch_server.health.common import GLOBAL, GRAD_VECTOR, Alert, Observation, episode, healthy_run, names
from gradwatch_server.health.rule import Columns, Rule

_INF = math.inf


def vanishing_ratio(pairs: list) -> tuple[float, int]:
    """(median of the first quarter's norms / median of the last quarter's, quarter size)."""
    quarter = max(1, len(pairs) // 4)
    early = statistics.median(v for _, v in pairs[:quarter])
    late = statistics.median(v for _, v in pairs[-quarter:])
    return (early / late if late > 0 else 1.0), quarter


def check_vanishing_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Early layers' gradient norms orders of magnitude below the late layers', for many steps."""
    g = obs.scalars.get(GLOBAL)
    # The usual case (all norms positive and finite: a finite global norm rules out NaN/inf) skips the filter.
    if g is not None and math.isfinite(g) and None not in obs.norms and 0.0 not in obs.norms:
        pairs = list(zip(obs.layers, obs.norms))
    else:
        pairs = [(n, v) for n, v in zip(obs.layers, obs.norms) if v and 0 < v < _INF]
    if len(pairs) < 4:
        return []
    ratio, quarter = vanishing_ratio(pairs)
    bad = ratio < th["vanishing_gradients.ratio"]
    if bad:
        state["count"] = state.get("count", 0) + 1
        if state["count"] == 1:
            state["start"] = obs.step
    else:
        state["count"] = 0
    confirmed = bad and (state["count"] >= th["vanishing_gradients.patience"] or state.get("open"))
    if not episode(state, confirmed, th["vanishing_gradients.cooldown"]):
        return []
    weakest = [n for n, _ in sorted(pairs[:quarter], key=lambda p: p[1])]
    return [
        Alert(
            "vanishing_gradients",
            state["start"],
            ratio,
            "warning",
            layer=weakest[0],
            key=GRAD_VECTOR,
            confirmed_step=obs.step,
            message=(
                f"Gradients vanish towards the input: the first layers' norms are {ratio:.1e} of the last "
                f"layers' for {state['count']} steps since step {state['start']} (weakest: "
                f"{names(weakest, 3)}). Try ReLU-family activations instead of sigmoid/tanh, residual "
                "connections, normalization layers, or Kaiming/Xavier initialization."
            ),
        )
    ]


def streaks(state: dict, obs: Observation, bad, patience: float, cooldown: float, any_bad: bool) -> list:
    """Layers whose per-step condition has just held for ``patience`` steps in a row (each reported once
    per episode; an episode ends after ``cooldown`` good steps)."""
    counts = state.setdefault("counts", {})  # name -> (bad steps in a row, first bad step)
    reported = state.setdefault("reported", {})  # name -> good steps in a row since reported
    if not any_bad and not counts and not reported:
        return []  # the common healthy step: nothing to count, nothing to reset
    if obs.layers != state.get("layers"):  # the layout changed (e.g. layers frozen): forget the gone ones
        state["layers"] = list(obs.layers)
        alive = set(obs.layers)
        for table in (counts, reported):
            for name in [n for n in table if n not in alive]:
                del table[name]
    newly = []
    for name, v in zip(obs.layers, obs.norms):
        if bad(v):
            n, start = counts.get(name, (0, obs.step))
            counts[name] = (n + 1, start)
            if name in reported:
                reported[name] = 0
            elif n + 1 >= patience:
                reported[name] = 0
                newly.append((start, name))
        else:
            counts.pop(name, None)
            if name in reported:
                reported[name] += 1
                if reported[name] >= cooldown:
                    del reported[name]
    return newly


def check_zero_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Parameters whose gradient is exactly zero for many consecutive steps (dead or disconnected)."""
    # What reached the weights counts: clipping to a zero norm (grad/global_norm_clipped 0) zeroes every layer.
    reached = obs.scalars.get(GLOBAL_NORM_CLIPPED, obs.scalars.get(GLOBAL))
    if obs.scalars.get(GLOBAL_NORM_CLIPPED) == 0.0:
        obs = Observation(obs.step, obs.scalars, obs.layers, [None if v is None else 0.0 for v in obs.norms])
    newly = streaks(
        state, obs, lambda v: v == 0.0, th["zero_gradients.patience"], th["zero_gradients.cooldown"], 0.0 in obs.norms
    )
    if not newly:
        return []
    patience = int(th["zero_gradients.patience"])
    if reached == 0.0 and (obs.scalars.get(GLOBAL) or 0.0) > 0.0:
        severity, message = (
            "critical",
            f"Gradient clipping has zeroed every update for {patience} steps (backward produced a non-zero "
            "gradient, the optimizer got 0): check clip_grad_norm_'s max_norm.",
        )
    elif reached == 0.0:
        severity, message = (
            "critical",
            (
                f"The global gradient norm has been exactly 0 for {patience} steps: the loss is not connected to "
                "the parameters. Is the loss computed from the model output? Look for .detach(), "
                "torch.no_grad(), .item() or a multiplication by zero on the path."
            ),
        )
    else:
        severity, message = (
            "warning",
            (
                f"Exactly-zero gradients for {patience}+ steps in {names([n for _, n in newly])}. Likely dead ReLUs "
                "(try LeakyReLU/lower LR), a multiplication by zero, or a constant path."
            ),
        )
    return [
        Alert(
            "zero_gradients",
            min(s for s, _ in newly),
            0.0,
            severity,
            layer=newly[0][1],
            key=GRAD_VECTOR,
            confirmed_step=obs.step,
            message=message,
        )
    ]


def check_missing_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Parameters that require grad but get no gradient at all (.grad is None) step after step."""
    newly = streaks(
        state,
        obs,
        lambda v: v is None,
        th["missing_gradients.patience"],
        th["missing_gradients.cooldown"],
        None in obs.norms,
    )
    if not newly:
        return []
    prefixes = sorted({n.rsplit(".", 1)[0] if "." in n else n for _, n in newly})
    return [
        Alert(
            "missing_gradients",
            min(s for s, _ in newly),
            float(len(newly)),
            "warning",
            layer=newly[0][1],
            key=GRAD_VECTOR,
            confirmed_step=obs.step,
            message=(
                f"{len(newly)} parameter(s) get no gradient (grad is None) in modules {names(prefixes)}. "
                "The graph is cut before them (.detach(), torch.no_grad(), .item(), numpy round-trip) or "
                "they are unused in forward. Parameters frozen with requires_grad=False are not counted."
            ),
        )
    ]


# -- the same rules over a whole batch (numpy) -------------------------------------------------------------
def bulk_vanishing_gradients(state: dict, cols: Columns) -> bool:
    """Every layer norm of the batch positive and finite, and no record's early/late ratio under the line."""
    grad = cols.grad
    if grad is None or not len(grad[1]):
        return True
    _, _, values, present = grad
    k, slots = values.shape
    if slots < 4:
        return True  # fewer than 4 layers: the rule never looks
    if not (present.all() and (values > 0).all() and np.isfinite(values).all()):
        return False
    q = max(1, slots // 4)
    ratio = np.median(values[:, :q], axis=1) / np.median(values[:, -q:], axis=1)
    if (ratio < cols.th["vanishing_gradients.ratio"]).any():
        return False
    state["count"] = 0
    healthy_run(state, k, cols.th["vanishing_gradients.cooldown"])
    return True


def _streak_free(state: dict, grad, bad) -> bool:
    """No layer of the batch is ``bad`` and no streak is being counted or reported: nothing to change."""
    if grad is None or not len(grad[1]):
        return True
    if state.get("counts") or state.get("reported"):
        return False
    return not bad(grad[2], grad[3]).any()


def bulk_zero_gradients(state: dict, cols: Columns) -> bool:
    """No exactly-zero gradient in the batch (none clipped to zero either) and no streak open."""
    clipped = cols.scalars.get(GLOBAL_NORM_CLIPPED)
    if clipped is not None and (clipped[1] == 0.0).any():
        return False
    return _streak_free(state, cols.grad, lambda v, p: p & (v == 0.0))


def bulk_missing_gradients(state: dict, cols: Columns) -> bool:
    """No missing gradient (None) in the batch and no streak open."""
    return _streak_free(state, cols.grad, lambda v, p: ~p)


RULES = (
    Rule(
        "vanishing",
        "vanishing_gradients",
        check_vanishing_gradients,
        bulk_vanishing_gradients,
        reads=frozenset({GLOBAL}),
        needs_grads=True,
    ),
    Rule(
        "zero",
        "zero_gradients",
        check_zero_gradients,
        bulk_zero_gradients,
        reads=frozenset({GLOBAL, GLOBAL_NORM_CLIPPED}),
        needs_grads=True,
    ),
    Rule("missing", "missing_gradients", check_missing_gradients, bulk_missing_gradients, needs_grads=True),
)
