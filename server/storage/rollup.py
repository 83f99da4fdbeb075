"""Rollups: per-block summaries written with the data, so big runs read fast and still show every spike.

For every key and every block of ``level`` consecutive steps (levels 16 or 64 to 262144, each 4x the last) one row
keeps, per slot (a scalar has one slot, a per-layer vector one per layer): the finite minimum
and maximum with the steps (and wall times) they occurred at, and the first step (and wall time)
of each non-finite kind (NaN, +inf, -inf). Each of those is a real logged point, so an envelope computed over a range's
block summaries is the envelope of its raw points, at a cost of a few rows per block.
Blocks written under an older per-layer layout (the model gained or lost parameters) no
longer match; readers then fall back to the raw points for that range.

A vector key's block also keeps its "heat" (``rollup_heat``, ``heat_of``): per slot only the finite
maximum and three non-finite flags, 9 bytes a slot instead of 96, in a table of its own so a heatmap
reads ~10x fewer bytes. Blocks written before that table existed have no heat row: ``read_heat``
derives theirs from the full summary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select

from gradwatch_server.storage import db
from gradwatch_server.storage.blocks import codec
from gradwatch_server.storage.chunks import from_f64

# Scalars start at 256: a 64-step block cost 1.2 bytes a point compressed (docs/storage.md), more than a
# point of a constant key, to save reading up to 128k raw points (~60 compressed chunks, milliseconds).
# Vectors (300 layers = 2.4 KB a step) keep 16, so a heatmap never reads more than ~25k steps raw.
# 262144 keeps a 10M-step chart to a few hundred blocks.
LEVELS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)


def levels_for(slots: int) -> tuple:
    """The rollup levels kept for a key with ``slots`` values per step (0.2 also kept 64 for scalars:
    those rows are no longer read, and ``gradwatch db compact`` deletes them)."""
    return LEVELS if slots > 1 else LEVELS[2:]


MIN_V, MIN_S, MAX_V, MAX_S, NAN_S, PINF_S, NINF_S = range(7)
STEP_ROWS = (MIN_S, MAX_S, NAN_S, PINF_S, NINF_S)
WALL_OF = {row: 7 + i for i, row in enumerate(STEP_ROWS)}  # the wall time of each step row
ROWS = 12
NONE = -1.0  # "no such step" in the step rows
HEAT_ROWS = [MAX_V, NAN_S, PINF_S, NINF_S]  # what a block's heat (heat_of) is made of


@dataclass
class Block:
    """One block's summary: a (ROWS, slots) float64 array, the point count and whether it is stored yet."""

    data: np.ndarray
    n: int = 0
    stored: bool = False
    dirty: bool = False  # changed since written (rollup_writes: a block not done yet is written when it is)
    up: int = 0  # points counted here and not yet passed on to the block of the next level


def empty(slots: int) -> Block:
    data = np.full((ROWS, slots), NONE)
    data[MIN_V], data[MAX_V] = np.inf, -np.inf
    return Block(data)


def summarise(steps: np.ndarray, walls: np.ndarray, values: np.ndarray, present: np.ndarray, groups: np.ndarray):
    """Per-group summaries of points sorted by group: (group ids, counts, (g, ROWS, slots) array)."""
    k = len(steps)
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    seg = np.cumsum(np.r_[False, groups[1:] != groups[:-1]])  # row -> its group's position
    rows = np.arange(k)[:, None]
    out = np.empty((len(starts), ROWS, values.shape[1]))
    finite = present & np.isfinite(values)

    def note(s_row, first):
        found = first < k
        at = np.minimum(first, k - 1)
        out[:, s_row] = np.where(found, steps[at], NONE)
        out[:, WALL_OF[s_row]] = np.where(found, walls[at], NONE)

    for sign, v_row, s_row in ((1.0, MIN_V, MIN_S), (-1.0, MAX_V, MAX_S)):
        masked = np.where(finite, sign * values, np.inf)
        best = np.minimum.reduceat(masked, starts, axis=0)
        out[:, v_row] = sign * best
        note(s_row, np.minimum.reduceat(np.where(finite & (masked == best[seg]), rows, k), starts, axis=0))
    for row, hit in ((NAN_S, np.isnan(values)), (PINF_S, values == np.inf), (NINF_S, values == -np.inf)):
        note(row, np.minimum.reduceat(np.where(hit & present, rows, k), starts, axis=0))
    return groups[starts], np.diff(np.r_[starts, k]), out


def merge(block: Block, data: np.ndarray, n: int) -> bool:
    """Fold a newer summary of the same block into ``block`` (the earlier point wins a tie).

    Returns whether the summary changed (not just its point count).
    """
    block.n += n
    return bool(merge_into(block.data, data).any())


def merge_into(d: np.ndarray, data: np.ndarray) -> np.ndarray:
    """``merge`` on (ROWS, columns) arrays, in place on ``d``; returns which columns changed."""
    changed = np.zeros(d.shape[1], dtype=bool)
    for v_row, s_row, better in ((MIN_V, MIN_S, np.less), (MAX_V, MAX_S, np.greater)):
        take = better(data[v_row], d[v_row]) | (
            (data[v_row] == d[v_row]) & (data[s_row] != NONE) & ((d[s_row] == NONE) | (data[s_row] < d[s_row]))
        )
        _take(d, data, take, (v_row, s_row, WALL_OF[s_row]), changed)
    for row in (NAN_S, PINF_S, NINF_S):
        take = (data[row] != NONE) & ((d[row] == NONE) | (data[row] < d[row]))
        _take(d, data, take, (row, WALL_OF[row]), changed)
    return changed


def fold_point(d: np.ndarray, step: float, wall: float, values: list, present: list) -> None:
    """``merge_into`` of one point per column (values and presence as lists), in plain Python.

    A live step is one point per key: for a few columns, comparing floats one by one costs a
    tenth of the dozens of numpy calls that summarising and merging a one-row batch take.
    """
    for j, (v, ok) in enumerate(zip(values, present)):
        if not ok:
            continue
        if v != v:
            rows = (NAN_S,)
        elif v == math.inf:
            rows = (PINF_S,)
        elif v == -math.inf:
            rows = (NINF_S,)
        else:
            for v_row, s_row, sign in ((MIN_V, MIN_S, 1.0), (MAX_V, MAX_S, -1.0)):
                old, at = d[v_row, j], d[s_row, j]
                if sign * v < sign * old or (v == old and (at == NONE or step < at)):
                    d[v_row, j], d[s_row, j], d[WALL_OF[s_row], j] = v, step, wall
            continue
        at = d[rows[0], j]
        if at == NONE or step < at:
            d[rows[0], j], d[WALL_OF[rows[0]], j] = step, wall


def _take(d: np.ndarray, data: np.ndarray, take: np.ndarray, rows: tuple, changed: np.ndarray) -> None:
    if take.any():
        for row in rows:
            d[row] = np.where(take, data[row], d[row])
        changed |= take


def encode(data: np.ndarray) -> bytes:
    """A (ROWS, slots) summary compressed (codec.encode_array: rows of steps and float32-born
    extremes as float32, NaN/inf rows that are all NONE shrink to nothing)."""
    return codec.encode_array(data)


def blob_width(blob: bytes, rows: int = ROWS) -> int:
    """The slots a summary blob (either format) was written for; -1 if it cannot be one."""
    if codec.is_encoded(blob):
        return codec.width_of(blob)
    return len(blob) // (8 * rows) if len(blob) % (8 * rows) == 0 else -1


def decode(blob: bytes, slots: int) -> np.ndarray | None:
    """A summary blob (raw float64 as 0.2 wrote it, or encoded) as (ROWS, slots); None if damaged
    or written under another layout (readers then use the raw points)."""
    if blob_width(blob) != slots:
        return None
    if not codec.is_encoded(blob):
        return from_f64(blob).reshape(ROWS, slots).astype(np.float64)
    try:
        data = codec.decode_array(blob)
    except codec.Corrupt:
        return None
    return data if data.shape == (ROWS, slots) else None


def _decode_all(blobs: list, rows: int, slots: int, slot: int | None = None) -> np.ndarray | None:
    """(k, rows, slots) of summary blobs in either format (codec.decode_arrays for the encoded ones);
    with ``slot``, (k, rows, 1) of that slot only."""
    encoded = [i for i, b in enumerate(blobs) if codec.is_encoded(b)]
    if len(encoded) == len(blobs):
        return codec.decode_arrays(blobs, rows, slots, slot)
    out = np.empty((len(blobs), rows, slots if slot is None else 1))
    if encoded:
        part = codec.decode_arrays([blobs[i] for i in encoded], rows, slots, slot)
        if part is None:
            return None
        out[encoded] = part
    for i, blob in enumerate(blobs):
        if not codec.is_encoded(blob):
            if len(blob) != rows * slots * 8:
                return None
            data = from_f64(blob).reshape(rows, slots)
            out[i] = data if slot is None else data[:, slot : slot + 1]
    return out


def pick_level(width: float, slots: int = 1) -> int | None:
    """The coarsest level whose blocks still fit in one bucket of ``width`` steps (None: read raw)."""
    fitting = [lv for lv in levels_for(slots) if lv <= width]
    return fitting[-1] if fitting else None


def read_blocks(conn, key_id: int, level: int, first: int, last: int, slots: int, slot: int | None = None):
    """Block numbers (k,), counts (k,) and summaries (k, ROWS, slots) of blocks first..last that exist;
    with ``slot``, (k, ROWS, 1): only that slot's values are copied out of each row."""
    rows = conn.execute(
        select(db.rollups.c.block, db.rollups.c.n, db.rollups.c.data)
        .where(
            db.rollups.c.key_id == key_id,
            db.rollups.c.level == level,
            db.rollups.c.block >= first,
            db.rollups.c.block <= last,
        )
        .order_by(db.rollups.c.block)
    ).all()
    cols = slots if slot is None else 1
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, ROWS, cols))
    if any(blob_width(r.data) != slots for r in rows):
        return None, None, None  # written under an older layout: the caller reads raw points instead
    if not any(codec.is_encoded(r.data) for r in rows):  # as 0.2 wrote them: one view of all rows
        if slot is None:
            data = from_f64(b"".join(r.data for r in rows)).reshape(len(rows), ROWS, slots).astype(np.float64)
        else:  # one layer of many: a strided view of each row, not a copy of every slot of every row
            data = np.stack([from_f64(r.data)[slot::slots] for r in rows]).astype(np.float64)[:, :, None]
    else:
        data = _decode_all([r.data for r in rows], ROWS, slots, slot)
        if data is None:
            return None, None, None  # a damaged block: the caller reads raw points instead
    return np.array([r.block for r in rows], dtype=np.int64), np.array([r.n for r in rows], dtype=np.int64), data


def candidates(summaries: np.ndarray, slot: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every real point a set of block summaries names for one slot: (steps, values, walls) in step order."""
    d = summaries[:, :, slot]
    parts = []
    for s_row, v in (
        (MIN_S, d[:, MIN_V]),
        (MAX_S, d[:, MAX_V]),
        (NAN_S, np.full(len(d), np.nan)),
        (PINF_S, np.full(len(d), np.inf)),
        (NINF_S, np.full(len(d), -np.inf)),
    ):
        ok = d[:, s_row] != NONE
        parts.append(np.stack([d[ok, s_row], v[ok], d[ok, WALL_OF[s_row]]], axis=1))
    both = np.concatenate(parts) if parts else np.zeros((0, 3))
    both = both[np.argsort(both[:, 0], kind="stable")]
    # A block's min and max can be one point (a block of one step): keep each step once.
    _, first = np.unique(both[:, 0], return_index=True)
    both = both[np.sort(first)] if len(both) else both
    return both[:, 0].astype(np.int64), both[:, 1], both[:, 2]


FLAG_NAN, FLAG_PINF, FLAG_NINF = 1, 2, 4


def heat_of(data: np.ndarray) -> bytes:
    """A block's heat from its (ROWS, slots) summary, encoded: the finite maxima and the flags (2, slots).

    (0.2 wrote the maxima as float64 then a flags byte per slot: ``heat_arrays`` reads both.)"""
    return codec.encode_array(np.stack([data[MAX_V], flags_of(data).astype(np.float64)]))


def heat_is_raw(blob: bytes, slots: int) -> bool:
    """Whether a heat blob is 0.2's (9 bytes a slot). That length is 5 modulo 8, like an encoded blob's,
    when ``slots`` is, so there the header decides: an encoded heat blob names 2 rows of ``slots``."""
    if len(blob) != 9 * slots:
        return False
    return not codec.is_encoded(blob) or not codec.has_header(blob, codec.ARRAY, 2, slots)


def heat_arrays(blob: bytes, slots: int) -> tuple | None:
    """(maxima, flags) of one heat blob in either format; None if damaged or of another layout."""
    if heat_is_raw(blob, slots):
        return np.frombuffer(blob[: 8 * slots], "<f8"), np.frombuffer(blob[8 * slots :], np.uint8)
    if not codec.is_encoded(blob):
        return None
    try:
        data = codec.decode_array(blob)
    except codec.Corrupt:
        return None
    return (data[0], data[1].astype(np.uint8)) if data.shape == (2, slots) else None


def flags_of(summaries: np.ndarray) -> np.ndarray:
    """The non-finite flags (uint8, FLAG_* bits) of (..., ROWS, slots) summaries: which kinds each slot saw."""
    seen = [summaries[..., row, :] != NONE for row in (NAN_S, PINF_S, NINF_S)]
    return (seen[0] * FLAG_NAN + seen[1] * FLAG_PINF + seen[2] * FLAG_NINF).astype(np.uint8)


def read_heat(conn, key_id: int, level: int, first: int, last: int, slots: int):
    """Block numbers (k,), finite maxima (k, slots) and flags (k, slots) of blocks first..last that exist;
    None if any was written under another layout. Reads the small heat rows; blocks stored before
    heat rows existed (or whose heat row is missing) are derived from their full summaries."""
    h, r = db.rollup_heat.c, db.rollups.c
    in_range = (h.key_id == key_id, h.level == level, h.block >= first, h.block <= last)
    rows = conn.execute(select(h.block, h.data).where(*in_range).order_by(h.block)).all()
    blobs = [row.data for row in rows]
    if not any(heat_is_raw(b, slots) for b in blobs):
        both = codec.decode_arrays(blobs, 2, slots)
        if both is None:
            return None
        decoded = None
    else:
        decoded = [heat_arrays(b, slots) for b in blobs]
        if any(d is None for d in decoded):
            return None
    have = np.array([row.block for row in rows], dtype=np.int64)
    # Which blocks exist is the rollups' say (an index-only read): heat rows must match them one for one.
    stored = np.array(
        conn.execute(select(r.block).where(r.key_id == key_id, r.level == level, r.block >= first, r.block <= last))
        .scalars()
        .all(),
        dtype=np.int64,
    )
    if decoded is None:
        maxima, flags = both[:, 0], both[:, 1].astype(np.uint8)
    elif decoded:
        maxima, flags = np.stack([d[0] for d in decoded]).astype(np.float64), np.stack([d[1] for d in decoded])
    else:
        maxima, flags = np.zeros((0, slots)), np.zeros((0, slots), dtype=np.uint8)
    if len(stored) == len(have) and (stored == have).all():
        return have, maxima, flags
    return _heat_with_derived(conn, key_id, level, slots, stored, have, maxima, flags)


def _heat_with_derived(conn, key_id, level, slots, stored, have, maxima, flags):
    """``read_heat`` where heat rows and rollup rows differ: the missing heat derived from full summaries."""
    keep = np.isin(have, stored)
    missing = stored[~np.isin(stored, have)]
    if not len(missing):  # only heat rows whose blocks are gone
        return have[keep], maxima[keep], flags[keep]
    blocks, _counts, data = read_blocks(conn, key_id, level, int(missing.min()), int(missing.max()), slots)
    if data is None:
        return None
    pick = np.isin(blocks, missing)
    blocks, data = blocks[pick], data[pick]
    all_blocks = np.concatenate([have[keep], blocks])
    order = np.argsort(all_blocks, kind="stable")
    all_max = np.concatenate([maxima[keep], data[:, MAX_V, :]])
    all_flags = np.concatenate([flags[keep], flags_of(data)])
    return all_blocks[order], all_max[order], all_flags[order]
