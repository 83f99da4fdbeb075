"""Health rules on gradients: non-finite, exploding, vanishing, exactly zero and missing (None)."""

from __future__ import annotations

import math
import statistics
from collections import deque

from gradwatch.protocol import is_loss_key
from gradwatch_server.health.common import Alert, Observation, episode, fmt, names

_INF = math.inf
GLOBAL = "grad/global_norm"


def has_grads(obs: Observation) -> bool:
    return GLOBAL in obs.scalars or bool(obs.norms)


def _loss_first_message(alert: Alert, loss_step: int) -> Alert:
    alert.layer = None
    alert.message = (
        f"Gradients are NaN/inf at step {alert.step} because the loss itself went non-finite first (at step "
        f"{loss_step}): every gradient computed from a NaN/inf loss is NaN/inf, so no layer is the origin. "
        "Look at what makes the loss non-finite: log(0) or division by zero in the loss (add an epsilon), a "
        "learning rate too high (the loss diverged before), or NaN in the inputs or targets."
    )
    return alert


def check_nonfinite_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """NaN/inf inside gradients, naming the first parameters (input side) affected, or the loss if it went first."""
    out = []
    losses = [v for k, v in obs.scalars.items() if is_loss_key(k)]
    pending = state.get("pending")
    if pending is not None and (obs.step != pending.step or losses):
        # The loss of a step is usually logged just after its gradients were captured: wait for it.
        state["pending"] = None
        loss_bad = any(not math.isfinite(v) for v in losses)
        out.append(_loss_first_message(pending, obs.step) if obs.step == pending.step and loss_bad else pending)
    if losses:
        state["loss_bad"] = obs.step if any(not math.isfinite(v) for v in losses) else None
    if not has_grads(obs):
        return out
    g = obs.scalars.get(GLOBAL)
    # The global norm is the L2 norm of the layer norms: when it is finite, every layer's is too.
    bad = (
        []
        if g is not None and math.isfinite(g)
        else [n for n, v in zip(obs.layers, obs.norms) if v is not None and not -_INF < v < _INF]
    )
    if not episode(state, bool(bad) or (g is not None and not math.isfinite(g)), th["nonfinite_gradients.cooldown"]):
        return out
    value = g if g is not None else math.nan
    where = f" in {names(bad)}" if bad else ""
    alert = Alert(
        "nonfinite_gradients",
        obs.step,
        value,
        "critical",
        layer=bad[0] if bad else None,
        key=GLOBAL,
        message=(
            f"Gradients contain NaN/inf{where} at step {obs.step}. The first listed parameter is "
            "nearest the input where it starts. Check for log(0), sqrt of negatives, division by "
            "zero or overflow in fp16; lower the learning rate or clip gradients."
        ),
    )
    if state.get("loss_bad") is not None:
        out.append(_loss_first_message(alert, state["loss_bad"]))
    elif losses:
        out.append(alert)
    else:
        state["pending"] = alert
    return out


def check_exploding_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Global grad norm far above its own rolling median (or its first steps'), or past an absolute ceiling."""
    g = obs.scalars.get(GLOBAL)
    if g is None or not math.isfinite(g):
        return []
    history = state.get("history")
    if history is None:
        history = state["history"] = deque(maxlen=int(th["exploding_gradients.window"]))
    early = len(history) < th["exploding_gradients.min_history"]
    factor = th["exploding_gradients.early_factor" if early else "exploding_gradients.factor"]
    baseline = statistics.median(history) if history else None
    history.append(g)
    relative = baseline is not None and baseline > 0 and g > factor * baseline
    if not episode(state, g > th["exploding_gradients.ceiling"] or relative, th["exploding_gradients.cooldown"]):
        return []
    top = _largest_layer(obs)
    if relative:
        why = f"{g / baseline:,.0f}x its {'first steps' if early else 'recent'} median {fmt(baseline)}"
    else:
        why = f"above the {fmt(th['exploding_gradients.ceiling'])} warning level"
    return [
        Alert(
            "exploding_gradients",
            obs.step,
            g,
            "warning",
            layer=top,
            key=GLOBAL,
            message=(
                f"Global gradient norm {fmt(g)} at step {obs.step} is {why}"
                + (f"; largest in {top}" if top else "")
                + ". Clip gradients (clip_grad_norm_), lower the learning rate or add warmup before the loss goes NaN."
            ),
        )
    ]


def _largest_layer(obs: Observation) -> str | None:
    finite = [(v, n) for n, v in zip(obs.layers, obs.norms) if v is not None and math.isfinite(v)]
    return max(finite)[1] if finite else None


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
            key="grad",
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
    newly = streaks(
        state, obs, lambda v: v == 0.0, th["zero_gradients.patience"], th["zero_gradients.cooldown"], 0.0 in obs.norms
    )
    if not newly:
        return []
    patience = int(th["zero_gradients.patience"])
    if obs.scalars.get(GLOBAL) == 0.0:
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
            key="grad",
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
            key="grad",
            confirmed_step=obs.step,
            message=(
                f"{len(newly)} parameter(s) get no gradient (grad is None) in modules {names(prefixes)}. "
                "The graph is cut before them (.detach(), torch.no_grad(), .item(), numpy round-trip) or "
                "they are unused in forward. Parameters frozen with requires_grad=False are not counted."
            ),
        )
    ]
