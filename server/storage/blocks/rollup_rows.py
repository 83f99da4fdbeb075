"""Rollup rows read back whole: summaries as 0.2 (raw), full or lean (rollup.LEAN_ROWS) stored them, and heat rows.

A lean summary (revision 0010) holds neither its finite maxima nor its wall times: ``_made_whole`` takes the
maxima from the block's heat row and the wall times from the run clock at the summary's steps (the writer
stored it lean only where every one was the clock's, bit for bit), so every reader gets the same
(ROWS, slots) array a full summary of the same points gives. A lean block whose heat row is missing or
damaged reads as a damaged block: the caller reads the raw points instead.
"""

from __future__ import annotations

import numpy as np
from sqlalchemy import bindparam, func, select

from gradwatch_server.storage import db
from gradwatch_server.storage.blocks import arrays, clock, codec
from gradwatch_server.storage.chunks import from_f64
from gradwatch_server.storage.rollup import (
    LEAN_ROWS,
    MAX_V,
    NONE,
    ROWS,
    STEP_ROWS,
    WALL_ROWS,
    blob_width,
    decode,
    flags_of,
    heat_arrays,
    heat_is_raw,
)


def _in_range(t, *columns):
    return select(*columns).where(
        t.key_id == bindparam("k"), t.level == bindparam("lv"), t.block >= bindparam("lo"), t.block <= bindparam("hi")
    )


# Built once: a chart's read runs them every time (building a select costs more than running it).
_r, _h = db.rollups.c, db.rollup_heat.c
_BLOCKS = _in_range(_r, _r.block, _r.n, _r.data).order_by(_r.block)
_HEAT = _in_range(_h, _h.block, _h.data).order_by(_h.block)
_FINEST = select(func.min(_r.level)).where(_r.key_id == bindparam("k"))  # an index seek
_STORED = _in_range(_r, _r.block)  # which blocks exist: the rollups' covering index, no row read


def is_lean(blob: bytes) -> bool:
    """Whether a rollup blob is a lean summary (its header names LEAN_ROWS' rows, not ROWS)."""
    return codec.is_encoded(blob) and codec.rows_of(blob) == len(LEAN_ROWS)


def finest_level(conn, key_id: int) -> int | None:
    """The finest rollup level a key has rows of (None: none yet); its levels follow (rollup.stored_levels)."""
    return conn.execute(_FINEST, {"k": key_id}).scalar()


def read_blocks(conn, key_id: int, level: int, first: int, last: int, slots: int, slot: int | None = None):
    """Block numbers (k,), counts (k,) and summaries (k, ROWS, slots) of blocks first..last that exist;
    with ``slot``, (k, ROWS, 1): only that slot's values are copied out of each row. (None, None, None)
    if any was written under another layout or is damaged (the caller reads raw points instead)."""
    rows = conn.execute(_BLOCKS, {"k": key_id, "lv": level, "lo": first, "hi": last}).all()
    cols = slots if slot is None else 1
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros((0, ROWS, cols))
    ids, counts, blobs = zip(*rows)  # columns at C speed: a Row's attributes cost ~0.3 us each, ~1,000 rows
    blocks = np.array(ids, dtype=np.int64)
    data = _made_whole(conn, key_id, level, blocks, blobs, slots, slot) if is_lean(blobs[0]) else None
    if data is None:  # not all lean (decode_arrays checks every blob's rows and width): each to its reader
        data = _mixed(conn, key_id, level, blocks, blobs, slots, slot)
    if data is None:
        return None, None, None
    return blocks, np.array(counts, dtype=np.int64), data


def _mixed(conn, key_id: int, level: int, blocks: np.ndarray, blobs: list, slots: int, slot: int | None):
    """``read_blocks``'s summaries where lean and full ones may be mixed; None if one is of another layout."""
    if any(blob_width(b) != slots for b in blobs):
        return None  # written under an older layout: the caller reads raw points instead
    lean = np.array([is_lean(b) for b in blobs])
    if not lean.any():
        return _full(blobs, slots, slot)
    data = np.empty((len(blobs), ROWS, slots if slot is None else 1))
    for pick, read in ((lean, _made_whole), (~lean, None)):
        if not pick.any():
            continue
        part = [b for b, p in zip(blobs, pick) if p]
        got = read(conn, key_id, level, blocks[pick], part, slots, slot) if read else _full(part, slots, slot)
        if got is None:
            return None
        data[pick] = got
    return data


def summary_of(conn, key_id: int, level: int, block: int, blob: bytes, slots: int) -> np.ndarray | None:
    """One stored summary (any format) as (ROWS, slots); None if damaged or of another layout (the writer)."""
    if not is_lean(blob):
        return decode(blob, slots)
    if blob_width(blob) != slots:
        return None
    whole = _made_whole(conn, key_id, level, np.array([block], dtype=np.int64), [blob], slots, None)
    return None if whole is None else whole[0]


def _full(blobs: list, slots: int, slot: int | None) -> np.ndarray | None:
    """(k, ROWS, cols) of full summaries, raw (0.2) or encoded."""
    if any(codec.is_encoded(b) for b in blobs):
        return _decode_all(blobs, ROWS, slots, slot)
    if slot is None:  # as 0.2 wrote them: one view of all rows
        return from_f64(b"".join(blobs)).reshape(len(blobs), ROWS, slots).astype(np.float64)
    # one layer of many: a strided view of each row, not a copy of every slot of every row
    return np.stack([from_f64(b)[slot::slots] for b in blobs]).astype(np.float64)[:, :, None]


def _made_whole(conn, key_id: int, level: int, blocks: np.ndarray, blobs: list, slots: int, slot: int | None):
    """(k, ROWS, cols) of lean summaries of ``blocks`` (ascending): maxima from their heat rows, wall times
    from the run clock; None if one is damaged or its heat row is missing."""
    lean = arrays.decode_arrays(blobs, len(LEAN_ROWS), slots, slot)
    if lean is None:
        return None
    heat = _heat_rows(conn, key_id, level, int(blocks[0]), int(blocks[-1]), slots, slot)
    if heat is None:
        return None
    have, maxima, _flags = heat
    at = np.minimum(np.searchsorted(have, blocks), max(0, len(have) - 1))
    if not len(have) or (have[at] != blocks).any():
        return None
    out = np.empty((len(blocks), ROWS, lean.shape[2]))
    out[:, LEAN_ROWS] = lean
    out[:, MAX_V] = maxima[at]
    steps = out[:, STEP_ROWS]
    known = steps != NONE
    walls = np.full(steps.shape, NONE)
    if known.any():
        wanted, inverse = np.unique(steps[known].astype(np.int64), return_inverse=True)
        walls[known] = clock.walls_of(conn, key_id, wanted)[inverse]
    out[:, WALL_ROWS] = walls
    return out


def _decode_all(blobs: list, rows: int, slots: int, slot: int | None = None) -> np.ndarray | None:
    """(k, rows, slots) of summary blobs in either format (arrays.decode_arrays for the encoded ones);
    with ``slot``, (k, rows, 1) of that slot only."""
    encoded = [i for i, b in enumerate(blobs) if codec.is_encoded(b)]
    if len(encoded) == len(blobs):
        return arrays.decode_arrays(blobs, rows, slots, slot)
    out = np.empty((len(blobs), rows, slots if slot is None else 1))
    if encoded:
        part = arrays.decode_arrays([blobs[i] for i in encoded], rows, slots, slot)
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


def read_heat(conn, key_id: int, level: int, first: int, last: int, slots: int):
    """Block numbers (k,), finite maxima (k, slots) and flags (k, slots) of blocks first..last that exist;
    None if any was written under another layout. Reads the small heat rows; blocks stored before
    heat rows existed (or whose heat row is missing) are derived from their full summaries."""
    heat = _heat_rows(conn, key_id, level, first, last, slots)
    if heat is None:
        return None
    have, maxima, flags = heat
    # Which blocks exist is the rollups' say (an index-only read): heat rows must match them one for one.
    span = {"k": key_id, "lv": level, "lo": first, "hi": last}
    stored = np.array(conn.execute(_STORED, span).scalars().all(), dtype=np.int64)
    if len(stored) == len(have) and (stored == have).all():
        return have, maxima, flags
    return _heat_with_derived(conn, key_id, level, slots, stored, have, maxima, flags)


def _heat_rows(conn, key_id: int, level: int, first: int, last: int, slots: int, slot: int | None = None):
    """(blocks, maxima (k, cols), flags (k, cols)) of the heat rows of blocks first..last, all slots or
    ``slot`` only; None if one is damaged or of another layout."""
    rows = conn.execute(_HEAT, {"k": key_id, "lv": level, "lo": first, "hi": last}).all()
    cols = slots if slot is None else 1
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros((0, cols)), np.zeros((0, cols), dtype=np.uint8)
    ids, blobs = zip(*rows)
    have = np.array(ids, dtype=np.int64)
    both = arrays.decode_arrays(blobs, 2, slots, slot)
    if both is not None:
        return have, both[:, 0], both[:, 1].astype(np.uint8)
    if not any(heat_is_raw(b, slots) for b in blobs):
        return None
    decoded = [heat_arrays(b, slots) for b in blobs]
    if any(d is None for d in decoded):
        return None
    cut = slice(None) if slot is None else slice(slot, slot + 1)
    maxima = np.stack([d[0][cut] for d in decoded]).astype(np.float64)
    return have, maxima, np.stack([d[1][cut] for d in decoded])


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
