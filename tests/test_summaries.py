"""A batch's summary figures (storage/summaries.batch_row): NaN skipped, ±inf kept, the same on either path."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradwatch_server.storage import summaries


def _row(steps, values) -> dict:
    return summaries.batch_row(1, "loss", np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64))


def _brute(steps, values) -> dict:
    """The figures by definition: first min and first max among non-NaN values, last of the largest step."""
    kept = [(v, s) for s, v in zip(steps, values) if not math.isnan(v)]
    last_i = max(range(len(steps)), key=lambda i: (steps[i], i))
    out = {"count": len(values), "nans": len(values) - len(kept), "last_step": steps[last_i]}
    out["last"] = None if math.isnan(values[last_i]) else values[last_i]
    if kept:
        lo = min(kept, key=lambda p: p[0])
        hi = max(kept, key=lambda p: p[0])
        out.update(min=lo[0], min_step=lo[1], max=hi[0], max_step=hi[1])
    else:
        out.update(min=None, min_step=None, max=None, max_step=None)
    return out


@pytest.mark.parametrize("size", [2, summaries.SMALL + 3])  # the plain-float path and the numpy path
def test_nan_is_skipped_and_an_infinite_extreme_is_kept(size):
    steps = list(range(size))
    row = _row(steps, [math.nan, -math.inf] + [-math.inf] * (size - 2))
    assert row["max"] == -math.inf and row["min"] == -math.inf and row["nans"] == 1
    row = _row(steps, [math.nan, math.inf] + [math.inf] * (size - 2))
    assert row["min"] == math.inf and row["max"] == math.inf and row["max_step"] == 1


@pytest.mark.parametrize("seed", range(40))
def test_both_paths_give_the_figures_of_their_definition(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 2 * summaries.SMALL + 2))
    steps = rng.integers(0, 6, size).tolist()  # repeated steps: the last of the largest counts
    pool = np.array([0.5, -2.0, 3.0, math.nan, math.inf, -math.inf, 3.0])
    values = rng.choice(pool, size).tolist()
    row = _row(steps, values)
    assert {k: row[k] for k in _brute(steps, values)} == _brute(steps, values)
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        assert row["total"] == 0.0
    elif math.inf in finite and -math.inf in finite:
        assert row["total"] is None  # inf - inf: the mean is read from points
    else:
        assert row["total"] == pytest.approx(math.fsum(finite))


def test_a_key_with_no_points_has_no_row():
    assert _row([], []) is None
