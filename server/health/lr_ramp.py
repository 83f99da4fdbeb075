"""The learning-rate schedule as early warning: an LR still rising well past the range where training worked.

An LR range test (the LR raised a little every step) shows what every ramp does: the loss falls fastest around
the right size, then stops falling and climbs while the LR keeps rising, and soon after training diverges. A
schedule that keeps raising the LR (a ramp or range test left on, a geometric schedule bug, a long warmup to a
peak far too high) goes the same way. The check is open only while the LR is still rising (``lr_growth`` x over
the last ``lr_window`` steps and above its value 3 steps ago), so constant and decaying schedules and a warmup
that has ended never open it; it is bad when, ``patience`` checks in a row, the loss (median of its last 10
values) stands ``loss_rise`` x above its best so far, or the gradient norm (median of the last 10 steps)
``grad_growth`` x its median over the ``lr_window``/2 steps that ended ``lr_window`` steps ago. Part of
``instability_warning`` (early_warning.py), which owns the episode and the message.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

from gradwatch.contract.keys import LR, lr_key
from gradwatch_server.health import loss
from gradwatch_server.health.common import GLOBAL, Observation, fmt
from gradwatch_server.health.rule import Columns

LR_KEYS = (LR, *(lr_key(g, 2) for g in range(8)))  # lr, lr/0 .. lr/7; the largest group's is the run's
RISING_OVER = 3  # "still rising": above the LR this many steps ago
MEDIAN_OF = 10  # the loss and the gradient norm are read as medians of this many values (one bad batch is not news)


start = loss.divergence_start  # the run's declared loss (``init(loss_key=...)``) is the one watched


def lr_of(scalars: dict) -> float | None:
    """The largest finite learning rate of a record's parameter groups, or None."""
    lrs = [scalars[k] for k in LR_KEYS if k in scalars and math.isfinite(scalars[k])]
    return max(lrs) if lrs else None


def _watched(rs: dict, key: str, th: dict) -> bool:
    """Whether this is the loss the check reads: the first loss meant to fall (contract.rules.loss_goal) it saw."""
    if rs.get("key") is not None:
        return key == rs["key"]
    if loss.watched(rs, key, th):
        rs["key"] = key
        return True
    return False


def _lr_at(lrs: deque, step: int) -> float | None:
    """The last LR seen at or before ``step`` (None when none is kept)."""
    found = None
    for s, v in lrs:
        if s > step:
            break
        found = v
    return found


def _keep_lr(rs: dict, step: int, lr: float, th: dict) -> None:
    """Append (step, lr), keeping one entry at or before ``lr_window`` steps ago."""
    lrs = rs.setdefault("lrs", deque())
    lrs.append((step, lr))
    while len(lrs) > 1 and lrs[1][0] <= step - th["instability_warning.lr_window"]:
        lrs.popleft()


def growth(rs: dict, step: int, th: dict) -> float | None:
    """How many times the LR grew over the last ``lr_window`` steps, when it is still rising; else None."""
    lrs = rs.get("lrs")
    if not lrs:
        return None
    now, before = lrs[-1][1], _lr_at(lrs, step - th["instability_warning.lr_window"])
    recent = _lr_at(lrs, step - RISING_OVER)
    if before is None or recent is None or before <= 0 or now <= recent:
        return None
    g = now / before
    return g if g >= th["instability_warning.lr_growth"] else None


def ramped(rs: dict, step: int, th: dict) -> bool:
    """Whether the LR grew ``lr_growth`` x over the last ``lr_window`` steps (rising still or just capped): an update
    ratio grows with the LR then, so its growth is this check's to judge, not the ratio's."""
    lrs = rs.get("lrs")
    before = _lr_at(lrs, step - th["instability_warning.lr_window"]) if lrs else None
    return before is not None and before > 0 and lrs[-1][1] >= th["instability_warning.lr_growth"] * before


def check(rs: dict, obs: Observation, th: dict, grads: deque | None) -> tuple[bool, str | None]:
    """One record: (whether it was a check: it carries the watched loss or the gradient norm; the evidence, a
    sentence, when it makes the check bad ``patience`` times in a row). ``grads``: (step, global norm), this one's too."""
    lr = lr_of(obs.scalars)
    if lr is not None:
        _keep_lr(rs, obs.step, lr, th)
    checked, said = False, None
    for key, value in obs.scalars.items():
        if math.isfinite(value) and _watched(rs, key, th):
            checked, said = True, _loss(rs, obs.step, value, th) or said
    if GLOBAL in obs.scalars and math.isfinite(obs.scalars[GLOBAL]) and grads:
        checked, said = True, _grad(rs, obs.step, grads, th) or said
    return checked, said


def _loss(rs: dict, step: int, value: float, th: dict) -> str | None:
    recent = rs.setdefault("recent", deque(maxlen=MEDIAN_OF))
    recent.append(value)
    level = statistics.median(recent)
    best = rs.get("best")
    g = growth(rs, step, th)
    risen = g is not None and best is not None and best > 0 and level >= th["instability_warning.loss_rise"] * best
    if best is None or level < best:
        lrs = rs.get("lrs")
        rs["best"], rs["best_step"], rs["best_lr"] = level, step, lrs[-1][1] if lrs else None
    head = _held(rs, "rise_n", risen, g, th)
    return head and head + (
        f"the loss has climbed {level / best:.1f}x above its best ({fmt(best)} at step {rs['best_step']}{_at_lr(rs)})"
    )


def _grad(rs: dict, step: int, grads: deque, th: dict) -> str | None:
    w = int(th["instability_warning.lr_window"])
    now = [v for s, v in grads if s > step - MEDIAN_OF]
    before = [v for s, v in grads if step - w - w // 2 < s <= step - w]
    g = growth(rs, step, th)
    grown = g is not None and len(before) >= MEDIAN_OF // 2 and statistics.median(before) > 0
    ratio = statistics.median(now) / statistics.median(before) if grown else 0.0
    head = _held(rs, "grad_n", grown and ratio >= th["instability_warning.grad_growth"], g, th)
    return head and (
        head
        + f"the gradient norm grew {ratio:.1f}x (median {fmt(statistics.median(now))}, was {fmt(statistics.median(before))})"
        + (f"; the loss did best at step {rs['best_step']}{_at_lr(rs)}" if rs.get("best_step") is not None else "")
    )


def _held(rs: dict, counter: str, bad: bool, g: float | None, th: dict) -> str | None:
    """Count ``bad`` checks in a row under ``counter``; past ``patience``, the message's common opening."""
    rs[counter] = rs.get(counter, 0) + 1 if bad else 0
    if rs[counter] < th["instability_warning.patience"]:
        return None
    rs["growth"] = g
    w = int(th["instability_warning.lr_window"])
    return f"the learning rate is still rising ({g:.1f}x over the last {w} steps, now {fmt(rs['lrs'][-1][1])}) and "


def _at_lr(rs: dict) -> str:
    return f", LR {fmt(rs['best_lr'])}" if rs.get("best_lr") is not None else ""


def advice(rs: dict) -> str:
    """What to do about a ramp gone too far: stop raising the LR, near where the loss did best."""
    at = f" (the loss did best near {fmt(rs['best_lr'])})" if rs.get("best_lr") is not None else ""
    return f"Stop raising the learning rate: cap the schedule or the warmup's peak lower{at}, and clip gradients"


def bulk(rs: dict, cols: Columns) -> bool:
    """The batch as ``check`` on each record would leave the state, when the LR rises nowhere in the kept history
    and the batch (then no check can open); False (nothing changed) when it may: a ramp goes record by record."""
    if rs.get("open") or rs.get("rise_n") or rs.get("grad_n"):
        return False
    lr = np.full(len(cols.steps), -np.inf)
    for key in LR_KEYS:
        got = cols.scalars.get(key)
        if got is not None:
            np.maximum.at(lr, got[0], np.where(np.isfinite(got[1]), got[1], -np.inf))
    has = np.isfinite(lr)
    kept = [v for _, v in rs.get("lrs", ())]
    seq = np.concatenate((kept, lr[has]))
    if len(seq) > 1 and (np.diff(seq) > 0).any():
        return False  # the LR rises somewhere: a check may open
    rows, vals = _watched_loss(rs, cols)
    if rows is None:
        return False  # which loss is watched is not known yet: check picks it
    before = kept[-1] if kept else None
    for i in np.flatnonzero(has).tolist():
        _keep_lr(rs, int(cols.steps[i]), float(lr[i]), cols.th)
    if len(vals):
        _bulk_loss(rs, cols, lr, has, rows, vals, before)
    return True


def _watched_loss(rs: dict, cols: Columns):
    """(rows, finite values) of the watched loss in this batch; (None, None) when it is not chosen yet."""
    for key, rows, vals in cols.losses:
        fine = np.isfinite(vals)
        if rs.get("key") is None and fine.any() and loss.watched(rs, key, cols.th):
            return None, None
        if key == rs.get("key"):
            rows, vals = rows[fine], vals[fine]
            order = np.argsort(rows, kind="stable")
            return rows[order], vals[order]
    return np.zeros(0, dtype=np.int64), np.zeros(0)


def _bulk_loss(rs: dict, cols: Columns, lr, has, rows, vals, before: float | None) -> None:
    """The loss medians, the best of them and the LR seen then, as each record's check would leave them."""
    recent = rs.setdefault("recent", deque(maxlen=MEDIAN_OF))
    allv = np.concatenate((list(recent), vals))
    k = len(allv) - len(vals)
    meds = np.empty(len(vals))
    short = max(0, min(len(vals), MEDIAN_OF - 1 - k))  # the first medians, of fewer than MEDIAN_OF values
    for i in range(short):
        meds[i] = np.median(allv[: k + i + 1])
    if short < len(vals):
        windows = np.lib.stride_tricks.sliding_window_view(allv, MEDIAN_OF)
        meds[short:] = np.median(windows[k + short + 1 - MEDIAN_OF :], axis=1)
    i = int(np.argmin(meds))
    if rs.get("best") is None or meds[i] < rs["best"]:
        seen = np.maximum.accumulate(np.where(has, np.arange(len(lr)), -1))  # the last LR record up to each row
        j = int(seen[rows[i]])
        rs["best"], rs["best_step"] = float(meds[i]), int(cols.steps[rows[i]])
        rs["best_lr"] = float(lr[j]) if j >= 0 else before
    recent.extend(vals[-MEDIAN_OF:].tolist())
    rs["rise_n"] = 0
