"""Health rules: pure functions over a run's metric stream that say when training is broken.

Each rule is ``check_<kind>(state, obs, th) -> list[Alert]``: ``obs`` is one record's values,
``th`` the thresholds, ``state`` a small dict the rule owns (its memory of past steps, e.g.
a rolling window and whether an episode is open). Rules touch nothing else, so they are
tested by feeding them streams directly. One alert per episode, and episodes have
hysteresis: a rule that has fired stays quiet until the condition has been clear for a
``<kind>.cooldown`` stretch, so one problem that flickers is still one alert.

The rules live in ``health_loss`` (NaN, spikes, divergence), ``health_grads`` (non-finite,
exploding, vanishing, zero, missing gradients) and ``health_system`` (memory, AMP);
``health_batch`` checks a whole batch of records at once with numpy when nothing in it can
trigger a rule. This module is the one place the server imports them from.

The reasoning follows common PyTorch practice: a global gradient norm of 0 means the loss is
not connected to the parameters; hundreds to thousands (or orders of magnitude above the
run's own history) means exploding gradients; norms that shrink layer by layer towards the
input mean vanishing gradients; ``.grad is None`` means the graph was cut (detach, no_grad,
.item()) or the parameter is not used.
"""

from __future__ import annotations

from collections.abc import Mapping

from gradwatch import thresholds as _thresholds
from gradwatch.protocol import is_loss_key
from gradwatch_server.health import batch as health_batch
from gradwatch_server.health.common import Alert, Observation
from gradwatch_server.health.grads import (
    check_exploding_gradients,
    check_missing_gradients,
    check_nonfinite_gradients,
    check_vanishing_gradients,
    check_zero_gradients,
    has_grads,
)
from gradwatch_server.health.loss import check_loss_divergence, check_loss_spike, check_nan_loss
from gradwatch_server.health.system import check_amp_overflow, check_memory_pressure

__all__ = [
    "Alert",
    "Observation",
    "Monitor",
    "DEFAULTS",
    "GRAD_VECTOR",
    "KINDS",
    "RULE_KEYS",
    "relevant",
    "thresholds",
    "check_nan_loss",
    "check_loss_spike",
    "check_loss_divergence",
    "check_nonfinite_gradients",
    "check_exploding_gradients",
    "check_vanishing_gradients",
    "check_zero_gradients",
    "check_missing_gradients",
    "check_memory_pressure",
    "check_amp_overflow",
]

DEFAULTS = _thresholds.DEFAULTS
GRAD_VECTOR = "grad"
RULE_KEYS = frozenset({"grad/global_norm", "memory/cuda_reserved", "memory/cuda_total", "amp/scale"})
# Every kind an alert can have: the rules', the client's (missing_gradients for parameters left out of
# the optimizer, memory_pressure for an OOM crash) and the server's own: data_gap, data_refused, stalled.
SERVER_KINDS = ("data_gap", "data_refused", "stalled")
KINDS = (
    "nan_loss",
    "loss_spike",
    "loss_divergence",
    "nonfinite_gradients",
    "exploding_gradients",
    "vanishing_gradients",
    "zero_gradients",
    "missing_gradients",
    "memory_pressure",
    "amp_overflow",
    *SERVER_KINDS,
)


def thresholds(overrides: Mapping | None = None) -> dict:
    """DEFAULTS with the valid overrides applied; unknown names and bad values keep the default."""
    return _thresholds.merged(overrides)


def relevant(key: str) -> bool:
    """Whether any rule reads this scalar key (losses, the global grad norm, CUDA reserved, AMP scale)."""
    return key in RULE_KEYS or is_loss_key(key)


class Monitor:
    """Runs every rule over a run's stream, keeping each rule's state between records."""

    relevant = staticmethod(relevant)

    def __init__(self, th: Mapping | None = None, meta: dict | None = None):
        self.th = thresholds(th)  # a full table even from a partial or damaged one
        self.total_memory = (meta or {}).get("cuda_total_memory")
        self.states: dict[str, dict] = {}

    def observe(self, step: int, scalars: dict, vectors: dict) -> list[Alert]:
        """Feed one record; ``vectors`` maps key -> (layout names, values with None for a missing grad)."""
        layout, norms = vectors.get(GRAD_VECTOR, (None, None))
        obs = Observation(step, scalars, list(layout or []), list(norms if norms is not None else []))
        if len(obs.layers) != len(obs.norms):
            obs.layers = [f"param[{i}]" for i in range(len(obs.norms))]
        return self.run_rules(obs, None)

    def run_rules(self, obs: Observation, only: set | None) -> list[Alert]:
        """Every rule (or those named in ``only``) on one record, in a fixed order."""
        s, th = self.states, self.th
        alerts: list[Alert] = []
        for name, rule in _LOSS_RULES:
            if only is None or name in only:
                alerts += rule(s.setdefault(name, {}), obs, th)
        if only is None or "nonfinite" in only:
            alerts += check_nonfinite_gradients(s.setdefault("nonfinite", {}), obs, th)
        if has_grads(obs):
            for name, rule in _GRAD_RULES:
                if only is None or name in only:
                    alerts += rule(s.setdefault(name, {}), obs, th)
        if only is None or "memory" in only:
            alerts += check_memory_pressure(s.setdefault("memory", {}), obs, th, self.total_memory)
        if only is None or "amp" in only:
            alerts += check_amp_overflow(s.setdefault("amp", {}), obs, th)
        return alerts

    def observe_batch(self, steps, scalars: Mapping, vectors: Mapping) -> list[Alert]:
        """Feed a batch of records at once; the same alerts as ``observe`` on each record in order.

        ``steps``: int array (n,) in record order. ``scalars``: key -> (rows, values), record indices
        and float64 values. ``vectors``: key -> (layout, rows, values (k, slots), present (k, slots)),
        ``present`` False where ``.grad`` was None.
        """
        return health_batch.observe_batch(self, steps, scalars, vectors)

    def flush(self) -> list[Alert]:
        """Alerts held back waiting for the next record (a non-finite-gradients alert waits for the loss
        of its step, to say whether the loss went non-finite first): call when the run ends."""
        pending = self.states.get("nonfinite", {}).pop("pending", None)
        return [pending] if pending is not None else []

    def on_exception(self, error: dict) -> list[Alert]:
        """An out-of-memory crash is recorded as a memory_pressure alert with the memory state."""
        held = self.flush()
        text = f"{error.get('exc_type')}: {error.get('message')}"[:10000]
        if "out of memory" not in text.lower() and "OutOfMemoryError" not in text:
            return held
        memory = error.get("memory") or {}
        detail = ", ".join(
            f"{k.split('/')[-1]}={v / 2**20:.0f} MiB" for k, v in memory.items() if isinstance(v, (int, float))
        )
        return held + [
            Alert(
                "memory_pressure",
                error.get("step"),
                memory.get("memory/cuda_reserved"),
                "critical",
                key="memory/cuda_reserved",
                message=(
                    "The training process ran out of memory"
                    + (f" ({detail})" if detail else "")
                    + ". Try a smaller batch with gradient accumulation, mixed precision, activation "
                    "checkpointing, or torch.cuda.empty_cache() between phases."
                ),
            )
        ]


_LOSS_RULES = (("nan", check_nan_loss), ("spike", check_loss_spike), ("divergence", check_loss_divergence))
_GRAD_RULES = (
    ("exploding", check_exploding_gradients),
    ("vanishing", check_vanishing_gradients),
    ("zero", check_zero_gradients),
    ("missing", check_missing_gradients),
)
