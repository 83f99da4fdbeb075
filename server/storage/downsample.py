"""Downsampling that never hides a spike: a min/max envelope per step bucket.

The requested step range is cut into ``max_points // 4`` equal-width buckets. Each bucket
keeps its first and last point and the points holding its minimum and maximum value, so
any spike or dip survives at every zoom level. Non-finite points (NaN, +inf, -inf) are
kept too: the first of each kind in every bucket. Compare: striding or reservoir sampling
(TensorBoard, MLflow, Aim) drop outliers; bucket means (ClearML) flatten them.

This is the one server-side owner of the rule. The pages fold a series that grows live past their
budget with ``compact`` in frontend/lib/series.js, the one browser-side copy (it works on the points a
page already holds, so no live point is lost to a refetch); tests/test_contract.py runs both on the
same inputs under node and requires the same kept points.
"""

from __future__ import annotations

import numpy as np


def envelope(steps, values, max_points: int) -> np.ndarray:
    """Indices (ascending, numpy) of the points to keep; all of them when they already fit.

    ``steps`` ascending. Whole arrays at a time (numpy), so a 1M-point raw range costs milliseconds.
    """
    n = len(steps)
    if max_points <= 0 or n <= max_points:
        return np.arange(n)
    st = np.asarray(steps, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    buckets = max(1, max_points // 4)
    width = (st[-1] - st[0] + 1) / buckets
    bucket = ((st - st[0]) / width).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    keep = [starts, np.r_[starts[1:], n] - 1]
    index = np.arange(n)
    seg = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))  # point -> its bucket
    finite = np.isfinite(v)
    for sign in (1.0, -1.0):  # the first minimum and the first maximum of each bucket
        masked = np.where(finite, sign * v, np.inf)
        best = np.minimum.reduceat(masked, starts)
        keep.append(_first(finite & (masked == best[seg]), index, starts, n))
    for kind in (np.isnan(v), v == np.inf, v == -np.inf):  # the first NaN, +inf and -inf of each bucket
        keep.append(_first(kind, index, starts, n))
    return np.unique(np.concatenate(keep))


def _first(mask: np.ndarray, index: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    first = np.minimum.reduceat(np.where(mask, index, n), starts)
    return first[first < n]
