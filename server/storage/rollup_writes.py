"""Keeping rollups current as batches land: batches folded into the cache of every key's newest blocks.

A live run sends a step at a time. Writing a row of every level for every step cost more than
storing the step itself, so the newest block of each (key, level) waits in the cache and reaches
the database once it is *done*: once the key has a point at or past the block's last step (it is
full, or the stream moved on). Until then a live point is folded into the finest level only; a
done block passes what it gathered to the block above it (``_finish``), so a coarse block is
folded once per finer block, not once per step.

What readers rely on (storage/series.py reads whole blocks only up to the key's newest step):
at every commit, every block that ends at or before the key's newest step is stored and current.
A block not done may be missing or stale on disk. When a cache is built (a restart, an edit,
another process stored batches meanwhile) the newest block of every level is rebuilt from the
finer stored blocks and the raw points (storage/blocks/rollup_cache.py), so nothing a lost cache held is lost.

Batches that are not live-shaped (several finest blocks at once, or steps that went back)
take the eager path: pending blocks holding live points are passed up and written first, then the batch
is summarised at the finest level, each coarser level from the one below (``rollup.coarsen``); the blocks it
leaves done are written, and each level's newest
(not done) waits in the cache as a live one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import bindparam, update
from sqlalchemy.dialects import postgresql, sqlite

from gradwatch_server.storage import db
from gradwatch_server.storage.blocks import rollup_cache
from gradwatch_server.storage.blocks.rollup_cache import Cache
from gradwatch_server.storage.rollup import (
    HEAT_ROWS,
    Block,
    coarsen,
    empty,
    encode_many,
    fold_point,
    heats_of,
    lean_walls,
    merge_into,
    summarise,
)

POINT_VALUES = 64  # a batch of at most this many values per key is folded in plain Python (rollup.fold_point)
INSERT, REWRITE, RECOUNT = 0, 1, 2  # how a block's row is written; of two for one block, the lower wins


@dataclass
class Writes:
    """The rollup rows a batch changes, one entry per block, written as each block is at ``flush``.

    One entry per block, so a block written twice in a batch (finished, then folded again) is
    written once, as it ends up; ``pending`` lets a read see a block whose row is not flushed yet.
    """

    blocks: dict = field(default_factory=dict)  # (key_id, level, b) -> [Block, how, heat changed]

    def note(self, key_id: int, level: int, b: int, block: Block, how: int, heat: bool = True) -> None:
        held = self.blocks.get((key_id, level, b))
        if held is None:
            self.blocks[(key_id, level, b)] = [block, how, heat and how != RECOUNT]
        else:
            held[0], held[1] = block, min(held[1], how)
            held[2] = held[2] or (heat and how != RECOUNT)

    def store(self, key_id: int, level: int, b: int, block: Block) -> None:
        """Write a block as it is (a new row, or its stored row rewritten)."""
        self.note(key_id, level, b, block, REWRITE if block.stored else INSERT)
        block.stored, block.dirty = True, False

    def pending(self, key_id: int, level: int, b: int) -> Block | None:
        held = self.blocks.get((key_id, level, b))
        return None if held is None else held[0]

    def flush(self, conn, omits=None) -> None:
        """Write the noted blocks. ``omits`` (clock.Clock.omits without its connection; the caller flushes
        the clock after) lets a vector's summary be stored lean, its heat row then written with it."""
        rows: dict = {INSERT: [], REWRITE: [], RECOUNT: []}
        heat: dict = {INSERT: [], REWRITE: []}
        written = [block.data for block, how, _heat in self.blocks.values() if how != RECOUNT]
        leaned = lean_walls(written, omits) if omits is not None else [False] * len(written)
        leans, blobs = iter(leaned), iter(encode_many(written, leaned))
        for (key_id, level, b), (block, how, heat_changed) in self.blocks.items():
            lean = how != RECOUNT and next(leans)
            blob = next(blobs) if how != RECOUNT else None
            if how == INSERT:
                rows[INSERT].append({"key_id": key_id, "level": level, "block": b, "n": block.n, "data": blob})
            else:
                row = {"k": key_id, "lv": level, "b": b, "n": block.n}
                rows[how].append({**row, "d": blob} if how == REWRITE else row)
            if (heat_changed or lean) and block.data.shape[1] > 1:  # vector keys only; a lean summary's maxima
                heat[how].append({"key_id": key_id, "level": level, "block": b, "data": block.data})
        self.blocks = {}
        for rows_of in heat.values():
            for row, blob in zip(rows_of, heats_of([row["data"] for row in rows_of])):
                row["data"] = blob
        for statement, params in (
            (_INSERT, rows[INSERT]),
            (_REWRITE, rows[REWRITE]),
            (_RECOUNT, rows[RECOUNT]),
            (_HEAT_INSERT, heat[INSERT]),
        ):
            if params:
                conn.execute(statement, params)
        if heat[REWRITE]:
            upsert_heat(conn, heat[REWRITE])


def upsert_heat(conn, rows: list) -> None:
    """Heat rows (``rollup_heat`` columns) written whether or not their blocks have one (blocks stored
    before heat rows have none; a lean summary's maxima must be there)."""
    conn.execute(_HEAT_UPSERT[conn.dialect.name], rows)


def update_rollups(conn, cache: Cache, key_id: int, steps, walls, values, present, writes: Writes | None = None):
    """Fold a batch of one key (values and presence: (k, slots) arrays) into its rollups.

    With ``writes`` the rows are collected there (the caller flushes once per batch) and a block
    not done yet may wait in ``cache``; without, everything is written now (a one-off rebuild).
    """
    now = writes is None
    writes = Writes() if now else writes
    _update(conn, cache, [(key_id, slice(None))], values.shape[1], steps, walls, values, present, writes)
    if now:
        write_pending(conn, cache, writes)
        writes.flush(conn)


def update_many(conn, cache: Cache, key_ids: list[int], steps, walls, values, present, writes: Writes) -> None:
    """``update_rollups`` for scalar keys logged at the same steps, summarised together: column j is key j."""
    _update(
        conn, cache, [(k, slice(j, j + 1)) for j, k in enumerate(key_ids)], 1, steps, walls, values, present, writes
    )


def write_pending(conn, cache: Cache, writes: Writes) -> None:
    """Write every block still waiting in the cache (a run that ended: its newest blocks are final)."""
    for key_id in list(cache.levels):
        _write_key(conn, cache, writes, key_id)


def _update(conn, cache: Cache, targets: list, slots: int, steps, walls, values, present, writes: Writes) -> None:
    if not len(steps):
        return
    groups: dict = {}  # levels -> the targets that have them (keys logged together may differ in gap)
    for key_id, cols in targets:
        levels, stored = rollup_cache.prepare(conn, cache, key_id, slots, steps)
        if stored is not None:  # levels chosen just now: the points stored before this batch are folded with it
            both = (np.concatenate(pair) for pair in zip(stored, (steps, walls, values[:, cols], present[:, cols])))
            _fold(conn, cache, [(key_id, slice(None))], levels, slots, *both, writes)
        elif levels:
            groups.setdefault(levels, []).append((key_id, cols))
    for levels, group in groups.items():
        _fold(conn, cache, group, levels, slots, steps, walls, values, present, writes)


def _fold(conn, cache: Cache, targets: list, levels: tuple, slots: int, steps, walls, values, present, writes) -> None:
    """Fold a batch into the rollups of keys that share ``levels``: live-shaped ones point by point, the rest eagerly."""
    fine = levels[0]
    if len(steps) * slots <= POINT_VALUES:  # a live batch of few values: fold its points one by one
        few = steps.tolist()
        lo, hi = min(few), max(few)
        if lo // fine == hi // fine and _all_live(cache, targets, fine, lo // fine):
            rows = list(zip([float(s) for s in few], walls.tolist(), values.tolist(), present.tolist()))
            for key_id, cols in targets:
                block = _block_for(conn, cache, writes, key_id, 0, lo // fine, slots)
                for step, wall, row, ok in rows:
                    fold_point(block.data, step, wall, row[cols], ok[cols])
                _folded(conn, cache, writes, key_id, block, len(rows), hi)
            return
    order = np.argsort(steps, kind="stable")
    st, wl = steps[order].astype(np.float64), walls[order]
    # the finest level from the points, each coarser one from the level below it (bit for bit the same)
    finest = summarise(st, wl, values[order], present[order], (st // fine).astype(np.int64))
    top, b = int(st[-1]), int(st[0]) // fine
    if b == top // fine and _all_live(cache, targets, fine, b):
        for key_id, cols in targets:
            block = _block_for(conn, cache, writes, key_id, 0, b, slots)
            merge_into(block.data, finest[2][0][:, cols])
            _folded(conn, cache, writes, key_id, block, len(st), top)
        return
    after = {}  # each key's newest step once the batch is in: the blocks that end past it may wait in the cache
    for key_id, _cols in targets:
        old = cache.top.get(key_id)
        after[key_id] = top if old is None else max(old, top)
        _write_key(conn, cache, writes, key_id, after[key_id])
    items = []  # (key_id, level, block, n, summary) of every level: folded in one stacked numpy pass
    ids, ns, sums = finest
    for below, level in zip((fine, *levels), levels):
        if level != below:
            ids, ns, sums = coarsen(ids, ns, sums, level // below)
        for blk, n, data in zip(ids.tolist(), ns.tolist(), sums):
            items += [(key_id, level, int(blk), int(n), data[:, cols]) for key_id, cols in targets]
    _fold_eager(conn, cache, writes, items, after)
    cache.top.update(after)


def _all_live(cache: Cache, targets: list, fine: int, b: int) -> bool:
    """Whether a batch lying in finest block ``b`` can be folded lazily: it does not go back past a cached block."""
    for key_id, _cols in targets:
        slot = cache.slots[(key_id, fine)]
        if slot.b is not None and b < slot.b:
            return False
    return True


def _folded(conn, cache: Cache, writes: Writes, key_id: int, block: Block, n: int, top: int) -> None:
    """After a live batch was folded into a finest block: count it, then finish every block now done."""
    old = cache.top.get(key_id)
    top = top if old is None else max(old, top)
    cache.top[key_id] = top
    block.n += n
    block.up += n
    block.dirty = True
    for i, level in enumerate(cache.levels[key_id]):
        slot = cache.slots[(key_id, level)]
        if slot.block is not None and (slot.block.up or slot.block.dirty) and (slot.b + 1) * level - 1 <= top:
            _finish(conn, cache, writes, key_id, i)


def _finish(conn, cache: Cache, writes: Writes, key_id: int, i: int) -> None:
    """Pass a block's new points to the block above it, then write it if it changed."""
    levels = cache.levels[key_id]
    slot = cache.slots[(key_id, levels[i])]
    block = slot.block
    if block.up and i + 1 < len(levels):
        parent = _block_for(
            conn, cache, writes, key_id, i + 1, slot.b * levels[i] // levels[i + 1], block.data.shape[1]
        )
        merge_into(parent.data, block.data)  # extremes merge idempotently: only the counts must not repeat
        parent.n += block.up
        parent.up += block.up
        parent.dirty = True
    block.up = 0
    if block.dirty:
        writes.store(key_id, levels[i], slot.b, block)
        slot.newest = max(slot.newest, slot.b)


def _write_key(conn, cache: Cache, writes: Writes, key_id: int, top: int | None = None) -> None:
    """Finish every level's cached block of a key, finest first (each passes its points up before the next).

    With ``top`` (an eager batch's newest step), a block holding no live points to pass up that will not be
    done even then is left waiting: the batch folds into it in the cache, and it is written once, when done.
    """
    levels = cache.levels.get(key_id, ())
    for i, level in enumerate(levels):
        slot = cache.slots.get((key_id, level))
        if slot is None or slot.block is None or not (slot.block.up or slot.block.dirty):
            continue
        if top is None or slot.block.up or (slot.b + 1) * level - 1 <= top:
            _finish(conn, cache, writes, key_id, i)


def _block_for(conn, cache: Cache, writes: Writes, key_id: int, i: int, b: int, slots: int) -> Block:
    """Block ``b`` of level ``i`` in the cache, read from disk if stored; the block it replaces is finished first."""
    level = cache.levels[key_id][i]
    slot = cache.slots[(key_id, level)]
    if slot.b == b and slot.block is not None and slot.block.data.shape[1] == slots:
        return slot.block
    if slot.block is not None and (slot.block.up or slot.block.dirty):
        _finish(conn, cache, writes, key_id, i)
    pending = writes.pending(key_id, level, b)
    if pending is not None and pending.data.shape[1] == slots:
        slot.b, slot.block = b, pending  # written earlier in this batch, not flushed yet
        return pending
    block = rollup_cache.read_block(conn, key_id, level, b, slots) if b <= slot.newest else empty(slots)
    if pending is not None:  # its row goes out with this batch, under the old layout: this one replaces it
        block.stored = True
    slot.b, slot.block = b, block
    return block


def _fold_eager(conn, cache: Cache, writes: Writes, items: list, after: dict) -> None:
    """Block summaries ``(key_id, level, block, n, data)`` into their blocks: each done one (it ends at or before
    its key's newest step, ``after``) written now (a new row, a rewrite or a recount), the rest left in the cache
    (dirty, written when done: a bulk import's partial coarse blocks would otherwise be rewritten every batch).

    The blocks that already hold points are merged in one stacked numpy pass, not level by level
    and key by key: the fixed cost of a numpy call, not the arithmetic, is what a small batch pays.
    """
    existing = []
    for key_id, level, b, n, part in items:
        slot = cache.slots[(key_id, level)]
        done = (b + 1) * level - 1 <= after[key_id]
        if b > slot.newest and slot.b != b:  # a block never stored nor cached
            if slot.block is not None and (slot.block.up or slot.block.dirty):
                _finish(conn, cache, writes, key_id, cache.levels[key_id].index(level))  # (before a rewind)
            slot.b, slot.block = b, Block(part.copy(), n)
            if done:
                writes.store(key_id, level, b, slot.block)
                slot.newest = max(slot.newest, b)  # _finish above may have stored a later block
            else:
                slot.block.dirty = True
        else:
            i = cache.levels[key_id].index(level)
            existing.append((key_id, level, b, n, _block_for(conn, cache, writes, key_id, i, b, part.shape[1]), part))
    if not existing:
        return
    stacked = np.concatenate([e[4].data for e in existing], axis=1)
    heat_before = stacked[HEAT_ROWS]  # a copy: a new minimum alone leaves the heat row as it is
    changed = merge_into(stacked, np.concatenate([e[5] for e in existing], axis=1))
    heat_changed = (stacked[HEAT_ROWS] != heat_before).any(axis=0)
    offset = 0
    for key_id, level, b, n, block, part in existing:
        width = part.shape[1]
        block.data[:] = stacked[:, offset : offset + width]
        block.n += n
        if (b + 1) * level - 1 > after[key_id]:
            block.dirty = True  # not done: written when it is (a stored row of it is stale meanwhile)
        elif block.dirty or not block.stored:
            writes.store(key_id, level, b, block)
            slot = cache.slots[(key_id, level)]
            slot.newest = max(slot.newest, b)
        elif changed[offset : offset + width].any():
            writes.note(key_id, level, b, block, REWRITE, bool(heat_changed[offset : offset + width].any()))
        else:
            writes.note(key_id, level, b, block, RECOUNT)  # same extremes, more points: the count, not the summary
        offset += width


_r = db.rollups.c
_UPDATE = update(db.rollups).where(_r.key_id == bindparam("k"), _r.level == bindparam("lv"), _r.block == bindparam("b"))
# Built once (a batch runs them every time; building one cost more than running it).
_INSERT = db.rollups.insert()
_REWRITE = _UPDATE.values(n=bindparam("n"), data=bindparam("d"))
_RECOUNT = _UPDATE.values(n=bindparam("n"))
_HEAT_INSERT = db.rollup_heat.insert()


def _heat_upsert(dialect):
    stmt = dialect.insert(db.rollup_heat)
    return stmt.on_conflict_do_update(index_elements=["key_id", "level", "block"], set_={"data": stmt.excluded.data})


_HEAT_UPSERT = {"sqlite": _heat_upsert(sqlite), "postgresql": _heat_upsert(postgresql)}
