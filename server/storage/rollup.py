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
(blocks/rollup_rows.py) derives theirs from the full summary.

Since revision 0010 a vector key's summary is stored *lean* (``LEAN_ROWS``) where it can be: without its
finite maxima, which its heat row holds, and without its wall times, when each is the run clock's at its
step (blocks/clock.py); readers make it whole (blocks/rollup_rows.py). A 300-layer level-16 summary then
fits two to a 4 KB SQLite page instead of one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gradwatch_server.storage.blocks import arrays, codec
from gradwatch_server.storage.chunks import from_f64

# Scalars start at 256: a 64-step block cost 1.2 bytes a point compressed (docs/storage.md), more than a
# point of a constant key, to save reading up to 128k raw points (~60 compressed chunks, milliseconds).
# Vectors (300 layers = 2.4 KB a step) keep 16, so a heatmap never reads more than ~25k steps raw.
# 262144 keeps a 10M-step chart to a few hundred blocks.
LEVELS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)


# A block summarising fewer points than this costs more bytes than it saves reads: a vector's lean summary and
# heat row hold ~10 numbers a slot, a point one. A key logged every 10th step (watch()'s update ratios and
# activations) then keeps no 16-step blocks of 1.6 points, which took twice its points' bytes. Not 8: its
# 64-step blocks (6.4 points) still make a heatmap of 64-255 steps a column 2.5-4x faster (docs/storage.md).
MIN_POINTS = 4


def all_levels(slots: int) -> tuple:
    """Every level a key of ``slots`` values per step may have: scalars start at 256 (0.2 also kept 64: those rows
    are no longer read, and ``gradwatch db compact`` deletes them)."""
    return LEVELS if slots > 1 else LEVELS[2:]


def levels_for(slots: int, gap: int = 1) -> tuple:
    """The rollup levels a new key with ``slots`` values per step, whose points are ``gap`` steps apart, keeps:
    those whose blocks hold at least MIN_POINTS points, the coarsest always."""
    every = all_levels(slots)
    return tuple(lv for lv in every if lv >= MIN_POINTS * gap) or every[-1:]


def stored_levels(slots: int, finest: int | None) -> tuple:
    """A key's levels from the finest level it has rows of (None: no rows, no levels): a key keeps the same
    levels all its life, so readers and a rebuilt writer cache know them from that one number."""
    if finest is None:
        return ()
    every = all_levels(slots)
    return tuple(lv for lv in every if lv >= finest) or every[-1:]


MIN_V, MIN_S, MAX_V, MAX_S, NAN_S, PINF_S, NINF_S = range(7)
STEP_ROWS = (MIN_S, MAX_S, NAN_S, PINF_S, NINF_S)
WALL_OF = {row: 7 + i for i, row in enumerate(STEP_ROWS)}  # the wall time of each step row
ROWS = 12
NONE = -1.0  # "no such step" in the step rows
HEAT_ROWS = [MAX_V, NAN_S, PINF_S, NINF_S]  # what a block's heat (heat_of) is made of
WALL_ROWS = [WALL_OF[row] for row in STEP_ROWS]
LEAN_ROWS = [MIN_V, MIN_S, MAX_S, NAN_S, PINF_S, NINF_S]  # a lean summary's rows: the rest is its heat's and clock's


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
        return found, at

    for sign, v_row, s_row in ((1.0, MIN_V, MIN_S), (-1.0, MAX_V, MAX_S)):
        masked = np.where(finite, sign * values, np.inf)
        best = np.minimum.reduceat(masked, starts, axis=0)
        found, at = note(s_row, np.minimum.reduceat(np.where(finite & (masked == best[seg]), rows, k), starts, axis=0))
        # the value of the point named (+0.0 and -0.0 tie: which one a reduction keeps is not defined)
        out[:, v_row] = np.where(found, np.take_along_axis(values, at, axis=0), sign * best)
    for row, hit in ((NAN_S, np.isnan(values)), (PINF_S, values == np.inf), (NINF_S, values == -np.inf)):
        note(row, np.minimum.reduceat(np.where(hit & present, rows, k), starts, axis=0))
    return groups[starts], np.diff(np.r_[starts, k]), out


def coarsen(ids: np.ndarray, counts: np.ndarray, sums: np.ndarray, factor: int):
    """``summarise``'s answer at a level ``factor`` times coarser, from its blocks (ids ascending) instead of
    the points: the same summaries bit for bit (a block's extreme is the first finer block's that reaches
    it, as the first point reaching it lies there), for a few blocks' work instead of every point's."""
    groups = ids // factor
    k = len(ids)
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    seg = np.cumsum(np.r_[False, groups[1:] != groups[:-1]])
    rows = np.arange(k)[:, None]
    cols = np.arange(sums.shape[2])
    out = np.empty((len(starts), ROWS, sums.shape[2]))

    def take(s_row, first):
        found = first < k
        at = np.minimum(first, k - 1)
        for row in (s_row, WALL_OF[s_row]):
            out[:, row] = np.where(found, sums[at, row, cols], NONE)
        return found, at

    for best_of, v_row, s_row in ((np.minimum, MIN_V, MIN_S), (np.maximum, MAX_V, MAX_S)):
        best = best_of.reduceat(sums[:, v_row], starts, axis=0)
        reached = (sums[:, v_row] == best[seg]) & (sums[:, s_row] != NONE)
        found, at = take(s_row, np.minimum.reduceat(np.where(reached, rows, k), starts, axis=0))
        out[:, v_row] = np.where(found, sums[at, v_row, cols], best)  # that block's own value: a zero's sign
    for row in (NAN_S, PINF_S, NINF_S):
        take(row, np.minimum.reduceat(np.where(sums[:, row] != NONE, rows, k), starts, axis=0))
    return groups[starts], np.add.reduceat(counts, starts), out


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
    """A (ROWS, slots) summary compressed (arrays.encode_array: rows of steps and float32-born
    extremes as float32, NaN/inf rows that are all NONE shrink to nothing)."""
    return arrays.encode_array(data)


def lean_walls(summaries: list, omits) -> list[bool]:
    """Which (ROWS, slots) summaries may be stored lean: vectors', whose every wall time is the run clock's
    at its step (``omits``: clock.Clock.omits without its connection). Asked once for all of them (a bulk
    batch writes thousands of blocks), then one by one only where that fails (a point at a repeated step)."""
    named = []  # (steps, walls) of each summary that could be lean, else None
    for data in summaries:
        steps = data[list(STEP_ROWS)]
        known = steps != NONE
        fits = data.shape[1] > 1 and known.any()
        named.append((steps[known].astype(np.int64), data[WALL_ROWS][known]) if fits else None)
    some = [pair for pair in named if pair is not None]
    if some and omits(np.concatenate([s for s, _w in some]), np.concatenate([w for _s, w in some])):
        return [pair is not None for pair in named]
    return [pair is not None and omits(*pair) for pair in named]


def encode_many(summaries: list, lean: list) -> list[bytes]:
    """``encode_lean`` or ``encode`` of each (ROWS, slots) summary (as ``lean`` says), in one batch of numpy passes."""
    return arrays.encode_arrays([data[LEAN_ROWS] if thin else data for data, thin in zip(summaries, lean)])


def encode_lean(data: np.ndarray) -> bytes:
    """A (ROWS, slots) summary without its maxima and wall times (``LEAN_ROWS``), compressed."""
    return arrays.encode_array(data[LEAN_ROWS])


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
        data = arrays.decode_array(blob)
    except codec.Corrupt:
        return None
    return data if data.shape == (ROWS, slots) else None


def pick_level(width: float, levels: tuple) -> int | None:
    """The coarsest of a key's ``levels`` whose blocks still fit in one bucket of ``width`` steps (None: read raw)."""
    fitting = [lv for lv in levels if lv <= width]
    return fitting[-1] if fitting else None


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
    return heats_of([data])[0]


def heats_of(summaries: list) -> list[bytes]:
    """``heat_of`` of each (ROWS, slots) summary, in one batch of numpy passes."""
    return arrays.encode_arrays([np.stack([data[MAX_V], flags_of(data).astype(np.float64)]) for data in summaries])


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
        data = arrays.decode_array(blob)
    except codec.Corrupt:
        return None
    return (data[0], data[1].astype(np.uint8)) if data.shape == (2, slots) else None


def flags_of(summaries: np.ndarray) -> np.ndarray:
    """The non-finite flags (uint8, FLAG_* bits) of (..., ROWS, slots) summaries: which kinds each slot saw."""
    seen = [summaries[..., row, :] != NONE for row in (NAN_S, PINF_S, NINF_S)]
    return (seen[0] * FLAG_NAN + seen[1] * FLAG_PINF + seen[2] * FLAG_NINF).astype(np.uint8)
