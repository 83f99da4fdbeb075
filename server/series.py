"""Reading one key's points for charts: raw ranges, envelopes over rollups, per-layer heatmaps."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
from sqlalchemy import func, select

from gradwatch import protocol

from . import db, rollup
from .downsample import envelope


def step_bounds(conn, table, key_id: int, start: int | None, end: int | None) -> tuple:
    """The first and last step of a key within [start, end] (None, None when it has none)."""
    def edge(fn, bound, op):
        q = select(fn(table.c.step)).where(table.c.key_id == key_id)
        if bound is not None:
            q = q.where(op(table.c.step, bound))
        return conn.execute(q).scalar()

    # Two queries, not one: SQLite answers a lone min() or max() from the index without a scan.
    lo = edge(func.min, start, lambda c, b: c >= b)
    hi = edge(func.max, end, lambda c, b: c <= b)
    if lo is None or hi is None or (start is not None and lo < start) or hi < lo:
        return None, None
    return lo, hi


def raw(conn, table, key_id: int, slot: int | None, lo: int, hi: int) -> tuple[list, list, list, list]:
    """Steps, values, missing flags and wall times of every point with lo <= step <= hi."""
    vector = slot is not None
    cols = [table.c.step, table.c.wall_time] + ([table.c.data, table.c.missing] if vector else [table.c.value])
    rows = conn.execute(select(*cols).where(table.c.key_id == key_id, table.c.step >= lo, table.c.step <= hi)
                        .order_by(table.c.step)).all()
    steps, walls = [r[0] for r in rows], [r[1] for r in rows]
    if not vector:
        return steps, [db.from_db_float(r[2]) for r in rows], [False] * len(rows), walls
    # A row shorter than the slot was written under an older, smaller layout: no value there.
    values = [struct.unpack_from("<d", r[2], slot * 8)[0] if len(r[2]) > slot * 8 else math.nan for r in rows]
    missing = [len(r[2]) <= slot * 8 or (bool(r[3]) and slot in json.loads(r[3])) for r in rows]
    return steps, values, missing, walls


def read_series(conn, table, key_id: int, slot: int | None, slots: int, max_points: int | None,
                start: int | None, end: int | None) -> dict:
    """Every point in range, or (with max_points) a min/max envelope that keeps spikes and NaNs."""
    lo, hi = step_bounds(conn, table, key_id, start, end)
    if lo is None:
        return {"steps": [], "values": [], "wall_times": [], "total_points": 0}
    if max_points:
        level = rollup.pick_level((hi - lo + 1) / max(1, max_points // 4))
        if level is not None:
            out = _from_rollups(conn, table, key_id, slot, slots, lo, hi, level, max_points)
            if out is not None:
                return out
    steps, values, missing, walls = raw(conn, table, key_id, slot, lo, hi)
    keep = envelope(steps, values, max_points) if max_points else range(len(steps))
    return _result(steps, values, missing, [walls[i] for i in keep], keep, len(steps))


def _result(steps: list, values: list, missing: list, walls: list, keep, total: int) -> dict:
    """The API form of the kept points (``walls`` already lined up with ``keep``)."""
    return {"steps": [steps[i] for i in keep],
            "values": [None if missing[i] else protocol.encode_float(values[i]) for i in keep],
            "wall_times": walls, "total_points": total}


def _whole_blocks(conn, key_id: int, level: int, lo: int, hi: int, slots: int):
    """(first, last, block ids, counts, summaries) of the blocks lying wholly in [lo, hi]; None if
    there are none or they were written under another layout (read raw instead)."""
    first, last = -(-lo // level), (hi + 1) // level - 1
    if last < first:
        return None
    blocks, counts, summaries = rollup.read_blocks(conn, key_id, level, first, last, slots)
    return None if summaries is None else (first, last, blocks, counts, summaries)


def _from_rollups(conn, table, key_id, slot, slots, lo, hi, level, max_points) -> dict | None:
    """Envelope over whole-block summaries plus the raw points of the partial blocks at both edges."""
    whole = _whole_blocks(conn, key_id, level, lo, hi, slots)
    if whole is None:
        return None
    first, last, _blocks, counts, summaries = whole
    c_steps, c_values = rollup.candidates(summaries, slot or 0)
    left = raw(conn, table, key_id, slot, lo, first * level - 1)
    right = raw(conn, table, key_id, slot, (last + 1) * level, hi)
    steps = left[0] + c_steps + right[0]
    values = left[1] + c_values + right[1]
    missing = left[2] + [False] * len(c_steps) + right[2]
    keep = envelope(steps, values, max_points)
    walls = dict(zip(left[0], left[3])) | dict(zip(right[0], right[3]))
    walls |= _walls(conn, table, key_id, [steps[i] for i in keep if steps[i] not in walls])
    return _result(steps, values, missing, [walls.get(steps[i]) for i in keep], keep,
                   int(counts.sum()) + len(left[0]) + len(right[0]))


def _walls(conn, table, key_id: int, steps: list[int]) -> dict:
    out = {}
    for i in range(0, len(steps), 500):
        chunk = steps[i:i + 500]
        out.update(conn.execute(select(table.c.step, table.c.wall_time)
                                .where(table.c.key_id == key_id, table.c.step.in_(chunk))).all())
    return out


def read_heatmap(conn, key_id: int, slots: int, max_steps: int, start: int | None, end: int | None) -> dict:
    """Per-layer matrix: one column per step bucket holding the max norm (a NaN/inf in the bucket wins)."""
    lo, hi = step_bounds(conn, db.vectors, key_id, start, end)
    if lo is None:
        return {"steps": [], "values": [[] for _ in range(slots)], "bucket": 1}
    width = max(1, math.ceil((hi - lo + 1) / max(1, max_steps)))
    units = None
    level = rollup.pick_level(width)
    if level is not None:
        units = _heat_units_rollup(conn, key_id, slots, lo, hi, level)
    if units is None:
        units = _heat_units_raw(conn, key_id, slots, lo, hi)
    steps, fmax, nan, pinf, ninf = units
    bucket = (steps - lo) // width
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    top = np.maximum.reduceat(fmax, starts, axis=0)
    flags = [np.logical_or.reduceat(f, starts, axis=0) for f in (nan, pinf, ninf)]
    out = top.astype(object)
    out[top == -np.inf] = None  # no finite value (and, unless flagged below, no value at all)
    for flag, value in zip(reversed(flags), (-math.inf, math.inf, math.nan)):  # NaN beats +inf beats -inf
        out[flag] = value
    values = [[None if v is None else protocol.encode_float(float(v)) for v in col] for col in out.T.tolist()]
    return {"steps": (lo + bucket[starts] * width).tolist(), "values": values, "bucket": width}


def _heat_units_raw(conn, key_id: int, slots: int, lo: int, hi: int):
    rows = conn.execute(select(db.vectors.c.step, db.vectors.c.data, db.vectors.c.missing)
                        .where(db.vectors.c.key_id == key_id,
                               db.vectors.c.step >= lo, db.vectors.c.step <= hi)
                        .order_by(db.vectors.c.step)).all()
    if all(len(r.data) == slots * 8 for r in rows):
        vals = np.frombuffer(b"".join(r.data for r in rows), dtype="<f8").reshape(len(rows), slots)
        present = np.ones(vals.shape, dtype=bool)
    else:  # rows from an older layout: pad them, the padding has no value
        vals, present = np.full((len(rows), slots), np.nan), np.zeros((len(rows), slots), dtype=bool)
        for i, r in enumerate(rows):
            row = np.frombuffer(r.data, dtype="<f8")[:slots]
            vals[i, :len(row)], present[i, :len(row)] = row, True
    for i, r in enumerate(rows):
        if r.missing:
            present[i, [j for j in json.loads(r.missing) if j < slots]] = False
    finite = present & np.isfinite(vals)
    return (np.array([r.step for r in rows], dtype=np.int64), np.where(finite, vals, -np.inf),
            present & np.isnan(vals), present & (vals == np.inf), present & (vals == -np.inf))


def _heat_units_rollup(conn, key_id: int, slots: int, lo: int, hi: int, level: int):
    """Whole blocks from the rollups, raw rows for the partial blocks at the edges."""
    whole = _whole_blocks(conn, key_id, level, lo, hi, slots)
    if whole is None:
        return None
    first, last, blocks, _counts, s = whole
    mid = (blocks * level, s[:, rollup.MAX_V, :], s[:, rollup.NAN_S, :] != rollup.NONE,
           s[:, rollup.PINF_S, :] != rollup.NONE, s[:, rollup.NINF_S, :] != rollup.NONE)
    left = _heat_units_raw(conn, key_id, slots, lo, first * level - 1)
    right = _heat_units_raw(conn, key_id, slots, (last + 1) * level, hi)
    return tuple(np.concatenate([a, b, c]) for a, b, c in zip(left, mid, right))
