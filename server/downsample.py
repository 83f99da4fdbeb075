"""Downsampling that never hides a spike: a min/max envelope per step bucket.

The requested step range is cut into ``max_points // 4`` equal-width buckets. Each bucket
keeps its first and last point and the points holding its minimum and maximum value, so
any spike or dip survives at every zoom level. Non-finite points (NaN, +inf, -inf) are
kept too: the first of each kind in every bucket. Compare: striding or reservoir sampling
(TensorBoard, MLflow, Aim) drop outliers; bucket means (ClearML) flatten them.
"""

from __future__ import annotations

import math


def envelope(steps: list[int], values: list[float], max_points: int) -> list[int]:
    """Indices (ascending) of the points to keep; all of them when they already fit."""
    n = len(steps)
    if max_points <= 0 or n <= max_points:
        return list(range(n))
    buckets = max(1, max_points // 4)
    lo, hi = steps[0], steps[-1]
    width = (hi - lo + 1) / buckets
    keep: set[int] = set()
    start = 0
    while start < n:
        b = int((steps[start] - lo) / width)
        end = start
        while end + 1 < n and int((steps[end + 1] - lo) / width) == b:
            end += 1
        keep.update(_bucket(values, start, end))
        start = end + 1
    return sorted(keep)


def _bucket(values: list[float], start: int, end: int) -> set[int]:
    keep = {start, end}
    lo_i = hi_i = None
    seen_special: set[str] = set()
    for i in range(start, end + 1):
        v = values[i]
        if not math.isfinite(v):
            kind = "nan" if math.isnan(v) else ("+" if v > 0 else "-")
            if kind not in seen_special:
                seen_special.add(kind)
                keep.add(i)
            continue
        if lo_i is None or v < values[lo_i]:
            lo_i = i
        if hi_i is None or v > values[hi_i]:
            hi_i = i
    keep.update(i for i in (lo_i, hi_i) if i is not None)
    return keep
