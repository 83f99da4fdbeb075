"""A whole batch of records through the health rules at numpy speed.

Each rule has a bulk check here that either proves no record of the batch can make it alert and
applies the batch to its state exactly as record-by-record ``observe`` would, or changes nothing
and says no; the rules that said no then see the batch record by record. A healthy batch of
thousands of steps costs a few numpy calls per rule, and the verdicts are the same either way
(tests/test_health.py compares the two on random streams).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from gradwatch.protocol import is_loss_key
from gradwatch_server.health.common import Observation, healthy_run
from gradwatch_server.health.grads import GLOBAL
from gradwatch_server.health.loss import SPIKE_REFRESH, divergence_state, spike_state
from gradwatch_server.health.system import TOTAL


def observe_batch(monitor, steps, scalars, vectors) -> list:
    steps = np.asarray(steps, dtype=np.int64)
    n = len(steps)
    if n == 0:
        return []
    th, s = monitor.th, monitor.states
    sc = {}
    for key, (rows, values) in scalars.items():
        sc[key] = (np.asarray(rows, dtype=np.int64).reshape(-1), np.asarray(values, dtype=np.float64).reshape(-1))
    losses = [(k, rows, vals) for k, (rows, vals) in sc.items() if is_loss_key(k)]
    grad = vectors.get("grad")
    if grad is not None:
        layout, rows, values, present = grad
        values = np.asarray(values, dtype=np.float64)
        grad = (
            list(layout or []),
            np.asarray(rows, dtype=np.int64).reshape(-1),
            values.reshape(len(values), -1),
            np.asarray(present, dtype=bool).reshape(len(values), -1),
        )
    gnorm = sc.get(GLOBAL)
    slow = set()
    bulk = (
        ("nan", lambda st: _nan(st, losses, th)),
        ("spike", lambda st: _spike(st, losses, th)),
        ("divergence", lambda st: _divergence(st, losses, th)),
        ("nonfinite", lambda st: _nonfinite(st, steps, losses, gnorm, grad, th)),
        ("exploding", lambda st: _exploding(st, gnorm, th)),
        ("vanishing", lambda st: _vanishing(st, grad, th)),
        ("zero", lambda st: _streak_free(st, grad, lambda v, p: p & (v == 0.0))),
        ("missing", lambda st: _streak_free(st, grad, lambda v, p: ~p)),
        (
            "memory",
            lambda st: (
                TOTAL not in sc
                and _memory(st, sc.get("memory/cuda_reserved"), st.get("total") or monitor.total_memory, th)
            ),
        ),
        ("amp", lambda st: "amp/scale" not in sc),
    )
    for name, check in bulk:
        if not check(s.setdefault(name, {})):
            slow.add(name)
    if not slow:
        return []
    alerts = []
    for obs in _records(steps, sc, grad):
        alerts += monitor.run_rules(obs, slow)
    return alerts


def _records(steps, sc: dict, grad):
    """The batch as one Observation per record (for the rules that must see it record by record)."""
    n = len(steps)
    per = [{} for _ in range(n)]
    for key, (rows, vals) in sc.items():
        for r, v in zip(rows.tolist(), vals.tolist()):
            per[r][key] = v
    norms = [None] * n
    layers: list = []
    if grad is not None:
        layers, rows, values, present = grad
        for r, vals, ok in zip(rows.tolist(), values.tolist(), present.tolist()):
            norms[r] = vals if all(ok) else [v if p else None for v, p in zip(vals, ok)]
        width = values.shape[1]
        if len(layers) != width:
            layers = [f"param[{i}]" for i in range(width)]
    for i, step in enumerate(steps.tolist()):
        yield Observation(step, per[i], layers if norms[i] is not None else [], norms[i] or [])


def _nan(state: dict, losses, th) -> bool:
    if any(not np.isfinite(vals).all() for _, _, vals in losses):
        return False
    for key, _, vals in losses:
        healthy_run(state.setdefault(key, {}), len(vals), th["nan_loss.cooldown"])
    return True


def _spike(state: dict, losses, th) -> bool:
    plans = []
    for key, _, vals in losses:
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
    if (((v - med) / scale > factor) & (v - med > 0.5 * np.abs(med))).any():
        return None
    if len(recompute):
        final_age = c - int(recompute[-1])
        baseline = (float(meds[-1]), float(scales[-1]))
    else:
        final_age = age + c
    return tail, final_age, baseline


def _divergence(state: dict, losses, th) -> bool:
    factor = th["loss_divergence.factor"]
    plans = []
    for key, _, vals in losses:
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


def _grad_rows(n, gnorm, grad) -> np.ndarray:
    """Which records carry gradient information (the rows the gradient rules run on)."""
    has = np.zeros(n, dtype=bool)
    if gnorm is not None:
        has[gnorm[0]] = True
    if grad is not None and grad[2].shape[1] > 0:
        has[grad[1]] = True
    return has


def _nonfinite(state: dict, steps, losses, gnorm, grad, th) -> bool:
    if state.get("pending") is not None:
        return False
    n = len(steps)
    bad = np.zeros(n, dtype=bool)
    if grad is not None:
        _, rows, values, present = grad
        bad[rows] = (present & ~np.isfinite(values)).any(axis=1)
    if gnorm is not None:
        bad[gnorm[0]] = ~np.isfinite(gnorm[1])  # a record's global norm, when there, decides alone
    if bad.any():
        return False
    last, last_bad = -1, False
    for _, rows, vals in losses:
        if len(rows):
            r = int(rows[-1])
            here = bool((~np.isfinite(vals[rows == r])).any())
            if r > last:
                last, last_bad = r, here
            elif r == last:
                last_bad = last_bad or here
    if last >= 0:
        state["loss_bad"] = int(steps[last]) if last_bad else None
    healthy_run(state, int(_grad_rows(n, gnorm, grad).sum()), th["nonfinite_gradients.cooldown"])
    return True


def _exploding(state: dict, gnorm, th) -> bool:
    if gnorm is None:
        return True
    g = gnorm[1][np.isfinite(gnorm[1])]
    if not len(g):
        return True
    W, mh = int(th["exploding_gradients.window"]), th["exploding_gradients.min_history"]
    history = state.get("history") or ()
    old = np.asarray(list(history), dtype=np.float64)
    if (g > th["exploding_gradients.ceiling"]).any():
        return False
    # A lower bound of each value's baseline (the median of its window): the least value seen so far.
    seen = np.concatenate([old, g])
    low = (
        np.minimum.accumulate(seen)[len(old) - 1 : -1]
        if len(old)
        else np.concatenate([[np.inf], np.minimum.accumulate(g)[:-1]])
    )
    sizes = np.minimum(len(old) + np.arange(len(g)), W)
    factor = np.where(sizes < mh, th["exploding_gradients.early_factor"], th["exploding_gradients.factor"])
    has = sizes > 0
    if not ((low[has] > 0) & (g[has] <= factor[has] * low[has])).all():
        return False
    if "history" not in state:
        state["history"] = deque(maxlen=W)
    state["history"].extend(g[-W:].tolist())
    healthy_run(state, len(g), th["exploding_gradients.cooldown"])
    return True


def _vanishing(state: dict, grad, th) -> bool:
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
    if (ratio < th["vanishing_gradients.ratio"]).any():
        return False
    state["count"] = 0
    healthy_run(state, k, th["vanishing_gradients.cooldown"])
    return True


def _streak_free(state: dict, grad, bad) -> bool:
    if grad is None or not len(grad[1]):
        return True
    if state.get("counts") or state.get("reported"):
        return False
    return not bad(grad[2], grad[3]).any()


def _memory(state: dict, reserved, total, th) -> bool:
    if reserved is None or not total:
        return True
    frac = reserved[1] / total
    if (frac >= th["memory_pressure.fraction"]).any():
        return False
    healthy_run(state, len(frac), th["memory_pressure.cooldown"])
    return True
