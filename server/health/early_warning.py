"""Health rule that warns before the loss moves: per-layer update-to-weight ratios growing past a safe size.

The client's layer signals (gradwatch/capture/layer_signals.py) send, per sampled step, the largest update/weight
ratio ‖Δw‖/‖w‖ over the weight matrices and the largest module-output RMS, each with where it is (an index
into the gradient layout). Healthy training keeps the ratio near 1e-3 to 1e-2; a run heading for a blow-up
(an LR schedule gone too high, no clipping on a deep net, attention logits growing) shows it rising to ~0.1
and beyond tens to hundreds of steps before the loss moves. The rule warns when the median ratio of the last
steps is both above ``level`` and ``factor`` x its own median over an earlier window, so a run that is
always aggressive, a warmup, and the late gradient-norm rise of weight decay (Defazio 2025) stay quiet.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

from gradwatch.contract import keys
from gradwatch_server.health import loss, lr_ramp
from gradwatch_server.health.common import GLOBAL, Alert, Observation, episode, fmt
from gradwatch_server.health.rule import Columns, Rule

RATIO, RATIO_AT = keys.UPDATE_RATIO_MAX, keys.UPDATE_RATIO_ARGMAX
ACT, ACT_AT = keys.ACT_RMS_MAX, keys.ACT_RMS_ARGMAX
RECENT = 10  # steps whose median is the current level
MIN_RECENT = 3  # ... of at least this many samples (signals sampled every 10 steps: the last three)
LOGIT_HINTS = ("q", "k", "query", "key", "qkv", "in_proj", "attn", "attention", "head", "lm_head", "decoder", "logits")


def _level(values) -> float:
    return statistics.median(values) if values else math.nan


def check_instability_warning(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Update/weight ratios (‖Δw‖/‖w‖) growing past a safe size: a warning tens of steps before a divergence."""
    # Windows count steps, not samples: the client samples the ratios every ``signals_every`` steps (default 10).
    if obs.layers:
        state["layers"] = obs.layers  # the signals come in a record of their own: name layers from the last layout
    for key, value in obs.scalars.items() if state.get("blown") is None else ():  # once blown, nothing to read
        if loss.watched(state.get("ramp", {}), key, th):  # a GAN's discriminator loss may rise: not a blow-up
            _blown(state, obs.step, key, value, th)
    u = obs.scalars.get(RATIO)
    for key, name in ((ACT, "act"), (GLOBAL, "grad")):
        v = obs.scalars.get(key)
        if v is not None and math.isfinite(v):
            _keep(state.setdefault(name, deque()), obs.step, v, th)
    if obs.scalars.get(RATIO_AT) is not None:
        state["at"] = obs.scalars[RATIO_AT]  # where the ratio was largest, for a ramp warning's message
    out = _ramp(state, obs, th)
    if u is None or not math.isfinite(u):
        return out
    hist = state.setdefault("ratio", deque())
    gap = obs.step - hist[-1][0] if hist else 1
    _keep(hist, obs.step, u, th)
    state.setdefault("first", obs.step)
    level, base = _now_and_before(hist, obs.step, th)
    bad = (
        obs.step - state["first"] + 1 >= th["instability_warning.min_history"]
        and level >= th["instability_warning.level"]
        and base > 0
        and level >= th["instability_warning.factor"] * base
        and not lr_ramp.ramped(state["ramp"], obs.step, th)  # a ratio grown with a ramped LR: the ramp check's
    )
    # The cooldown is in steps: that many quiet steps are this many quiet samples.
    if not episode(state, bad, max(1, th["instability_warning.cooldown"] / max(1, gap))) or state["ramp"].get("open"):
        return out
    return [*out, _alert(state, obs, level, base, th)]


def _ramp(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """The LR-schedule evidence (lr_ramp.py): its own episode, one warning unless the ratio's is open."""
    rs = state.setdefault("ramp", lr_ramp.start({}))
    checked, said = lr_ramp.check(rs, obs, th, state.get("grad"))
    if not checked or not episode(rs, said is not None, th["instability_warning.cooldown"]) or state.get("open"):
        return []
    where = _named(state, obs, state.get("at"))
    text = said[0].upper() + said[1:]
    if state.get("ratio"):
        text += f"; the largest update/weight ratio ‖Δw‖/‖w‖ is {fmt(state['ratio'][-1][1])}"
        text += f" (in {where})" if where else ""
    return [
        Alert(
            "instability_warning",
            obs.step,
            rs["growth"],
            "warning",
            layer=where,
            key=keys.LR,
            message=text + ". " + _when(state) + lr_ramp.advice(rs) + _logit_advice(where) + ".",
        )
    ]


def start(meta) -> dict:
    """The ramp check's state knows the run's declared loss key."""
    return {"ramp": lr_ramp.start(meta)}


def _blown(state: dict, step: int, key: str, value: float, th: dict) -> None:
    """Remember the first step a loss went non-finite or past divergence's factors over its start: a warning
    after it cannot say it comes "before divergence"."""
    starts = state.setdefault("starts", {})
    if not math.isfinite(value):
        state["blown"] = step
        return
    start = starts.setdefault(key, value)
    factor = min(th["loss_divergence.factor"], th["loss_divergence.early_factor"])
    if start > 0 and value >= factor * start:
        state["blown"] = step


def _keep(hist: deque, step: int, value: float, th: dict) -> None:
    """Append (step, value), dropping what is older than the baseline window, the gap after it and the recent steps."""
    hist.append((step, value))
    while hist and hist[0][0] <= step - _span(th):
        hist.popleft()


def _span(th: dict) -> int:
    """Steps of history kept: the ratio's baseline window, the gap after it and the recent steps (or the ramp
    check's gradient-norm baseline, if longer)."""
    return max(int(th[f"instability_warning.{w}"]) * 3 // 2 for w in ("window", "lr_window")) + RECENT


def _now_and_before(hist: deque, now: int, th: dict) -> tuple[float, float]:
    """(median of the last RECENT steps' values, at least MIN_RECENT of them; median of the baseline window of
    ``window`` steps that ended window/2 steps ago)."""
    window = int(th["instability_warning.window"])
    recent = [v for s, v in hist if s > now - RECENT]
    if len(recent) < MIN_RECENT:
        recent = [v for _, v in list(hist)[-MIN_RECENT:]]
    end = now - window // 2
    return _level(recent), _level([v for s, v in hist if end - window < s <= end])


def _growth(state: dict, name: str, now: int, th: dict) -> float:
    """How many times a side signal (output RMS, gradient norm) grew over the same windows; NaN if unknown."""
    hist = state.get(name)
    if not hist or len(hist) < 2 * MIN_RECENT or hist[-1][0] - hist[0][0] < 2 * RECENT:
        return math.nan
    level, base = _now_and_before(hist, now, th)
    return level / base if base > 0 else math.nan


def _layer(state: dict, obs: Observation, key: str) -> str | None:
    return _named(state, obs, obs.scalars.get(key))


def _named(state: dict, obs: Observation, index: float | None) -> str | None:
    """The parameter at this index of the gradient layout, or None."""
    layers = obs.layers or state.get("layers") or []
    if index is None or not math.isfinite(index) or not 0 <= int(index) < len(layers):
        return None
    return layers[int(index)]


def _alert(state: dict, obs: Observation, level: float, base: float, th: dict) -> Alert:
    where = _layer(state, obs, RATIO_AT)
    act_where = _layer(state, obs, ACT_AT)
    act, grad = _growth(state, "act", obs.step, th), _growth(state, "grad", obs.step, th)
    parts = [
        f"The update/weight ratio ‖Δw‖/‖w‖ is {fmt(level)} per step"
        + (f" (largest in {where})" if where else "")
        + f" at step {obs.step}, {level / base:.1f}x its earlier {fmt(base)} (healthy: ~1e-3 to 1e-2)"
    ]
    if math.isfinite(act) and act >= 1.2:
        parts.append(
            f"module output RMS grew {act:.1f}x" + (f" (largest after {_module(act_where)})" if act_where else "")
        )
    if math.isfinite(grad) and grad >= 1.2:
        parts.append(f"the gradient norm grew {grad:.1f}x")
    advice = "Lower the peak learning rate (or lengthen warmup) and clip gradients (clip_grad_norm_)"
    advice += next((_logit_advice(n) for n in (where, act_where) if _logit_advice(n)), "")
    return Alert(
        "instability_warning",
        obs.step,
        level,
        "warning",
        layer=where,
        key=RATIO,
        message="; ".join(parts) + ". " + _when(state) + advice + ".",
    )


def _when(state: dict) -> str:
    blown = state.get("blown")
    if blown is None:
        return "This growth comes before divergence. "
    return f"The loss already blew up at step {blown}; this growth can make it diverge again. "


def _logit_advice(param: str | None) -> str:
    """The extra advice when the growth is in attention projections or the output head."""
    if not param or not _is_logit_layer(param):
        return ""
    return "; attention or output logits are growing: add qk-norm (LayerNorm on queries and keys) or a z-loss"


def _module(param: str) -> str:
    return param.rsplit(".", 1)[0] if "." in param else param


def _is_logit_layer(param: str) -> bool:
    parts = _module(param).lower().replace("_", ".").split(".")
    return any(p in LOGIT_HINTS for p in parts)


def bulk_instability_warning(state: dict, cols: Columns) -> bool:
    """A batch without update ratios changes nothing; one with them is checked record by record."""
    ratio = cols.scalars.get(RATIO)
    if ratio is not None and len(ratio[0]):
        return False
    if not lr_ramp.bulk(state.setdefault("ramp", lr_ramp.start({})), cols):
        return False  # the LR rises in it: record by record (the ramp check changed nothing)
    if state.get("blown") is None:
        found = []
        for key, rows, vals in cols.losses:
            if not loss.watched(state["ramp"], key, cols.th):
                continue  # as in check: a loss not meant to fall (a GAN's discriminator's) may rise
            order = np.argsort(rows, kind="stable")
            rows, vals = rows[order], vals[order]
            start = state.setdefault("starts", {}).get(key)
            if start is None and len(vals) and np.isfinite(vals[0]):
                state["starts"][key] = start = float(vals[0])
            factor = min(cols.th["loss_divergence.factor"], cols.th["loss_divergence.early_factor"])
            bad = ~np.isfinite(vals) | ((start or 0) > 0) & (vals >= factor * (start or 0))
            if bad.any():  # the first such value, as ``_blown`` on each record would find it
                found.append(int(cols.steps[rows[int(np.argmax(bad))]]))
        if found:
            state["blown"] = min(found)
    if cols.grad is not None and cols.grad[0]:
        state["layers"] = cols.grad[0]
    for key, name in ((ACT, "act"), (GLOBAL, "grad")):  # the side signals' history, as check() keeps it
        got = cols.scalars.get(key)
        if got is not None and len(got[0]):
            order = np.argsort(got[0], kind="stable")
            steps, vals = got[0][order], got[1][order]
            fine = np.isfinite(vals) & (steps > steps[-1] - _span(cols.th))  # what _keep would keep
            hist = state.setdefault(name, deque())
            for step, value in zip(steps[fine].tolist(), vals[fine].tolist()):
                _keep(hist, int(step), value, cols.th)
    return True


RULES = (
    Rule(
        "instability",
        "instability_warning",
        check_instability_warning,
        bulk_instability_warning,
        reads=frozenset({RATIO, RATIO_AT, ACT, ACT_AT, GLOBAL, *lr_ramp.LR_KEYS}),
        losses=True,  # whether the run already blew up: a later warning says "again"; the ramp check's loss
        start=start,
    ),
)
