"""What a health rule is: the ``Rule`` record every rule module declares, and the batch view its bulk check reads.

A rule module (loss.py, grads.py, layers.py, system.py) ends with ``RULES = (Rule(...), ...)``;
registry.py collects them in order, and everything that lists rules (the Monitor, the batch path,
the alert kinds, the docs table) iterates the registry, so a rule declared once runs everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from gradwatch.contract import rules as specs
from gradwatch.contract.keys import is_loss_key
from gradwatch_server.health.common import GLOBAL, GRAD_VECTOR, Alert, Observation


@dataclass(frozen=True)
class Columns:
    """A batch of records as numpy columns: the input of every rule's bulk check."""

    steps: np.ndarray  # (n,) int64, in record order
    scalars: dict  # key -> (record indices int64, values float64)
    grad: tuple | None  # (layout, record indices, values (k, slots), present (k, slots)), or None
    th: dict  # the run's thresholds
    losses: list = field(default_factory=list)  # [(key, rows, values)] for the loss keys, in key order

    @property
    def gnorm(self) -> tuple | None:
        """(rows, values) of the global gradient norm, or None when the batch has none."""
        return self.scalars.get(GLOBAL)

    @classmethod
    def of(cls, steps, scalars: Mapping, vectors: Mapping, th: dict) -> Columns:
        """The arrays ``Monitor.observe_batch`` takes, with dtypes and shapes made exact."""
        sc = {
            key: (np.asarray(rows, dtype=np.int64).reshape(-1), np.asarray(values, dtype=np.float64).reshape(-1))
            for key, (rows, values) in scalars.items()
        }
        grad = vectors.get(GRAD_VECTOR)
        if grad is not None:
            layout, rows, values, present = grad
            values = np.asarray(values, dtype=np.float64)
            grad = (
                list(layout or []),
                np.asarray(rows, dtype=np.int64).reshape(-1),
                values.reshape(len(values), -1) if values.ndim != 2 else values,  # (0, slots) stays as it is
                np.asarray(present, dtype=bool).reshape(len(values), -1),
            )
        losses = [(k, rows, vals) for k, (rows, vals) in sc.items() if is_loss_key(k)]
        return cls(np.asarray(steps, dtype=np.int64), sc, grad, th, losses)


def no_state(meta: Mapping) -> dict:
    """The usual starting state: empty."""
    return {}


@dataclass(frozen=True)
class Rule:
    """One health rule: what it is called, what it raises, and how it checks one record or a whole batch.

    ``check(state, obs, th)`` sees one record and returns its alerts. ``bulk(state, cols)`` sees a
    whole batch: it either proves no record can make the rule alert and applies the batch to
    ``state`` exactly as ``check`` on each record would (True), or changes nothing (False), and the
    rule then sees the batch record by record.

    What is known of it without running it (severity, thresholds, which value is worse, the doc) is
    its ``RuleSpec`` in gradwatch.contract.rules, found by kind; a rule made at run time passes its
    own ``spec``, which ``registry.register`` declares.
    """

    name: str  # its key in Monitor.states
    kind: str  # the alert kind it raises; its thresholds are the ones named "<kind>.<setting>"
    check: Callable[[dict, Observation, dict], list[Alert]]
    bulk: Callable[[dict, Columns], bool]
    reads: frozenset = frozenset()  # the scalar keys it reads (besides the losses): ingest passes them on
    losses: bool = False  # whether it reads every loss key (gradwatch.protocol.is_loss_key)
    needs_grads: bool = False  # runs only on records that carry gradients (a global norm or layer norms)
    start: Callable[[Mapping], dict] = no_state  # its state before the first record, from the run's meta
    flush: Callable[[dict], list[Alert]] | None = None  # alerts it holds back, released when the run ends
    own_spec: specs.RuleSpec | None = None  # a run-time rule's spec (built-in rules' are in the contract)

    @property
    def spec(self) -> specs.RuleSpec:
        """Its spec: the one it brought, else the contract's for its kind, else a bare one (no thresholds)."""
        return self.own_spec or specs.spec(self.kind) or specs.RuleSpec(self.kind, "warning", self.doc_of_check)

    @property
    def doc_of_check(self) -> str:
        """The check's docstring, one line."""
        return (self.check.__doc__ or "").strip()

    @property
    def doc(self) -> str:
        """What it detects and why, in one line (its spec's doc)."""
        return self.spec.doc

    @property
    def severity(self) -> str:
        """The severity of its alerts (its spec's)."""
        return self.spec.severity

    @property
    def smaller_is_worse(self) -> bool:
        """Whether a recurrence with a smaller |value| is the worse one (e.g. a ratio)."""
        return self.spec.smaller_is_worse

    @property
    def nonfinite_value(self) -> bool:
        """Whether its alert value may be NaN/inf on purpose (the value is the news)."""
        return self.spec.nonfinite_value

    @property
    def thresholds(self) -> dict[str, float]:
        """Its threshold names and defaults, from its spec."""
        return self.spec.defaults
