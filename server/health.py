"""Health rules: pure functions over a run's metric stream that say when training is broken.

Each rule is ``check_<kind>(state, obs, th) -> list[Alert]``: ``obs`` is one step's values,
``th`` the thresholds, ``state`` a small dict the rule owns (its memory of past steps, e.g.
a rolling window and whether an episode is open). Rules touch nothing else, so they are
tested by feeding them streams directly. One alert per episode: a rule that has fired
stays quiet until the condition clears.

The reasoning follows common PyTorch practice: a global gradient norm of 0 means the loss is
not connected to the parameters; hundreds to thousands (or orders of magnitude above the
run's own history) means exploding gradients; norms that shrink layer by layer towards the
input mean vanishing gradients; ``.grad is None`` means the graph was cut (detach, no_grad,
.item()) or the parameter is not used.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from gradwatch.protocol import is_loss_key

DEFAULTS: dict[str, float] = {
    "exploding_gradients.ceiling": 1000.0,   # absolute global-norm warning level
    "exploding_gradients.factor": 100.0,     # x over the rolling median of the run's own norms
    "exploding_gradients.window": 50,
    "exploding_gradients.min_history": 10,
    "vanishing_gradients.ratio": 1e-3,       # early-layer / late-layer norm ratio
    "vanishing_gradients.patience": 20,      # consecutive steps below the ratio
    "zero_gradients.patience": 20,           # consecutive steps with an exactly-zero gradient
    "missing_gradients.patience": 5,         # consecutive steps with .grad None
    "loss_spike.factor": 10.0,               # robust z-score (median / MAD) over the window
    "loss_spike.window": 100,
    "loss_spike.min_history": 20,
    "loss_spike.cooldown": 20,               # steps back in range before a new spike episode
    "memory_pressure.fraction": 0.95,        # CUDA reserved / device total
    "amp_overflow.skips": 5,                 # skipped AMP steps ...
    "amp_overflow.window": 100,              # ... within this many scaler updates
}

GRAD_VECTOR = "grad"
_INF = math.inf


@dataclass
class Alert:
    kind: str
    step: int | None
    value: float | None
    severity: str
    message: str
    layer: str | None = None
    key: str | None = None


@dataclass
class Observation:
    """One step as the rules see it: scalars by key, per-layer gradient norms by name."""

    step: int
    scalars: dict
    layers: list = field(default_factory=list)      # parameter names, input to output
    norms: list = field(default_factory=list)       # float, or None when .grad was None


def thresholds(overrides: dict | None = None) -> dict:
    """DEFAULTS with known overrides applied (unknown names are ignored)."""
    th = dict(DEFAULTS)
    for name, value in (overrides or {}).items():
        if name in th:
            try:
                th[name] = float(value)
            except (TypeError, ValueError):
                pass
    return th


def _fmt(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return f"{x:.4g}"


def _names(names: list, limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_nan_loss(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """A loss that is NaN or +/-inf: training has diverged at this exact step."""
    out = []
    for key, value in obs.scalars.items():
        if not is_loss_key(key):
            continue
        open_ = state.setdefault("open", set())
        if math.isfinite(value):
            open_.discard(key)
        elif key not in open_:
            open_.add(key)
            out.append(Alert("nan_loss", obs.step, value, "critical", key=key, message=(
                f"{key} is {_fmt(value)} at step {obs.step}. Likely causes: learning rate too high, "
                "exploding gradients (clip them: torch.nn.utils.clip_grad_norm_), log or division of zero "
                "(add an epsilon), or bad input (NaN in the data).")))
    return out


def check_nonfinite_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """NaN/inf inside gradients, naming the first parameters (input side) affected."""
    g = obs.scalars.get("grad/global_norm")
    # The global norm is the L2 norm of the layer norms: when it is finite, every layer's is too.
    bad = [] if g is not None and math.isfinite(g) else [
        n for n, v in zip(obs.layers, obs.norms) if v is not None and not -_INF < v < _INF]
    if not bad and (g is None or math.isfinite(g)):
        state["open"] = False
        return []
    if state.get("open"):
        return []
    state["open"] = True
    value = g if g is not None else math.nan
    where = f" in {_names(bad)}" if bad else ""
    return [Alert("nonfinite_gradients", obs.step, value, "critical", layer=bad[0] if bad else None,
                  key="grad/global_norm", message=(
                      f"Gradients contain NaN/inf{where} at step {obs.step}. The first listed parameter is "
                      "nearest the input where it starts. Check for log(0), sqrt of negatives, division by "
                      "zero or overflow in fp16; lower the learning rate or clip gradients."))]


def check_exploding_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Global grad norm far above its own rolling median, or past an absolute ceiling."""
    g = obs.scalars.get("grad/global_norm")
    if g is None or not math.isfinite(g):
        return []
    history = state.setdefault("history", deque(maxlen=int(th["exploding_gradients.window"])))
    baseline = statistics.median(history) if len(history) >= th["exploding_gradients.min_history"] else None
    history.append(g)
    relative = baseline is not None and baseline > 0 and g > th["exploding_gradients.factor"] * baseline
    if not (g > th["exploding_gradients.ceiling"] or relative):
        state["open"] = False
        return []
    if state.get("open"):
        return []
    state["open"] = True
    top = _largest_layer(obs)
    why = (f"{g / baseline:.0f}x its recent median {_fmt(baseline)}" if relative
           else f"above the {_fmt(th['exploding_gradients.ceiling'])} warning level")
    return [Alert("exploding_gradients", obs.step, g, "warning", layer=top, key="grad/global_norm", message=(
        f"Global gradient norm {_fmt(g)} at step {obs.step} is {why}"
        + (f"; largest in {top}" if top else "")
        + ". Clip gradients (clip_grad_norm_), lower the learning rate or add warmup before the loss goes NaN."))]


def _largest_layer(obs: Observation) -> str | None:
    finite = [(v, n) for n, v in zip(obs.layers, obs.norms) if v is not None and math.isfinite(v)]
    return max(finite)[1] if finite else None


def check_vanishing_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Early layers' gradient norms orders of magnitude below the late layers', for many steps."""
    # This runs every step over every layer, so the usual case (all norms positive and finite: a
    # finite global norm rules out NaN/inf) skips the per-element filter.
    g = obs.scalars.get("grad/global_norm")
    if g is not None and math.isfinite(g) and None not in obs.norms and 0.0 not in obs.norms:
        pairs = list(zip(obs.layers, obs.norms))
    else:
        pairs = [(n, v) for n, v in zip(obs.layers, obs.norms) if v and 0 < v < _INF]
    if len(pairs) < 4:
        return []
    quarter = max(1, len(pairs) // 4)
    early = statistics.median(v for _, v in pairs[:quarter])
    late = statistics.median(v for _, v in pairs[-quarter:])
    ratio = early / late if late > 0 else 1.0
    if ratio >= th["vanishing_gradients.ratio"]:
        state["count"], state["open"] = 0, False
        return []
    state["count"] = state.get("count", 0) + 1
    if state.get("open") or state["count"] < th["vanishing_gradients.patience"]:
        return []
    state["open"] = True
    weakest = [n for n, _ in sorted(pairs[:quarter], key=lambda p: p[1])]
    return [Alert("vanishing_gradients", obs.step, ratio, "warning", layer=weakest[0], key="grad", message=(
        f"Gradients vanish towards the input: the first layers' norms are {ratio:.1e} of the last layers' "
        f"for {state['count']} steps (weakest: {_names(weakest, 3)}). Try ReLU-family activations instead of "
        "sigmoid/tanh, residual connections, normalization layers, or Kaiming/Xavier initialization."))]


def _streaks(state: dict, obs: Observation, bad, patience: float, any_bad: bool = True) -> list:
    """Layers whose per-step condition has just held for ``patience`` steps in a row."""
    counts = state.setdefault("counts", {})
    reported = state.setdefault("reported", set())
    if not any_bad and not counts and not reported:
        return []  # the common healthy step: nothing to count, nothing to reset
    newly = []
    for name, v in zip(obs.layers, obs.norms):
        if bad(v):
            counts[name] = counts.get(name, 0) + 1
            if counts[name] >= patience and name not in reported:
                reported.add(name)
                newly.append(name)
        else:
            counts.pop(name, None)
            reported.discard(name)
    return newly


def check_zero_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Parameters whose gradient is exactly zero for many consecutive steps (dead or disconnected)."""
    newly = _streaks(state, obs, lambda v: v == 0.0, th["zero_gradients.patience"], 0.0 in obs.norms)
    if not newly:
        return []
    everything = obs.scalars.get("grad/global_norm") == 0.0
    if everything:
        message = (f"The global gradient norm has been exactly 0 for {int(th['zero_gradients.patience'])} steps: "
                   "the loss is not connected to the parameters. Is the loss computed from the model output? "
                   "Look for .detach(), torch.no_grad(), .item() or a multiplication by zero on the path.")
    else:
        message = (f"Exactly-zero gradients for {int(th['zero_gradients.patience'])}+ steps in {_names(newly)}. "
                   "Likely dead ReLUs (try LeakyReLU/lower LR), a multiplication by zero, or a constant path.")
    return [Alert("zero_gradients", obs.step, 0.0, "critical" if everything else "warning", layer=newly[0],
                  key="grad", message=message)]


def check_missing_gradients(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """Parameters that require grad but get no gradient at all (.grad is None) step after step."""
    newly = _streaks(state, obs, lambda v: v is None, th["missing_gradients.patience"], None in obs.norms)
    if not newly:
        return []
    prefixes = sorted({n.rsplit(".", 1)[0] if "." in n else n for n in newly})
    return [Alert("missing_gradients", obs.step, float(len(newly)), "warning", layer=newly[0], key="grad", message=(
        f"{len(newly)} parameter(s) get no gradient (grad is None) in modules {_names(prefixes)}. The graph is "
        "cut before them (.detach(), torch.no_grad(), .item(), numpy round-trip) or they are unused in forward. "
        "If they are frozen on purpose, set requires_grad=False."))]


def check_loss_spike(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """A finite loss far outside its recent robust spread (median + factor x MAD)."""
    out = []
    for key, value in obs.scalars.items():
        if not is_loss_key(key) or not math.isfinite(value):
            continue
        ks = state.setdefault(key, {"window": deque(maxlen=int(th["loss_spike.window"])), "open": False})
        window = ks["window"]
        spike = False
        if len(window) >= th["loss_spike.min_history"]:
            # The robust baseline moves slowly: refreshing it every 8 steps instead of every step
            # keeps the writer fast at thousands of steps/s and changes no verdict that matters.
            if ks.get("age", 8) >= 8:
                med = statistics.median(window)
                mad = statistics.median(abs(x - med) for x in window) * 1.4826
                ks["baseline"], ks["age"] = (med, max(mad, 1e-12 + 1e-6 * abs(med))), 0
            (med, scale), ks["age"] = ks["baseline"], ks["age"] + 1
            spike = (value - med) / scale > th["loss_spike.factor"] and value - med > 0.5 * abs(med)
        if spike and not ks["open"] and ks.get("quiet", 0) <= 0:
            out.append(Alert("loss_spike", obs.step, value, "warning", key=key, message=(
                f"{key} jumped to {_fmt(value)} at step {obs.step}, far above its recent median {_fmt(med)}. "
                "Often a bad batch, a learning-rate schedule step, or the start of divergence: watch the "
                "gradient norm; consider clipping or a lower learning rate.")))
        # The episode lasts until the loss has been back in range for a while (aftershocks of one
        # bad batch are the same episode, not new alerts).
        if spike:
            ks["open"], ks["quiet"] = True, int(th["loss_spike.cooldown"])
        else:
            ks["quiet"] = ks.get("quiet", 0) - 1
            ks["open"] = False
            window.append(value)
    return out


def check_memory_pressure(state: dict, obs: Observation, th: dict, total: float | None) -> list[Alert]:
    """CUDA memory reserved close to the device's capacity: an OOM is near."""
    reserved = obs.scalars.get("memory/cuda_reserved")
    if reserved is None or not total:
        return []
    frac = reserved / total
    if frac < th["memory_pressure.fraction"]:
        state["open"] = False
        return []
    if state.get("open"):
        return []
    state["open"] = True
    return [Alert("memory_pressure", obs.step, reserved, "warning", key="memory/cuda_reserved", message=(
        f"CUDA memory at {frac:.0%} of the device ({reserved / 2**30:.1f} of {total / 2**30:.1f} GiB) at step "
        f"{obs.step}. To make room: smaller batch with gradient accumulation, mixed precision (torch.autocast), "
        "activation checkpointing, or free tensors kept across steps (e.g. accumulating losses with graph)."))]


def check_amp_overflow(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """GradScaler keeps skipping steps (loss scale keeps dropping): fp16 overflow every few steps."""
    scale = obs.scalars.get("amp/scale")
    if scale is None:
        return []
    drops = state.setdefault("drops", deque(maxlen=int(th["amp_overflow.window"])))
    prev = state.get("prev")
    state["prev"] = scale
    drops.append(1 if prev is not None and scale < prev else 0)
    skipped = sum(drops)
    if skipped < th["amp_overflow.skips"]:
        if skipped == 0:
            state["open"] = False
        return []
    if state.get("open"):
        return []
    state["open"] = True
    return [Alert("amp_overflow", obs.step, scale, "warning", key="amp/scale", message=(
        f"The AMP GradScaler skipped {skipped} of the last {len(drops)} steps (loss scale now {_fmt(scale)}): "
        "gradients overflow fp16. Check for very large activations or losses, use bf16 if the GPU supports it, "
        "or lower the learning rate."))]


class Monitor:
    """Runs every rule over a run's stream, keeping each rule's state between steps."""

    def __init__(self, th: dict | None = None, meta: dict | None = None):
        self.th = th or thresholds()
        self.total_memory = (meta or {}).get("cuda_total_memory")
        self.states: dict[str, dict] = {}

    def observe(self, step: int, scalars: dict, vectors: dict) -> list[Alert]:
        """Feed one record; ``vectors`` maps key -> (layout names, values)."""
        layout, norms = vectors.get(GRAD_VECTOR, (None, None))
        obs = Observation(step, scalars, list(layout or []), list(norms or []))
        if len(obs.layers) != len(obs.norms):
            obs.layers = [f"param[{i}]" for i in range(len(obs.norms))]
        s = self.states
        alerts = check_nan_loss(s.setdefault("nan", {}), obs, self.th)
        alerts += check_loss_spike(s.setdefault("spike", {}), obs, self.th)
        if "grad/global_norm" in scalars or obs.norms:
            alerts += check_nonfinite_gradients(s.setdefault("nonfinite", {}), obs, self.th)
            alerts += check_exploding_gradients(s.setdefault("exploding", {}), obs, self.th)
            alerts += check_vanishing_gradients(s.setdefault("vanishing", {}), obs, self.th)
            alerts += check_zero_gradients(s.setdefault("zero", {}), obs, self.th)
            alerts += check_missing_gradients(s.setdefault("missing", {}), obs, self.th)
        alerts += check_memory_pressure(s.setdefault("memory", {}), obs, self.th, self.total_memory)
        alerts += check_amp_overflow(s.setdefault("amp", {}), obs, self.th)
        return alerts

    def on_exception(self, error: dict) -> list[Alert]:
        """An out-of-memory crash is recorded as a memory_pressure alert with the memory state."""
        text = f"{error.get('exc_type')}: {error.get('message')}"
        if "out of memory" not in text.lower() and "OutOfMemoryError" not in text:
            return []
        memory = error.get("memory") or {}
        detail = ", ".join(f"{k.split('/')[-1]}={v / 2**20:.0f} MiB" for k, v in memory.items()
                           if isinstance(v, (int, float)))
        return [Alert("memory_pressure", error.get("step"), memory.get("memory/cuda_reserved"), "critical",
                      key="memory/cuda_reserved", message=(
                          "The training process ran out of memory" + (f" ({detail})" if detail else "") +
                          ". Try a smaller batch with gradient accumulation, mixed precision, activation "
                          "checkpointing, or torch.cuda.empty_cache() between phases."))]
