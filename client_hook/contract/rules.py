"""A ``RuleSpec`` per health rule: its kind, thresholds (defaults and ranges), severity, one-line doc.

The server's rules (server/health/) bind their checks to these specs by kind; the client validates
``init(alerts=...)`` against the same thresholds so a typo fails at once, in the user's script; the
pages get kinds, severities and defaults from /contract.js. A rule registered at run time declares
its own spec (``declare``) and from then on is everywhere a built-in one is. Standard library only.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from gradwatch.contract.options import SEVERITIES

MAX_WINDOW = 1000  # most steps in any rule's window (loss_spike.window etc.; docs/security.md)

# (low, high, low inclusive) for each kind of setting, by the part after the dot.
RANGES: dict[str, tuple[float, float, bool]] = {
    # a window is kept and re-sorted per check: its bound is what one run may cost the server's writer
    "window": (1, MAX_WINDOW, True),
    "min_history": (1, 1e7, True),
    "patience": (1, 1e7, True),
    "cooldown": (1, 1e7, True),
    "skips": (1, 1e7, True),
    "factor": (1.0, math.inf, False),
    "early_factor": (1.0, math.inf, False),
    "ceiling": (0.0, math.inf, False),
    "min_delta": (0.0, math.inf, True),
    "min_norm": (0.0, math.inf, True),
    "ratio": (0.0, 1.0, False),
    "fraction": (0.0, 1.0, False),
    "level": (0.0, math.inf, False),
    "early_window": (1, MAX_WINDOW, True),
    "lr_window": (1, MAX_WINDOW, True),
    "lr_growth": (1.0, math.inf, False),
    "loss_rise": (1.0, math.inf, False),
    "grad_growth": (1.0, math.inf, False),
}
INTEGERS = (
    "window",
    "min_history",
    "patience",
    "cooldown",
    "skips",
    "early_window",
    "lr_window",
)  # settings that count steps
# What a setting is measured in, by name (a threshold may say otherwise: throughput_drop.min_delta is seconds).
UNITS = {
    "window": "steps",
    "min_history": "steps",
    "patience": "steps",
    "cooldown": "steps",
    "skips": "skipped steps",
    "factor": "×",
    "early_factor": "×",
    "ceiling": "gradient norm",
    "min_delta": "loss units",
    "min_norm": "gradient norm",
    "ratio": "ratio",
    "fraction": "fraction of 1",
    "level": "ratio",
    "lr_window": "steps",
    "lr_growth": "×",
    "loss_rise": "×",
    "grad_growth": "×",
}
# What a setting means when its rule does not say more (the common bookkeeping of every rule).
DOCS = {
    "window": "recent values the rule compares against",
    "min_history": "values seen before the rule may alert",
    "patience": "steps in a row before it alerts",
    "cooldown": "quiet steps that end an episode (a new one alerts again)",
}


class Threshold(NamedTuple):
    """One setting of a rule: its name after the dot, default, what it means and its unit; its range is by name."""

    setting: str
    default: float
    doc: str = ""
    unit: str = ""

    @property
    def meaning(self) -> str:
        """Its one-line meaning: its own doc, else the common one of its setting."""
        return self.doc or DOCS.get(self.setting, "")

    @property
    def units(self) -> str:
        """What it is measured in: its own unit, else its setting's."""
        return self.unit or UNITS.get(self.setting, "")


class RuleSpec:
    """What is known about a health rule without running it (its check lives in server/health/).

    Args:
        kind: the alert kind it raises; its thresholds are named ``<kind>.<setting>``.
        title: what happened, as words for the pages ("Loss spike"); by default the kind spelled out.
        severity: the severity of its alerts (a few raise the other one in a worse case).
        doc: what it detects and why, in one line.
        thresholds: its settings with their defaults.
        worse: ``"smaller"`` when a recurrence with a smaller |value| is the worse one (e.g. a ratio).
        nonfinite_value: its alert value may be NaN/inf, and that is the point: keep it.
    """

    __slots__ = ("kind", "severity", "doc", "thresholds", "worse", "nonfinite_value", "title")

    def __init__(
        self, kind: str, severity: str, doc: str, thresholds=(), worse="larger", nonfinite_value=False, title=""
    ):
        if severity not in SEVERITIES:
            raise ValueError(f"rule {kind!r}: severity must be one of {SEVERITIES}, got {severity!r}")
        if worse not in ("larger", "smaller"):
            raise ValueError(f"rule {kind!r}: worse must be 'larger' or 'smaller', got {worse!r}")
        for t in thresholds:
            if t.setting not in RANGES:
                raise ValueError(f"threshold {kind}.{t.setting}: no range for {t.setting!r} (known: {sorted(RANGES)})")
        self.kind, self.severity, self.doc = kind, severity, doc
        self.thresholds: tuple[Threshold, ...] = tuple(thresholds)
        self.worse, self.nonfinite_value = worse, bool(nonfinite_value)
        self.title = title or spelled(kind)

    def __repr__(self) -> str:
        return f"RuleSpec({self.kind!r}, {self.severity!r}, thresholds={len(self.thresholds)})"

    @property
    def smaller_is_worse(self) -> bool:
        """Whether a recurrence with a smaller |value| is the worse one."""
        return self.worse == "smaller"

    @property
    def defaults(self) -> dict[str, float]:
        """Its thresholds' full names and defaults."""
        return {f"{self.kind}.{t.setting}": t.default for t in self.thresholds}


def spelled(kind: str) -> str:
    """A kind as words: "loss_spike" -> "Loss spike"."""
    return kind.replace("_", " ").capitalize()


def _t(setting: str, default: float, doc: str = "", unit: str = "") -> Threshold:
    return Threshold(setting, default, doc, unit)


BUILT_IN: tuple[RuleSpec, ...] = (
    RuleSpec(
        "nan_loss",
        "critical",
        "A loss that is NaN or +/-inf: training has diverged at this exact step.",
        (_t("cooldown", 10, "finite-loss steps that end a NaN episode"),),
        nonfinite_value=True,
        title="Loss is NaN",
    ),
    RuleSpec(
        "loss_spike",
        "warning",
        "A finite loss far outside its recent robust spread (median + factor x MAD).",
        (
            _t("factor", 10.0, "robust z-score (median / MAD) over the window", "MADs"),
            _t("window", 100),
            _t("min_history", 20),
            _t("cooldown", 20, "steps back in range before a new spike episode"),
            _t("min_delta", 1e-4, "absolute floor: a rise smaller than this over the median is never a spike"),
        ),
        title="Loss spike",
    ),
    RuleSpec(
        "loss_divergence",
        "critical",
        "A finite loss that jumps to many times both the run's first loss and its recent median.",
        (
            _t("factor", 10.0, "x above the run's first loss and its recent median"),
            _t("window", 10, "recent values whose median is the short-term reference"),
            _t("cooldown", 20, "steps back under factor x the first loss to end it"),
            _t(
                "early_factor",
                3.0,
                "x the median of the first two values, two values in a row at 2x, within early_window values",
            ),
            _t("early_window", 10, "values of a loss in which a rise of early_factor is flagged at once"),
        ),
        title="Loss diverged",
    ),
    RuleSpec(
        "nonfinite_gradients",
        "critical",
        "NaN/inf inside gradients, naming the first parameters (input side) affected, or the loss if it went first.",
        (_t("cooldown", 10, "finite-gradient steps that end an episode"),),
        nonfinite_value=True,
        title="NaN/inf gradients",
    ),
    RuleSpec(
        "exploding_gradients",
        "warning",
        "Global grad norm far above its own rolling median (or its first steps'), or past an absolute ceiling.",
        (
            _t("ceiling", 1000.0, "absolute global-norm warning level"),
            _t("factor", 100.0, "x over the rolling median of the run's own norms"),
            _t("early_factor", 1000.0, "x over the median of the first steps, before min_history"),
            _t("window", 50),
            _t("min_history", 10),
            _t("cooldown", 20, "healthy steps in a row that end an episode"),
            _t("min_norm", 0.1, "absolute floor: a global norm below this is never relatively exploding"),
        ),
        title="Exploding gradients",
    ),
    RuleSpec(
        "vanishing_gradients",
        "warning",
        "Early layers' gradient norms orders of magnitude below the late layers', for many steps.",
        (
            _t("ratio", 1e-3, "early-layer / late-layer norm ratio"),
            _t("patience", 20, "consecutive steps below the ratio"),
            _t("cooldown", 20),
        ),
        worse="smaller",
        title="Vanishing gradients",
    ),
    RuleSpec(
        "zero_gradients",
        "warning",
        "Parameters whose gradient is exactly zero for many consecutive steps (dead or disconnected).",
        (_t("patience", 20, "consecutive steps with an exactly-zero gradient"), _t("cooldown", 10)),
        worse="smaller",
        title="Zero gradients",
    ),
    RuleSpec(
        "missing_gradients",
        "warning",
        "Parameters that require grad but get no gradient at all (.grad is None) step after step.",
        (_t("patience", 5, "consecutive steps with .grad None"), _t("cooldown", 5)),
        title="Missing gradients",
    ),
    RuleSpec(
        "memory_pressure",
        "warning",
        "CUDA memory reserved close to the device's capacity: an OOM is near.",
        (_t("fraction", 0.95, "CUDA reserved / device total"), _t("cooldown", 20)),
        title="Memory pressure",
    ),
    RuleSpec(
        "amp_overflow",
        "warning",
        "GradScaler keeps skipping steps (loss scale keeps dropping): fp16 overflow every few steps.",
        (_t("skips", 5, "skipped AMP steps ..."), _t("window", 100, "... within this many scaler updates")),
        title="AMP overflow",
    ),
    RuleSpec(
        "loss_plateau",
        "warning",
        "A loss that has not fallen at all over its first N values: the run may not be learning.",
        (
            _t("patience", 200, "finite values of a loss after which it must have fallen"),
            _t("ratio", 0.99, "... below this x its start (medians of its first and latest values)"),
        ),
        title="Loss plateau",
    ),
    RuleSpec(
        "instability_warning",
        "warning",
        "Update/weight ratios (‖Δw‖/‖w‖) growing past a safe size, or an LR still rising while the loss climbs "
        "above its best or the gradient norm grows: a warning tens of steps before a divergence.",
        (
            _t("level", 0.1, "median update/weight ratio (largest matrix) of the last 10 steps ..."),
            _t("factor", 1.5, "... and that many x its median over the baseline window"),
            _t("window", 100, "baseline: this many steps, ending window/2 steps ago"),
            _t("min_history", 60, "update ratios seen before the rule may warn"),
            _t("cooldown", 50, "quiet steps (quiet checks, for the LR ramp) that end a warning episode"),
            _t("lr_growth", 2.0, "LR ramp: the LR grew this many x over the last lr_window steps and still rises ..."),
            _t(
                "lr_window",
                50,
                "... over this many steps (the gradient norm's baseline: lr_window/2 steps before them)",
            ),
            _t("loss_rise", 2.0, "... while the loss (median of 10) stands this many x above its best so far ..."),
            _t("grad_growth", 3.0, "... or the gradient norm (median of 10 steps) this many x its baseline ..."),
            _t("patience", 5, "... this many checks in a row"),
        ),
        title="Instability ahead",
    ),
    RuleSpec(
        "throughput_drop",
        "warning",
        "Step time sustained far above the run's own median (throughput down by a fraction), naming data waits.",
        (
            _t("fraction", 0.3, "throughput this far below the run's median (step time >= median / 0.7) ..."),
            _t("patience", 20, "... as the median of this many steps"),
            _t("window", 200, "the run's median step time over this many healthy steps"),
            _t("min_history", 50, "step times seen before the rule may alert"),
            _t("cooldown", 50, "normal-pace steps that end an episode"),
            _t("min_delta", 0.01, "a slowdown smaller than this per step is never a drop", "seconds"),
        ),
        title="Throughput drop",
    ),
)

SPECS: dict[str, RuleSpec] = {}  # kind -> spec, built-ins first, then the ones declared at run time
DEFAULTS: dict[str, float] = {}  # every declared threshold's default (kept in place: importers hold it)


def declare(spec: RuleSpec) -> RuleSpec:
    """Add a rule's spec: its kind, severity and thresholds are known everywhere from now on.

    Args:
        spec: the spec; its kind must not be declared already.

    Returns:
        The spec.
    """
    if not isinstance(spec, RuleSpec):
        raise TypeError(f"expected a RuleSpec, got {type(spec).__name__}")
    if spec.kind in SPECS:
        raise ValueError(f"rule kind {spec.kind!r} is declared already")
    SPECS[spec.kind] = spec
    DEFAULTS.update(spec.defaults)
    return spec


def withdraw(kind: str) -> RuleSpec:
    """Remove a declared spec and its thresholds (KeyError when there is none)."""
    spec = SPECS.pop(kind)
    for name in spec.defaults:
        DEFAULTS.pop(name, None)
    return spec


def spec(kind: str) -> RuleSpec | None:
    """The spec of a rule kind, or None (a kind the server or the client raises itself)."""
    return SPECS.get(kind)


def kinds() -> tuple[str, ...]:
    """Every declared rule kind, in declaration order."""
    return tuple(SPECS)


for _spec in BUILT_IN:
    declare(_spec)

RULE_KINDS = tuple(s.kind for s in BUILT_IN)  # the built-in rules' kinds
# What the pages call the kinds no RuleSpec raises (a spec's own title names the others).
OTHER_TITLES = {
    "data_gap": "Data gap",
    "data_refused": "Data refused",
    "stalled": "Stalled",
    "custom_rule": "Custom rule",
    "straggler": "Straggler rank",
    "lr_suggestion": "LR suggestion",
    "nan_provenance": "Where the NaN was born",
}
# raised by the server about the data itself; custom_rule: a project's own rule on any metric (server/rules/)
SERVER_KINDS = ("data_gap", "data_refused", "stalled", "custom_rule", "straggler")
# sent by the client as alert events (missing_gradients: parameters left out of the optimizer;
# nan_provenance: where the first NaN/inf was born, capture/layer_signals.py); memory_pressure also
# comes from a client's OOM crash
CLIENT_KINDS = ("missing_gradients", "data_gap", "lr_suggestion", "nan_provenance")
ALERT_KINDS = tuple(dict.fromkeys(RULE_KINDS + SERVER_KINDS + CLIENT_KINDS))  # every kind an alert can have


def alert_kinds() -> tuple[str, ...]:
    """Every kind an alert can have now: the declared rules', the server's and the client's."""
    return tuple(dict.fromkeys(kinds() + SERVER_KINDS + CLIENT_KINDS))


# -- losses that are not meant to fall ----------------------------------------------------------
# ``init(alerts={"goal.loss_D": "none"})`` (or a project's thresholds) says what a loss key is for: "fall" (the
# plateau and divergence rules watch it) or "none" (an adversarial loss, an entropy bonus, a KL term: only
# NaN/inf and spikes). Without one, the run's declared loss_key falls, and a key whose name carries one of
# these words (split on non-letters; "lossD" counts as "d") does not.
GOAL_PREFIX = "goal."
GOALS = ("fall", "none")
NOT_MEANT_TO_FALL = frozenset(
    "d g disc discriminator gen generator adv adversarial gan critic entropy ent kl kld aux bonus reg penalty "
    "commit commitment".split()
)


def loss_goal(key: str, th: Mapping, main: str | None = None) -> str:
    """What a loss key is for: its declared goal, else "fall" for the run's loss, else by its name."""
    declared = th.get(GOAL_PREFIX + key)
    if declared in GOALS:
        return declared
    if key == main:
        return "fall"
    return _goal_by_name(key)


@functools.lru_cache(maxsize=4096)
def _goal_by_name(key: str) -> str:
    """A key's goal as its name tells it (cached: the rules ask for every loss of every step)."""
    last = key.rsplit("/", 1)[-1].lower()
    tokens = {t for t in re.split(r"[^a-z0-9]+", last) if t}
    tokens |= {t.replace("loss", "") for t in tokens if "loss" in t}
    return "none" if tokens & NOT_MEANT_TO_FALL else "fall"


def _goal(name: str, value: Any) -> str:
    if value not in GOALS:
        raise ValueError(f"alert setting {name!r} must be one of {', '.join(map(repr, GOALS))}, got {value!r}")
    if len(name) == len(GOAL_PREFIX):
        raise ValueError(f"alert setting {name!r} names no metric key (write {GOAL_PREFIX}<key>)")
    return value


# -- checking thresholds ------------------------------------------------------------------------
def _number(name: str, value: Any) -> float:
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ValueError(f"alert threshold {name!r} must be a number, got {type(value).__name__} {value!r}")
    try:
        number = float(value)  # ints, numpy scalars, 0-dim arrays and tensors
    except (TypeError, ValueError) as exc:
        raise ValueError(f"alert threshold {name!r} must be a number, got {type(value).__name__} {value!r}") from exc
    if math.isnan(number):
        raise ValueError(f"alert threshold {name!r} must be a number, got NaN")
    return number


def check(name: str, value: Any) -> float | str:
    """One threshold as a float (a ``goal.<key>`` as its goal), or ValueError saying what is wrong with it."""
    if isinstance(name, str) and name.startswith(GOAL_PREFIX):
        return _goal(name, value)
    if not isinstance(name, str) or name not in DEFAULTS:
        close = difflib.get_close_matches(str(name), DEFAULTS, n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown alert threshold {name!r}.{hint} Known: {', '.join(sorted(DEFAULTS))}")
    number = _number(name, value)
    part = name.split(".", 1)[1]
    low, high, inclusive = RANGES[part]
    if not ((low <= number if inclusive else low < number) and number <= high):
        bound = f"{'>=' if inclusive else '>'} {low:g}" + (f" and <= {high:g}" if high < math.inf else "")
        raise ValueError(f"alert threshold {name!r} must be {bound}, got {number:g}")
    if part in INTEGERS and number != int(number):
        raise ValueError(f"alert threshold {name!r} counts steps and must be a whole number, got {number:g}")
    return number


def validate(overrides: Mapping | None) -> dict[str, float]:
    """The overrides as {name: float}; ValueError for unknown names, non-numbers or out-of-range values."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ValueError(f"alerts must be a dict of threshold name -> number, got {type(overrides).__name__}")
    return {str(name): check(name, value) for name, value in overrides.items()}


def merged(overrides: Mapping | None) -> dict[str, float]:
    """DEFAULTS with every valid override applied; a bad one keeps its default (never raises)."""
    th = {k: float(v) for k, v in DEFAULTS.items()}
    if not isinstance(overrides, Mapping):
        return th
    for name, value in overrides.items():
        try:
            th[name] = check(name, value)
        except ValueError:
            pass
    return th


def of(kind: str) -> dict[str, float]:
    """The defaults of one alert kind's thresholds (``{}`` for a kind no declared rule raises)."""
    found = SPECS.get(kind)
    return dict(found.defaults) if found else {}


def title(kind: str) -> str:
    """What the pages call an alert kind: its spec's title, the server's or client's name, else the kind spelled out."""
    found = SPECS.get(kind)
    return found.title if found else OTHER_TITLES.get(kind) or spelled(kind)


def _threshold_js(t: Threshold) -> dict:
    low, high, inclusive = RANGES[t.setting]
    return {
        "default": t.default,
        "doc": t.meaning,
        "unit": t.units,
        "min": low,
        "max": high if high < math.inf else None,
        "inclusive": inclusive,
        "integer": t.setting in INTEGERS,
    }


def shared() -> dict:
    """What /contract.js carries about the rules, by JavaScript name."""
    return {
        "RULE_KINDS": list(kinds()),
        "RULE_SPECS": {
            s.kind: {
                "title": s.title,
                "severity": s.severity,
                "doc": s.doc,
                "worse": s.worse,
                "thresholds": s.defaults,
                "settings": {f"{s.kind}.{t.setting}": _threshold_js(t) for t in s.thresholds},
            }
            for s in SPECS.values()
        },
        "KIND_TITLES": {kind: title(kind) for kind in alert_kinds()},
        "THRESHOLD_DEFAULTS": dict(DEFAULTS),
    }
