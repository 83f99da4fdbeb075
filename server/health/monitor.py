"""The Monitor: runs every registered health rule over a run's stream, keeping each rule's state.

Each rule is ``check_<kind>(state, obs, th) -> list[Alert]``: ``obs`` is one record's values,
``th`` the thresholds, ``state`` a small dict the rule owns (its memory of past steps, e.g.
a rolling window and whether an episode is open). Rules touch nothing else, so they are
tested by feeding them streams directly. One alert per episode, and episodes have
hysteresis: a rule that has fired stays quiet until the condition has been clear for a
``<kind>.cooldown`` stretch, so one problem that flickers is still one alert.

The rules live in ``loss`` (NaN, spikes, divergence), ``grads`` (non-finite, exploding),
``layers`` (vanishing, zero, missing gradients) and ``system`` (memory, AMP), each declared as a
``Rule`` with its numpy bulk check; ``registry`` holds them in order (``RULES``) and ``batch``
checks a whole batch of records at once. This module is the one place the server imports them from.

The reasoning follows common PyTorch practice: a global gradient norm of 0 means the loss is
not connected to the parameters; hundreds to thousands (or orders of magnitude above the
run's own history) means exploding gradients; norms that shrink layer by layer towards the
input mean vanishing gradients; ``.grad is None`` means the graph was cut (detach, no_grad,
.item()) or the parameter is not used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gradwatch import contract
from gradwatch.contract import rules as specs
from gradwatch_server.health import batch as health_batch
from gradwatch_server.health import registry
from gradwatch_server.health.common import GRAD_VECTOR, Alert, Observation, has_grads
from gradwatch_server.health.grads import check_exploding_gradients, check_nonfinite_gradients
from gradwatch_server.health.layers import check_missing_gradients, check_vanishing_gradients, check_zero_gradients
from gradwatch_server.health.loss import check_loss_divergence, check_loss_spike, check_nan_loss
from gradwatch_server.health.rule import Rule
from gradwatch_server.health.system import check_amp_overflow, check_memory_pressure, out_of_memory

__all__ = [
    "Alert",
    "Observation",
    "Monitor",
    "Rule",
    "DEFAULTS",
    "GRAD_VECTOR",
    "SERVER_KINDS",
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

DEFAULTS = specs.DEFAULTS
SERVER_KINDS = contract.SERVER_KINDS


def thresholds(overrides: Mapping | None = None) -> dict:
    """DEFAULTS with the valid overrides applied; unknown names and bad values keep the default."""
    return specs.merged(overrides)


relevant = registry.relevant  # whether any rule reads this scalar key


def worse(kind: str, new: float | None, old: float | None) -> bool:
    """Whether ``new`` is a worse value than ``old`` for this kind of alert (non-finite is the worst)."""
    if new is None:
        return False
    if old is None or not math.isfinite(new):
        return old is None or math.isfinite(old)
    if not math.isfinite(old):
        return False
    return abs(new) < abs(old) if registry.smaller_is_worse(kind) else abs(new) > abs(old)


def named_slots(vectors: Mapping) -> dict:
    """Only the rows the batch's layout names. A layer frozen mid-run while the link is busy puts the records
    before the freeze (wider), the new layout and the records after it (narrower, padded with "no value" at
    decode) in one batch: the padding is not a missing gradient, and the wider rows cannot be named by it."""
    out = {}
    for key, (layout, rows, values, present) in vectors.items():
        n = len(layout or ())
        if n and values.shape[1] > n:
            narrow = ~present[:, n:].any(axis=1)  # rows logged under this (narrower) layout
            rows, values, present = rows[narrow], values[narrow, :n], present[narrow, :n]
        out[key] = (layout, rows, values, present)
    return out


class Monitor:
    """Runs every rule over a run's stream, keeping each rule's state between records."""

    relevant = staticmethod(relevant)  # whether a built-in rule reads a key (``reads``: this run's rules)

    def rules(self) -> tuple:
        """The registered rules this run applies (all but those its project turned off)."""
        if self.policy is None or not self.policy.disabled:
            return registry.RULES
        return tuple(r for r in registry.RULES if r.kind not in self.policy.disabled)

    def reads(self, key: str) -> bool:
        """Whether a rule of this run (built in, or a project's custom rule) reads this scalar key."""
        return relevant(key) or (self.policy is not None and self.policy.reads(key))

    def __init__(self, th: Mapping | None = None, meta: dict | None = None, policy=None):
        self.th = thresholds(th)  # a full table even from a partial or damaged one
        self.meta = meta or {}
        # A project's rules (rules.policy.Policy): kinds turned off, severities, custom rules on any metric.
        self.policy = policy
        self.states: dict[str, dict] = {}
        self.updates: dict = {}  # (kind, key, layer) -> an update Alert folding an open episode's bad steps

    def state(self, rule: Rule) -> dict:
        """The rule's state for this run, started from the run's meta on first use."""
        st = self.states.get(rule.name)
        if st is None:
            st = self.states[rule.name] = rule.start(self.meta)
        return st

    def observe(self, step: int, scalars: dict, vectors: dict) -> list[Alert]:
        """Feed one record; ``vectors`` maps key -> (layout names, values with None for a missing grad)."""
        layout, norms = vectors.get(GRAD_VECTOR, (None, None))
        obs = Observation(step, scalars, list(layout or []), list(norms if norms is not None else []))
        if len(obs.layers) != len(obs.norms):
            obs.layers = [f"param[{i}]" for i in range(len(obs.norms))]
        alerts = self.run_rules(obs, None)
        self.updates = {}  # record by record (a replay, tests): episode updates are the batch path's news only
        return alerts

    def run_rules(self, obs: Observation, only: set | None) -> list[Alert]:
        """Every registered rule (or those named in ``only``) on one record, in registry order."""
        alerts: list[Alert] = []
        grads = None  # whether the record carries gradients, worked out once if a rule asks
        states, th = self.states, self.th  # (it runs per record: live runs send one record per batch)
        for rule in self.rules():  # a rule its project turned off keeps its state where it was
            if only is not None and rule.name not in only:
                continue
            if rule.needs_grads:
                if grads is None:
                    grads = has_grads(obs)
                if not grads:
                    continue
            state = states.get(rule.name)
            for alert in rule.check(self.state(rule) if state is None else state, obs, th):
                if alert.update:
                    self._fold(alert)
                else:
                    alerts.append(alert)
        return alerts

    def _fold(self, alert: Alert) -> None:
        """One update per (kind, key, layer) per batch: the last step, the worst value, how many bad steps."""
        ident = (alert.kind, alert.key, alert.layer)
        held = self.updates.get(ident)
        if held is None:
            self.updates[ident] = alert
            return
        held.update += alert.update
        held.step = max(held.step, alert.step)
        if worse(alert.kind, alert.value, held.value):
            held.value, held.message = alert.value, alert.message

    def take_updates(self) -> list[Alert]:
        """The open episodes' updates of the last ``observe_batch`` (the alerts follow their episodes)."""
        out, self.updates = list(self.updates.values()), {}
        return out if self.policy is None else self.policy.apply(out)

    def observe_batch(self, steps, scalars: Mapping, vectors: Mapping) -> list[Alert]:
        """Feed a batch of records at once; the same alerts as ``observe`` on each record in order.

        ``steps``: int array (n,) in record order. ``scalars``: key -> (rows, values), record indices
        and float64 values. ``vectors``: key -> (layout, rows, values (k, slots), present (k, slots)),
        ``present`` False where ``.grad`` was None.
        """
        self.updates = {}  # what a replay of old records (``observe``) folded is not news
        alerts = health_batch.observe_batch(self, steps, scalars, named_slots(vectors))
        if self.policy is None:
            return alerts
        return self.policy.apply(alerts) + self.policy.run_custom(steps, scalars)

    def flush(self) -> list[Alert]:
        """Alerts held back waiting for the next record (a non-finite-gradients alert waits for the loss
        of its step, to say whether the loss went non-finite first): call when the run ends."""
        held: list[Alert] = []
        for rule in registry.RULES:
            if rule.flush is not None and rule.name in self.states:
                held += rule.flush(self.states[rule.name])
        return held

    def on_exception(self, error: dict) -> list[Alert]:
        """An out-of-memory crash is recorded as a memory_pressure alert with the memory state."""
        held = self.flush()
        oom = out_of_memory(error)
        return held if oom is None else held + [oom]
