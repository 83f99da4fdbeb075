"""Custom rules on any metric: a threshold, relative to a recent window, a z-score, or N of the last M steps.

Each rule follows one scalar key. A batch is judged against the ``window`` values before each value (all of
them, bad ones too), or, for ``n_of_m``, counted over the last ``m`` steps. An episode alerts once
(``custom_rule``, ``layer`` = the rule's name) at its first bad value and ends after ``cooldown`` good values
in a row, like the built-in rules; the state carries across batches.

The cost of a batch of k values is O(k + window) for every type, never O(k x window): ``n_of_m`` counts with
a running sum over the kept flags, ``zscore`` with running sums, ``relative`` keeps the window sorted
(one insertion and one removal per value). docs/security.md has the measurements.
"""

from __future__ import annotations

import bisect
from collections import deque

import numpy as np

from gradwatch.contract.options import CUSTOM_RULE_OPS as OPS
from gradwatch.contract.options import CUSTOM_RULE_TYPES as TYPES
from gradwatch_server.health.common import Alert, fmt

__all__ = ["OPS", "TYPES", "CustomRule", "run_custom"]


class CustomRule:
    """One validated custom rule (see policy.check_custom for its fields) and its state for one run."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.tail = np.empty(0)  # the latest values (the window the next batch is judged against; zscore)
        self.flags = np.empty(0, dtype=bool)  # the latest m-1 beyond-limit flags (n_of_m)
        self.good = None  # good values in a row since the last bad one (None: no episode open)
        self.count = 0  # values seen so far (min_history)

    def _beyond(self, values: np.ndarray, limit) -> np.ndarray:
        return values > limit if self.spec["op"] == ">" else values < limit

    def bad(self, values: np.ndarray) -> np.ndarray:
        """Which values of a batch are bad (NaN/inf never are: the built-in rules own those)."""
        s, kind = self.spec, self.spec["type"]
        if kind == "threshold":
            return self._beyond(values, s["value"]) & np.isfinite(values)
        if kind == "n_of_m":
            return self._n_of_m(values)
        ok = self.count + np.arange(len(values)) >= max(2, s["min_history"])  # the run's values before each
        self.count += len(values)
        if kind == "relative":
            medians = self._medians(values)
            out = np.zeros(len(values), dtype=bool)
            out[ok] = self._beyond(values[ok], s["factor"] * medians[ok])
            return out & np.isfinite(values)
        out = self._zscores(values, ok)
        self.tail = np.concatenate([self.tail, values])[-s["window"] :]
        return out & np.isfinite(values)

    def _n_of_m(self, values: np.ndarray) -> np.ndarray:
        """Beyond-limit flags counted over the last m steps up to each value (fewer at the run's start)."""
        m = self.spec["m"]
        flags = np.concatenate([self.flags, self._beyond(values, self.spec["value"]) & np.isfinite(values)])
        sums = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
        at = np.arange(len(self.flags), len(flags))  # the new values' places
        hits = sums[at + 1] - sums[np.maximum(0, at + 1 - m)]
        self.flags = flags[-(m - 1) :] if m > 1 else flags[:0]
        return hits >= self.spec["n"]

    def _medians(self, values: np.ndarray) -> np.ndarray:
        """The median (NaN left out, as numpy's nanmedian) of the ``window`` values before each value."""
        if not hasattr(self, "sorted"):
            self.sorted, self.recent = [], deque()  # the window's non-NaN values sorted; the window in order
        w, ordered, recent = self.spec["window"], self.sorted, self.recent
        out = np.empty(len(values))
        for i, v in enumerate(values.tolist()):
            n = len(ordered)
            out[i] = np.nan if n == 0 else (ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2)
            recent.append(v)
            if v == v:
                bisect.insort(ordered, v)
            if len(recent) > w:
                old = recent.popleft()
                if old == old:
                    del ordered[bisect.bisect_left(ordered, old)]
        return out

    def _zscores(self, values: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """z-scores against the ``window`` values before each value (running sums; a window with inf: 0)."""
        s, w = self.spec, self.spec["window"]
        seen = np.concatenate([self.tail, values])
        finite = np.isfinite(seen)
        shift = seen[finite][0] if finite.any() else 0.0  # sums of (x - shift): no cancellation on big offsets
        x = np.where(finite, seen - shift, 0.0)
        c = lambda a: np.concatenate([[0], np.cumsum(a)])  # noqa: E731
        count, total, squares = c(finite), c(x), c(x * x)
        infs = c(np.isinf(seen))
        at = np.arange(len(self.tail), len(seen))  # each new value's place; its window is [at - w, at)
        lo = np.maximum(0, at - w)
        n = count[at] - count[lo]
        mean = np.where(n > 0, (total[at] - total[lo]) / np.maximum(n, 1), np.nan)
        var = np.where(n > 0, (squares[at] - squares[lo]) / np.maximum(n, 1) - mean * mean, np.nan)
        sd = np.sqrt(np.maximum(var, 0.0))
        sd[(infs[at] - infs[lo]) > 0] = np.nan  # numpy's nanstd of a window holding inf is NaN: z = 0
        good = ok & (sd > 0) & (n > 0)
        z = np.zeros(len(values))
        z[good] = (values[good] - shift - mean[good]) / sd[good]
        return z > s["z"] if s["op"] == ">" else z < -s["z"]

    def check(self, steps: np.ndarray, values: np.ndarray) -> list[Alert]:
        """A batch of the rule's key: an Alert for each episode that opens."""
        bad = np.flatnonzero(self.bad(values))
        out, cooldown, n = [], self.spec["cooldown"], len(values)
        prev = None  # index of the previous bad value in this batch
        for i in bad.tolist():
            gap = (i - prev - 1) if prev is not None else (None if self.good is None else self.good + i)
            if gap is None or gap >= cooldown:
                out.append(self._alert(int(steps[i]), float(values[i])))
            prev = i
        if prev is not None:
            self.good = n - prev - 1
        elif self.good is not None:
            self.good += n
        if self.good is not None and self.good >= cooldown:
            self.good = None  # the episode ended
        return out

    def _alert(self, step: int, value: float) -> Alert:
        s = self.spec
        why = {
            "threshold": f"{s['op']} {fmt(s.get('value', 0.0))}",
            "n_of_m": f"{s['op']} {fmt(s.get('value', 0.0))} in {s.get('n')} of the last {s.get('m')} steps",
            "relative": f"{s['op']} {s.get('factor', 0):g}x the median of the {s['window']} values before it",
            "zscore": f"a z-score {s['op']} {'' if s['op'] == '>' else '-'}{s.get('z', 0):g} against the last {s['window']}",
        }[s["type"]]
        return Alert(
            "custom_rule",
            step,
            value,
            s["severity"],
            f"{s['name']}: {s['key']} is {fmt(value)} at step {step} ({why}).",
            layer=s["name"],
            key=s["key"],
        )


def run_custom(rules: list[CustomRule], steps, scalars) -> list[Alert]:
    """Every custom rule over a batch: ``scalars`` is key -> (rows, values) as Monitor.observe_batch takes."""
    out: list[Alert] = []
    for rule in rules:
        col = scalars.get(rule.spec["key"])
        if col is not None and len(col[1]):
            rows, values = col
            out += rule.check(np.asarray(steps)[rows], np.asarray(values, dtype=np.float64))
    return out
