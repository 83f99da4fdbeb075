"""Reading one key's points for charts: raw ranges, envelopes over rollups, per-layer heatmaps."""

from __future__ import annotations

import math

import numpy as np

from gradwatch import protocol
from gradwatch_server.storage import chunks, rollup
from gradwatch_server.storage.blocks import rollup_rows
from gradwatch_server.storage.downsample import envelope


def raw(conn, key_id: int, slot: int | None, lo: int, hi: int) -> tuple:
    """Steps, values, missing flags and wall times (numpy) of every point with lo <= step <= hi."""
    points = chunks.read(conn, key_id, lo, hi, column=slot or 0)
    missing = points.missing[:, 0] if points.missing is not None else np.zeros(len(points), dtype=bool)
    return points.steps, points.values[:, 0], missing, points.walls


def read_series(
    conn, key_id: int, slot: int | None, slots: int, max_points: int | None, start: int | None, end: int | None
) -> dict:
    """Every point in range, or (with max_points) a min/max envelope that keeps spikes and NaNs."""
    lo, hi = chunks.bounds(conn, key_id, start, end)
    if lo is None:
        return {"steps": [], "values": [], "wall_times": [], "total_points": 0}
    if max_points:
        level = _level(conn, key_id, slots, (hi - lo + 1) / max(1, max_points // 4))
        if level is not None:
            out = _from_rollups(conn, key_id, slot, slots, lo, hi, level, max_points)
            if out is not None:
                return out
    steps, values, missing, walls = raw(conn, key_id, slot, lo, hi)
    keep = envelope(steps, values, max_points) if max_points else slice(None)
    return _result(steps[keep], values[keep], missing[keep], walls[keep], len(steps))


def _level(conn, key_id: int, slots: int, width: float) -> int | None:
    """The rollup level to read for buckets of ``width`` steps: one of the key's own (a sparse key keeps only
    coarse ones, rollup.levels_for); None: read raw."""
    if rollup.pick_level(width, rollup.all_levels(slots)) is None:
        return None  # narrower than any block: no need to ask which levels the key has
    return rollup.pick_level(width, rollup.stored_levels(slots, rollup_rows.finest_level(conn, key_id)))


def _result(steps: np.ndarray, values: np.ndarray, missing: np.ndarray, walls: np.ndarray, total: int) -> dict:
    """The API form of the kept points."""
    out = values.tolist() if np.isfinite(values).all() else [protocol.encode_float(v) for v in values.tolist()]
    for i in np.flatnonzero(missing).tolist():
        out[i] = None
    return {"steps": steps.tolist(), "values": out, "wall_times": walls.tolist(), "total_points": total}


def _whole_blocks(conn, key_id: int, level: int, lo: int, hi: int, slots: int, slot: int | None = None):
    """(first, last, block ids, counts, summaries) of the blocks lying wholly in [lo, hi]; None if
    there are none or they were written under another layout (read raw instead)."""
    first, last = -(-lo // level), (hi + 1) // level - 1
    if last < first:
        return None
    blocks, counts, summaries = rollup_rows.read_blocks(conn, key_id, level, first, last, slots, slot)
    return None if summaries is None else (first, last, blocks, counts, summaries)


def _from_rollups(conn, key_id, slot, slots, lo, hi, level, max_points) -> dict | None:
    """Envelope over whole-block summaries plus the raw points of the partial blocks at both edges."""
    whole = _whole_blocks(conn, key_id, level, lo, hi, slots, slot or 0)
    if whole is None:
        return None
    first, last, _blocks, counts, summaries = whole
    c_steps, c_values, c_walls = rollup.candidates(summaries, 0)
    left = raw(conn, key_id, slot, lo, first * level - 1)
    right = raw(conn, key_id, slot, (last + 1) * level, hi)
    middle = (c_steps, c_values, np.zeros(len(c_steps), dtype=bool), c_walls)
    steps, values, missing, walls = (np.concatenate(parts) for parts in zip(left, middle, right))
    keep = envelope(steps, values, max_points)
    return _result(
        steps[keep], values[keep], missing[keep], walls[keep], int(counts.sum()) + len(left[0]) + len(right[0])
    )


def read_heatmap(conn, key_id: int, slots: int, max_steps: int, start: int | None, end: int | None) -> dict:
    """Per-layer matrix: one column per step bucket holding the max norm (a NaN/inf in the bucket wins)."""
    lo, hi = chunks.bounds(conn, key_id, start, end)
    if lo is None:
        return {"steps": [], "values": [[] for _ in range(slots)], "bucket": 1}
    width = max(1, math.ceil((hi - lo + 1) / max(1, max_steps)))
    units = None
    level = _level(conn, key_id, slots, width)
    if level is not None:
        units = _heat_units_rollup(conn, key_id, slots, lo, hi, level)
    if units is None:
        units = _heat_units_raw(conn, key_id, slots, lo, hi)
    steps, fmax, flags = units
    bucket = (steps - lo) // width
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    if len(starts) == len(steps):  # a block a bucket (the level fits the width): nothing to reduce
        top, seen = fmax, flags
    else:
        top = np.maximum.reduceat(fmax, starts, axis=0)
        seen = np.bitwise_or.reduceat(flags, starts, axis=0)  # the three non-finite kinds in one pass
    return {"steps": (lo + bucket[starts] * width).tolist(), "values": _heat_cells(top, seen), "bucket": width}


def _heat_cells(top: np.ndarray, seen: np.ndarray) -> list:
    """(buckets, slots) maxima and flags as the API's layer-major lists: a NaN in the bucket wins,
    then +inf, then -inf, then the finite max; no value at all is None."""
    out = top.T.tolist()  # finite cells go out as they are; only the few others are looked at one by one
    for b, slot in np.argwhere((top == -np.inf) | (seen != 0)).tolist():
        flag = seen[b, slot]
        kind = next((value for bit, value in _FLAG_VALUES if flag & bit), None)
        out[slot][b] = None if kind is None else protocol.encode_float(kind)
    return out


_FLAG_VALUES = ((rollup.FLAG_NAN, math.nan), (rollup.FLAG_PINF, math.inf), (rollup.FLAG_NINF, -math.inf))


def _heat_units_raw(conn, key_id: int, slots: int, lo: int, hi: int):
    """(steps, finite values or -inf, non-finite flags) of every raw point in [lo, hi]."""
    points = chunks.read(conn, key_id, lo, hi, slots)
    vals, present = points.values, points.present()
    finite = present & np.isfinite(vals)
    flags = (
        (present & np.isnan(vals)) * rollup.FLAG_NAN
        + (present & (vals == np.inf)) * rollup.FLAG_PINF
        + (present & (vals == -np.inf)) * rollup.FLAG_NINF
    )
    return points.steps.astype(np.int64), np.where(finite, vals, -np.inf), flags.astype(np.uint8)


def _heat_units_rollup(conn, key_id: int, slots: int, lo: int, hi: int, level: int):
    """Whole blocks from their heat rows (rollup_rows.read_heat), raw rows for the partial blocks at the edges."""
    first, last = -(-lo // level), (hi + 1) // level - 1
    if last < first:
        return None
    heat = rollup_rows.read_heat(conn, key_id, level, first, last, slots)
    if heat is None:
        return None
    blocks, maxima, flags = heat
    left = _heat_units_raw(conn, key_id, slots, lo, first * level - 1)
    right = _heat_units_raw(conn, key_id, slots, (last + 1) * level, hi)
    return tuple(np.concatenate(parts) for parts in zip(left, (blocks * level, maxima, flags), right))
