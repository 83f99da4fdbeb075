"""A whole batch of records through the health rules at numpy speed.

Each rule's bulk check (declared with the rule, see rule.py) either proves no record of the batch
can make it alert and applies the batch to its state exactly as record-by-record ``observe`` would,
or changes nothing and says no; the rules that said no then see the batch record by record. A
healthy batch of thousands of steps costs a few numpy calls per rule, and the verdicts are the same
either way (tests/test_health.py compares the two on random streams).

A batch of a few records (a live run sends one step per batch) skips the bulk checks: for it, the
thirteen rules' numpy calls cost more than every rule on every record in plain Python floats.
"""

from __future__ import annotations

import numpy as np

from gradwatch_server.health.common import GRAD_VECTOR, Observation
from gradwatch_server.health.rule import Columns

# A batch of at most SMALL_BATCH records, whose gradient vector has at most SMALL_CELLS values (records x
# layers), goes record by record with the bulk checks skipped. Measured on the 2-core dev box (warm Monitor,
# one-step-per-record batches as ingest hands them, µs per batch, bulk checks / record by record):
#   loss only:                 n=1 102/22   n=2 123/39   n=4 147/44   n=8 128/83   n=12 133/120  n=16 132/157
#   loss, norm, 6 layers:      n=1 159/33   n=2 185/67   n=4 213/121  n=8 222/185  n=12 235/308  n=16 300/414
#   loss, norm, 100 layers:    n=1 164/47   n=2 178/92   n=4 232/193  n=8 254/332
#   loss, norm, 300 layers:    n=1 177/85   n=2 258/230  n=3 199/267  n=4 233/324
#   loss, norm, 600 / 1000:    n=1 180/147 and 319/303   n=2 192/268 and 295/404
# A record costs ~10 µs (+ ~20 µs with gradients, + ~0.27 µs a layer) where the bulk checks cost 100-300 µs
# a batch whatever its size: record by record wins up to ~12 records without gradients, ~8 with a few
# layers, and while records x layers stays under ~600. 4 records keeps a margin for a busy machine.
SMALL_BATCH = 4
SMALL_CELLS = 600


def observe_batch(monitor, steps, scalars, vectors) -> list:
    """Every registered rule over the batch (see ``Monitor.observe_batch`` for the arrays)."""
    n = len(steps)
    if n == 0:
        return []
    grad = vectors.get(GRAD_VECTOR)
    cols = Columns.of(steps, scalars, vectors, monitor.th)
    slow = None  # a small batch: every rule, record by record, no bulk check
    if n > SMALL_BATCH or (grad is not None and np.size(grad[2]) > SMALL_CELLS):
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
