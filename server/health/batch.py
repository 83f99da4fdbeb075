"""A whole batch of records through the health rules at numpy speed.

Each rule's bulk check (declared with the rule, see rule.py) either proves no record of the batch
can make it alert and applies the batch to its state exactly as record-by-record ``observe`` would,
or changes nothing and says no; the rules that said no then see the batch record by record. A
healthy batch of thousands of steps costs a few numpy calls per rule, and the verdicts are the same
either way (tests/test_health.py compares the two on random streams).
"""

from __future__ import annotations

from gradwatch_server.health.common import Observation
from gradwatch_server.health.rule import Columns


def observe_batch(monitor, steps, scalars, vectors) -> list:
    """Every registered rule over the batch (see ``Monitor.observe_batch`` for the arrays)."""
    if len(steps) == 0:
        return []
    cols = Columns.of(steps, scalars, vectors, monitor.th)
    slow = {rule.name for rule in monitor.rules() if not rule.bulk(monitor.state(rule), cols)}
    if not slow:
        return []
    alerts = []
    for obs in _records(cols):
        alerts += monitor.run_rules(obs, slow)
    return alerts


def _records(cols: Columns):
    """The batch as one Observation per record (for the rules that must see it record by record)."""
    n = len(cols.steps)
    per = [{} for _ in range(n)]
    for key, (rows, vals) in cols.scalars.items():
        for r, v in zip(rows.tolist(), vals.tolist()):
            per[r][key] = v
    norms = [None] * n
    layers: list = []
    if cols.grad is not None:
        layers, rows, values, present = cols.grad
        for r, vals, ok in zip(rows.tolist(), values.tolist(), present.tolist()):
            norms[r] = vals if all(ok) else [v if p else None for v, p in zip(vals, ok)]
        width = values.shape[1]
        if len(layers) != width:
            layers = [f"param[{i}]" for i in range(width)]
    for i, step in enumerate(cols.steps.tolist()):
        yield Observation(step, per[i], layers if norms[i] is not None else [], norms[i] or [])
