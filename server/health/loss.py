"""Health rules on the loss: NaN/inf, spikes against the recent spread, divergence from the run's start.

Each rule has its per-record check and its numpy bulk check (see rule.py) here, declared in ``RULES``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

from gradwatch.contract import keys
from gradwatch.contract import rules as specs
from gradwatch.contract.keys import is_loss_key
from gradwatch_server.health.common import Alert, Observation, episode, fmt, going_on, healthy_run
from gradwatch_server.health.rule import Columns, Rule

KINDS = ("nan_loss", "loss_spike", "loss_divergence")
SEVERITY = {kind: specs.spec(kind).severity for kind in KINDS}  # the severity their alerts have (the replay's too)
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
            out.append(Alert("nan_loss", obs.step, value, SEVERITY["nan_loss"], "", key=key, update=1))
        if opened:
            out.append(
                Alert(
                    "nan_loss",
                    obs.step,
                    value,
                    SEVERITY["nan_loss"],
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
            out.append(Alert("loss_spike", obs.step, value, SEVERITY["loss_spike"], "", key=key, update=1))
        if opened:
            out.append(
                Alert(
                    "loss_spike",
                    obs.step,
                    value,
                    SEVERITY["loss_spike"],
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


MAIN = "\x00main"  # the state key of the run's declared loss key (no metric key starts with NUL)
LRS = "\x00lr"  # ... and of the learning rates seen over the first steps, for an early blow-up's story
LR_KEYS = (keys.LR, *(keys.lr_key(g, 2) for g in range(8)))  # lr, lr/0 .. lr/7: what the story reads


def divergence_start(meta) -> dict:
    """The run's declared loss (``init(loss_key=...)``): always a loss meant to fall."""
    return {MAIN: meta.get("loss_key")}


def watched(state: dict, key: str, th: dict) -> bool:
    """Whether the divergence and plateau rules watch this key: a loss meant to fall (contract.rules.loss_goal)."""
    return is_loss_key(key) and specs.loss_goal(key, th, state.get(MAIN)) == "fall"


def divergence_state(state: dict, key: str, th: dict) -> dict:
    ks = state.get(key)
    if ks is None:
        ks = state[key] = {"first": None, "n": 0, "recent": deque(maxlen=int(th["loss_divergence.window"]))}
    return ks


def _keep_lr(state: dict, obs: Observation, th: dict) -> None:
    """The first steps' learning rate (the largest group's), for the story of a blow-up at the start."""
    lrs = [obs.scalars[k] for k in LR_KEYS if k in obs.scalars and math.isfinite(obs.scalars[k])]
    if lrs:
        seen = state.setdefault(LRS, {})
        if len(seen) < 2 * int(th["loss_divergence.early_window"]) or obs.step in seen:
            seen[obs.step] = max(lrs)


def check_loss_divergence(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """A finite loss that jumps to many times both the run's first loss and its recent median."""
    out = []
    factor = th["loss_divergence.factor"]
    _keep_lr(state, obs, th)
    for key, value in obs.scalars.items():
        if not math.isfinite(value) or not watched(state, key, th):
            continue
        ks = divergence_state(state, key, th)
        first, recent = ks["first"], ks["recent"]
        ks["n"] = ks.get("n", 0) + 1
        if first is None:
            # The reference is the first non-zero loss: a loss that starts at exactly 0 has no scale yet.
            if value != 0.0:
                ks["first"], ks["start"] = abs(value), value
            ks["head"], ks["prev"] = [value], value
            recent.append(value)
            continue
        early = _early(ks, value, th)
        above = value > factor * first
        if ks.get("open"):
            bad = above or (early and ks.get("early"))  # the episode lasts while the loss stays far above its start
        else:  # ... and starts with a jump: a loss that creeps up (a KL term, a regulariser) is not one
            bad = (above and value > factor * statistics.median(recent)) or early
        opened = episode(ks, bad, th["loss_divergence.cooldown"])
        if going_on(ks, bad, opened):
            out.append(Alert("loss_divergence", obs.step, value, SEVERITY["loss_divergence"], "", key=key, update=1))
        if opened:
            ks["early"] = early and not above
            text = (
                _early_story(state, ks, key, value, obs.step)
                if ks["early"]
                else _story(key, value, first, recent, obs.step)
            )
            out.append(Alert("loss_divergence", obs.step, value, SEVERITY["loss_divergence"], key=key, message=text))
        recent.append(value)
    return out


def _early(ks: dict, value: float, th: dict) -> bool:
    """Within the first early_window values, two values in a row at 2x the median of the loss's first two and one
    of them at early_factor x: a blow-up at the start, not one noisy batch after a lucky first one."""
    head = ks.setdefault("head", [])
    if len(head) < 2:
        head.append(value)
        ks["prev"] = value
        return False
    ref = 0.5 * (head[0] + head[1])
    prev, ks["prev"] = ks["prev"], value
    ks["peak"] = max(prev, value)
    return (
        ref > 0
        and ks["n"] <= th["loss_divergence.early_window"]
        and min(value, prev) >= 2.0 * ref
        and max(value, prev) >= th["loss_divergence.early_factor"] * ref
    )


def _story(key: str, value: float, first: float, recent, step: int) -> str:
    med = statistics.median(recent)
    return (
        f"{key} diverged at step {step}: {fmt(value)} is {value / first:,.0f}x its first value "
        f"{fmt(first)} (recent median {fmt(med)}), without going NaN. Unless it comes straight back down (one bad "
        "batch does), the learning rate is too high for this model: lower it (try 10x), add warmup, clip "
        "gradients (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))."
    )


def _early_story(state: dict, ks: dict, key: str, value: float, step: int) -> str:
    """'loss rose 6x in 3 steps from the start (4.22 -> 24.8); LR 0.5 after a 5-step warmup'."""
    n, peak = ks["n"] - 1, ks.get("peak", value)
    text = (
        f"{key} rose {peak / ks['start']:.1f}x in {n} step{'s' if n != 1 else ''} from the start "
        f"({fmt(ks['start'])} → {fmt(peak)}, step {step})"
    )
    lr = lr_story(state.get(LRS, {}), step)
    return (
        text + (f"; {lr}" if lr else "") + ". A loss that climbs from the first steps means the learning rate is "
        "too high for this model from the start: lower the peak (try 10x), warm up longer, clip gradients "
        "(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))."
    )


def lr_story(lrs: dict, step: int) -> str | None:
    """'LR 0.5 after a 5-step warmup', 'LR 0.33, rising (warmup)' or 'LR 0.5 from the start', from the steps seen."""
    seen = sorted((s, v) for s, v in lrs.items() if s <= step)
    if not seen:
        return None
    now = seen[-1][1]
    values = [v for _, v in seen]
    if max(values) == min(values):
        return f"LR {fmt(now)} from the start (constant)"
    peak_at = next(s for s, v in seen if v == max(values))
    if now == max(values) and peak_at < seen[-1][0]:
        return f"LR {fmt(now)} after a {peak_at - seen[0][0] + 1}-step warmup"
    if now == max(values) and len(values) >= 2 and values[-2] < now:
        return f"LR {fmt(now)} and rising (warmup from {fmt(values[0])})"
    return f"LR {fmt(now)} (peak so far {fmt(max(values))})"


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


def _spike_baselines(old: list, age: int, baseline, fin: np.ndarray, th, lazy: bool = False):
    """The baseline each value of ``fin`` is checked against, from a state (window ``old``, ``age``, ``baseline``)
    in which none of them is a spike: (first checked index, recompute offsets, medians, scales, which baseline
    each checked value uses: 0 = the old one, j = the j-th recompute), or None when the state cannot say.

    ``lazy``: a median only where a value could be a spike (NaN elsewhere): a value no more than the spike
    margin above its window's minimum (which the median is not below) cannot be one, whatever the spread."""
    W, mh = int(th["loss_spike.window"]), th["loss_spike.min_history"]
    arr = np.concatenate([np.asarray(old, dtype=np.float64), fin])
    L0, m = len(old), len(fin)
    # The i-th new value is checked when the window before it (the last W of arr[:L0 + i]) holds min_history.
    first = max(0, int(np.ceil(mh)) - L0) if mh <= W else m
    if first >= m:
        return first, None, None, None, None
    c = m - first
    offset = 0 if age >= SPIKE_REFRESH else SPIKE_REFRESH - age  # checked index of the first recompute
    recompute = np.arange(offset, c, SPIKE_REFRESH)
    if offset > 0 and baseline is None:
        return None  # cannot happen with a state built by the rules
    meds = np.full(len(recompute) + 1, np.nan)
    scales = np.full(len(recompute) + 1, np.nan)
    if baseline is not None:
        meds[0], scales[0] = baseline
    ends = L0 + first + recompute  # window before value i is arr[max(0, end - W): end]
    # Which baseline each checked value uses: the latest recompute at or before it (0 = the old one).
    which = np.searchsorted(recompute, np.arange(c), side="right")
    wanted = np.arange(len(recompute))
    if lazy:
        low = np.empty(len(recompute) + 1)
        low[0] = meds[0]
        full = ends >= W
        if full.any():
            low[1:][full] = np.lib.stride_tricks.sliding_window_view(arr, W)[ends[full] - W].min(axis=1)
        low[1:][~full] = np.minimum.accumulate(arr)[ends[~full] - 1]
        v, mn = fin[first:], low[which]
        maybe = v - mn > np.maximum(0.5 * np.maximum(mn, 0.0), th["loss_spike.min_delta"])
        wanted = np.unique(which[maybe]) - 1
        wanted = wanted[wanted >= 0]
    _baselines_at(arr, ends, wanted, W, meds, scales)
    return first, recompute, meds, scales, which


def _baselines_at(arr: np.ndarray, ends: np.ndarray, wanted: np.ndarray, W: int, meds, scales) -> None:
    """``spike_baseline`` of the windows before ``ends[wanted]``, into ``meds``/``scales`` at ``wanted + 1``."""
    full = wanted[ends[wanted] >= W]
    if len(full):
        wins = np.lib.stride_tricks.sliding_window_view(arr, W)[ends[full] - W]
        med = np.median(wins, axis=1)
        mad = np.median(np.abs(wins - med[:, None]), axis=1) * 1.4826
        meds[full + 1], scales[full + 1] = med, np.maximum(mad, 1e-12 + 1e-6 * np.abs(med))
    for j in wanted[ends[wanted] < W].tolist():
        win = arr[: ends[j]]
        med = float(np.median(win))
        mad = float(np.median(np.abs(win - med))) * 1.4826
        meds[1 + j], scales[1 + j] = med, max(mad, 1e-12 + 1e-6 * abs(med))


def _spikes(v: np.ndarray, med, scale, th) -> np.ndarray:
    """``is_spike`` over arrays."""
    floor = th["loss_spike.min_delta"]
    return ((v - med) / scale > th["loss_spike.factor"]) & (v - med > np.maximum(0.5 * np.abs(med), floor))


def _spike_plan(ks: dict | None, fin: np.ndarray, th):
    """(values to append, final age, final baseline) when no value of ``fin`` is a spike, else None."""
    old = list(ks["window"]) if ks else []
    age, baseline = (ks["age"], ks.get("baseline")) if ks else (SPIKE_REFRESH, None)
    tail = fin[-int(th["loss_spike.window"]) :].tolist()
    found = _spike_baselines(old, age, baseline, fin, th)
    if found is None:
        return None
    first, recompute, meds, scales, which = found
    if recompute is None:
        return tail, age, baseline
    if _spikes(fin[first:], meds[which], scales[which], th).any():
        return None
    c = len(fin) - first
    if len(recompute):
        final_age = c - int(recompute[-1])
        baseline = (float(meds[-1]), float(scales[-1]))
    else:
        final_age = age + c
    return tail, final_age, baseline


def bulk_loss_divergence(state: dict, cols: Columns) -> bool:
    """No finite loss of the batch is above factor x the run's first loss (nor is an episode open), and no
    watched loss is still in its first early_window values (those go record by record, with the LRs)."""
    th = cols.th
    factor, early = th["loss_divergence.factor"], th["loss_divergence.early_window"]
    if len(state.get(LRS, ())) < 2 * early and any(k in cols.scalars for k in LR_KEYS):
        return False
    plans = []
    for key, _, vals in cols.losses:
        fin = vals[np.isfinite(vals)]
        if not len(fin) or not watched(state, key, th):
            continue
        ks = state.get(key)
        if ks is None or ks["first"] is None or ks["n"] < early:
            return False
        if (fin > factor * ks["first"]).any():
            return False  # possibly a divergence (or an open one going on): record by record
        plans.append((key, fin))
    W = int(th["loss_divergence.window"])
    for key, fin in plans:
        ks = state[key]
        ks["n"] += len(fin)
        ks["recent"].extend(fin[-W:].tolist())
        healthy_run(ks, len(fin), th["loss_divergence.cooldown"])
    return True


# -- the same rules over a whole series, for a replay (rules/backtest.py): where episodes open, nothing else --


def replay_series(kinds, values: np.ndarray, th: dict) -> list[tuple[int, str]]:
    """(index, kind) of every loss alert the rules of ``kinds`` raise on one loss key's values, from a fresh state:
    what ``observe`` record by record would raise, without the episodes' updates (a replay does not show them)."""
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    where = np.flatnonzero(finite)  # the finite values' indices: the spike and divergence rules skip the rest
    out = []
    if "nan_loss" in kinds:
        out += [(i, "nan_loss") for i in _openings(np.flatnonzero(~finite), th["nan_loss.cooldown"])]
    if "loss_spike" in kinds:
        out += [
            (int(where[i]), "loss_spike")
            for i in _openings(_spike_series(values[finite], th), th["loss_spike.cooldown"])
        ]
    if "loss_divergence" in kinds:
        out += [(int(where[i]), "loss_divergence") for i in _divergences(values[finite], th)]
    return out


def _close_after(cooldown: float) -> int:
    """Healthy checks in a row that end an episode (``episode``: at least one)."""
    return max(1, int(math.ceil(cooldown)))


def _openings(bad: np.ndarray, cooldown: float) -> list[int]:
    """The checks of ``bad`` (indices, increasing) that open an episode: the first, and any after enough healthy ones."""
    if not len(bad):
        return []
    gaps = np.diff(bad) - 1
    return [int(bad[0])] + bad[1:][gaps >= _close_after(cooldown)].tolist()


def _aged(age: int, n: int) -> int:
    """The spike rule's age after ``n`` more checks (each: recompute at SPIKE_REFRESH, then one older)."""
    if n <= 0:
        return age
    t = (0 if age >= SPIKE_REFRESH else age) + n
    return t if t <= SPIKE_REFRESH else (t - SPIKE_REFRESH - 1) % SPIKE_REFRESH + 1


def _spike_series(fin: np.ndarray, th: dict) -> np.ndarray:
    """Indices of the spikes in a finite series: healthy stretches at numpy speed, each run of spikes (checked
    against one unchanging baseline: a spike does not enter the window) in one comparison."""
    W = int(th["loss_spike.window"])
    old, age, baseline, pos, spikes = [], SPIKE_REFRESH, None, 0, []
    while pos < len(fin):
        rest = fin[pos:]
        first, recompute, meds, scales, which = _spike_baselines(old, age, baseline, rest, th, lazy=True)
        if recompute is None:
            break
        hits = np.flatnonzero(_spikes(rest[first:], meds[which], scales[which], th))
        if not len(hits):
            break
        k = int(hits[0])  # checked index of the first spike
        old = np.concatenate([np.asarray(old, dtype=np.float64), rest[: first + k]])[-W:].tolist()
        b = int(which[k])
        baseline = (float(meds[b]), float(scales[b]))
        age = k - int(recompute[b - 1]) + 1 if b else age + k + 1  # after the spike's own check
        after = rest[first + k + 1 :]
        calm = np.flatnonzero(~_spikes(after, baseline[0], baseline[1], th))
        n = int(calm[0]) if len(calm) else len(after)  # more spikes in a row
        spikes.append(pos + first + np.arange(k, k + n + 1))
        age = _aged(age, n)
        pos += first + k + 1 + n
    return np.concatenate(spikes) if spikes else np.empty(0, dtype=np.int64)


def _divergences(fin: np.ndarray, th: dict) -> list[int]:
    """Indices where a divergence episode opens in a finite series (``check_loss_divergence``'s verdicts)."""
    factor, W, close = (
        th["loss_divergence.factor"],
        int(th["loss_divergence.window"]),
        _close_after(th["loss_divergence.cooldown"]),
    )
    nonzero = np.flatnonzero(fin != 0.0)
    if not len(nonzero):
        return []
    f0 = int(nonzero[0])
    early = fin[2 : int(th["loss_divergence.early_window"])]
    low = float(np.min(fin[:2])) if len(fin) >= 2 else 0.0
    if low > 0 and (early >= th["loss_divergence.early_factor"] * low).any():
        return _divergences_one_by_one(fin, th)  # a blow-up at the start: its episode is the rule's to shape
    above = f0 + 1 + np.flatnonzero(fin[f0 + 1 :] > factor * abs(float(fin[f0])))  # the only checks that can be bad
    out, i = [], 0
    while i < len(above):
        # closed: bad only with a jump over the recent median too (computed at the candidates alone)
        cand = above[i:]
        jump = np.array([fin[a] > factor * np.median(fin[max(0, a - W) : a]) for a in cand[:64].tolist()])
        if not jump.any():
            i += len(jump)
            continue
        i += int(np.flatnonzero(jump)[0])
        out.append(int(above[i]))
        # open: bad while above; it ends after ``close`` checks in a row below
        gaps = np.diff(above[i:]) - 1
        ends = np.flatnonzero(gaps >= close)
        if not len(ends):
            break  # open to the end (a gap before the end closes it, but no candidate is left to open again)
        i += int(ends[0]) + 1
    return out


def _divergences_one_by_one(fin: np.ndarray, th: dict) -> list[int]:
    """``_divergences`` by running the rule itself on each value (a series with an early blow-up)."""
    state: dict = {}
    return [
        i
        for i, v in enumerate(fin.tolist())
        if any(not a.update for a in check_loss_divergence(state, Observation(i, {"loss": v}), th))
    ]


RULES = (
    Rule("nan", "nan_loss", check_nan_loss, bulk_nan_loss, losses=True),
    Rule("spike", "loss_spike", check_loss_spike, bulk_loss_spike, losses=True),
    Rule(
        "divergence",
        "loss_divergence",
        check_loss_divergence,
        bulk_loss_divergence,
        reads=frozenset(LR_KEYS),
        losses=True,
        start=divergence_start,
    ),
)
