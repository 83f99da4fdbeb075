"""Custom rules on any metric: a threshold, relative to a recent window, a z-score, or N of the last M steps.

Each rule follows one scalar key. A batch is judged at numpy speed: every value against the ``window``
values before it (all of them, bad ones too), or, for ``n_of_m``, counted over the last ``m`` steps. An
episode alerts once (``custom_rule``, ``layer`` = the rule's name) at its first bad value and ends after
``cooldown`` good values in a row, like the built-in rules; the state carries across batches.
"""

from __future__ import annotations

import numpy as np

from gradwatch.contract.options import CUSTOM_RULE_OPS as OPS
from gradwatch.contract.options import CUSTOM_RULE_TYPES as TYPES
from gradwatch_server.health.common import Alert, fmt

__all__ = ["OPS", "TYPES", "CustomRule", "run_custom"]


class CustomRule:
    """One validated custom rule (see policy.check_custom for its fields) and its state for one run."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.tail = np.empty(0)  # the latest values (the window the next batch is judged against)
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
            flags = np.concatenate([self.flags, self._beyond(values, s["value"]) & np.isfinite(values)])
            # the flags of the last m steps up to each value (fewer at the run's start: what there is)
            hits = np.convolve(flags, np.ones(s["m"], dtype=int))[: len(flags)][len(self.flags) :]
            self.flags = flags[-(s["m"] - 1) :] if s["m"] > 1 else flags[:0]
            return hits >= s["n"]
        w = s["window"]
        seen = np.concatenate([self.tail, values])
        before = len(self.tail)
        counted = self.count + np.arange(len(values))  # values the run had before each of these
        self.count += len(values)
        self.tail = seen[-w:]
        ok = counted >= max(2, s["min_history"])
        out = np.zeros(len(values), dtype=bool)
        if not ok.any():
            return out
        pad = np.concatenate([np.full(w, np.nan), seen])
        wins = np.lib.stride_tricks.sliding_window_view(pad, w)[before + np.flatnonzero(ok)]  # the w values before
        if kind == "relative":
            out[ok] = self._beyond(values[ok], s["factor"] * np.nanmedian(wins, axis=1))
        else:
            mean, sd = np.nanmean(wins, axis=1), np.nanstd(wins, axis=1)
            z = np.where(sd > 0, (values[ok] - mean) / np.where(sd > 0, sd, 1.0), 0.0)
            out[ok] = z > s["z"] if s["op"] == ">" else z < -s["z"]
        return out & np.isfinite(values)

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
