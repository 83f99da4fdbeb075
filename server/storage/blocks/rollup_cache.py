"""The rollup writer's cache of each key's levels and newest blocks, and how it is built from the database.

A key keeps only the levels whose blocks hold enough points (``rollup.levels_for``): they are fixed by how far
apart its first steps are and kept for life, so a cache built anew (a restart, an edit, another process stored
batches meanwhile) takes them from the finest level the key has rows of, as readers do (storage/series.py).
Its newest block of every level that is not done is rebuilt from the finer stored blocks and the raw points
(``_rebuild``), so nothing a lost cache held is lost. storage/rollup_writes.py folds batches into the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import bindparam, func, select

from gradwatch_server.storage import chunks, db
from gradwatch_server.storage.blocks.rollup_rows import summary_of
from gradwatch_server.storage.rollup import LEVELS, Block, empty, levels_for, merge_into, stored_levels, summarise

GAP_STEPS = 4  # a key's levels are chosen once it has points at this many steps (rollup.levels_for)


@dataclass
class Slot:
    """One (key, level): the block held in memory (if any) and the newest block number stored (-1: none)."""

    b: int | None = None
    block: Block | None = None
    newest: int = -1


@dataclass
class Cache:
    """The writer's rollup state for the keys of one run."""

    slots: dict = field(default_factory=dict)  # (key_id, level) -> Slot
    top: dict = field(default_factory=dict)  # key_id -> the newest step folded in (None: none yet)
    levels: dict = field(default_factory=dict)  # key_id -> its levels (levels_for its width and gap)
    waiting: dict = field(default_factory=dict)  # key_id -> the first distinct steps of its points, too few to choose
    # its levels (_gap): nothing of its rollups is written until they are chosen


def new_key(cache: Cache, key_id: int) -> None:
    """A key created just now has no rollups yet: nothing to look up."""
    for level in LEVELS:
        cache.slots[(key_id, level)] = Slot()
    cache.top[key_id] = None


def read_block(conn, key_id: int, level: int, b: int, slots: int) -> Block:
    """A stored block (an empty one if it is not on disk)."""
    row = conn.execute(_SELECT, {"k": key_id, "lv": level, "b": b}).first()
    if row is None:
        return empty(slots)
    data = summary_of(conn, key_id, level, b, row.data, slots)
    if data is None:  # the layout changed (or the row is damaged): summarise from here on under the new one
        block = empty(slots)
        block.stored = True
        return block
    return Block(data, row.n, True)


def prepare(conn, cache: Cache, key_id: int, slots: int, steps) -> tuple:
    """A key's levels, and the points stored before this batch that its rollups do not hold yet (None: none).

    On a key's first batch since the cache was built: where its rollups end, and its unfinished blocks
    rebuilt. A key's levels are fixed by how far apart its first steps are (``_gap``, ``levels_for``) and kept
    for life, so a key with rollup rows has the levels from its finest one on. A key with no rows has all its
    points folded again with the batch (none of its blocks is done); one with points at too few steps has none.
    """
    levels = cache.levels.get(key_id)
    if levels is not None:
        return levels, None
    if (key_id, LEVELS[0]) not in cache.slots:
        newest = dict(conn.execute(_NEWEST, {"k": key_id}).all())
        for level in LEVELS:
            cache.slots[(key_id, level)] = Slot(newest=newest.get(level, -1))
        top = cache.top[key_id] = conn.execute(_TOP, {"k": key_id}).scalar()
        if newest:
            levels = cache.levels[key_id] = stored_levels(slots, min(newest))
            if top is not None:
                _rebuild(conn, cache, key_id, levels, slots, top)
            return levels, None
        if top is not None:  # points stored, no rows: all of them are folded again once its levels are chosen
            cache.waiting[key_id] = np.unique(chunks.read(conn, key_id, slots=slots).steps)[:GAP_STEPS]
    seen = cache.waiting.get(key_id)
    steps_so_far = steps if seen is None else np.concatenate([seen, steps])
    gap = _gap(steps_so_far)
    if gap is None:  # only a key's first few distinct steps decide: keep those
        cache.waiting[key_id] = np.unique(steps_so_far)[:GAP_STEPS]
        return (), None
    stored = None
    if seen is not None:  # points stored while it waited: folded with this batch
        points = chunks.read(conn, key_id, slots=slots)
        stored = (points.steps, points.walls, points.values, points.present())
        del cache.waiting[key_id]
    cache.top[key_id] = None  # what the rollups hold: the stored points, if any, are folded with this batch
    cache.levels[key_id] = levels = levels_for(slots, gap)
    return levels, stored


def _gap(steps) -> int | None:
    """How far apart a key's points are: the smallest gap between its first GAP_STEPS distinct steps (None: fewer
    steps). The smallest, so a key that jumps once early still keeps its fine levels (more bytes, never a slower read)."""
    first = np.unique(steps)[:GAP_STEPS]
    return int(np.diff(first).min()) if len(first) == GAP_STEPS else None


def _rebuild(conn, cache: Cache, key_id: int, levels: tuple, slots: int, top: int) -> None:
    """The newest block of every level that is not done, from what is on disk: the finest from raw points,
    each coarser one from its done, stored children (its unfinished child passes its points up later)."""
    for i, level in enumerate(levels):
        b = top // level
        if (b + 1) * level - 1 <= top:
            continue  # done: stored and current
        slot = cache.slots[(key_id, level)]
        if i == 0:
            points = chunks.read(conn, key_id, b * level, top, slots)
            block = empty(slots)
            if len(points):
                _, counts, data = summarise(
                    points.steps.astype(np.float64),
                    points.walls,
                    points.values,
                    points.present(),
                    np.zeros(len(points), dtype=np.int64),
                )
                merge_into(block.data, data[0])
                block.n = int(counts[0])
        else:
            child = levels[i - 1]
            first, last = b * level // child, (top + 1) // child - 1  # its children done so far
            block = empty(slots)
            for n, data in _children(conn, key_id, child, first, last, slots):
                merge_into(block.data, data)
                block.n += n
        block.up, block.dirty = block.n, block.n > 0
        block.stored = b <= slot.newest and _exists(conn, key_id, level, b)
        block.dirty = block.dirty or block.stored  # a stored row may be stale: rewrite it when the block is done
        slot.b, slot.block = b, block


def _children(conn, key_id: int, level: int, first: int, last: int, slots: int):
    """(n, summary) of the stored blocks first..last of a level written under this layout (``slots`` wide);
    blocks of an older layout are left out, as the eager path leaves their points out of a mixed block."""
    c = db.rollups.c
    rows = conn.execute(
        select(c.block, c.n, c.data).where(c.key_id == key_id, c.level == level, c.block >= first, c.block <= last)
    ).all()
    decoded = [(row.n, summary_of(conn, key_id, level, row.block, row.data, slots)) for row in rows]
    return [(n, data) for n, data in decoded if data is not None]


def _exists(conn, key_id: int, level: int, b: int) -> bool:
    return conn.execute(_SELECT, {"k": key_id, "lv": level, "b": b}).first() is not None


_r = db.rollups.c
_SELECT = select(_r.n, _r.data).where(
    _r.key_id == bindparam("k"), _r.level == bindparam("lv"), _r.block == bindparam("b")
)
_NEWEST = select(_r.level, func.max(_r.block)).where(_r.key_id == bindparam("k")).group_by(_r.level)
_TOP = select(func.max(db.chunks.c.last_step)).where(db.chunks.c.key_id == bindparam("k"))
