"""One clock per run: a run's step -> wall time stored once, so a chunk whose wall times all equal the
clock's stores none (codec's CLOCK flag) instead of every key repeating the same record's wall time.

What the clock holds: for each step it names, the wall time of the first record the writer saw at
that step, and only steps above every step it already names (a run that goes back in steps adds
nothing; chunks there simply keep their own walls). An entry never changes once written, so a chunk
encoded against it stays exact; a chunk whose walls differ anywhere keeps them (nothing is lossy).

Rows (``run_clock``) hold up to ``BLOCK`` entries over disjoint step ranges, each one ``codec``
chunk blob with no values. The writer keeps its run's newest entries in memory (``Clock``) and
writes the ones a compressed chunk relies on in that chunk's own transaction (``flush``), so a
committed chunk never names a clock entry that is not committed with it. ``gradwatch db compact``
builds the clock of an ended run that has none from its chunks (``build``).
"""

from __future__ import annotations

import logging

import numpy as np
from sqlalchemy import bindparam, delete, func, select, update

from gradwatch_server.storage import db
from gradwatch_server.storage.blocks import codec

log = logging.getLogger("gradwatch.server")

BLOCK = 4096  # entries per clock row: 16 KB of raw (step, wall) pairs, a few hundred bytes compressed
_NO_VALUES = np.zeros((0, 0))


def _blob(steps: np.ndarray, walls: np.ndarray) -> dict:
    """A clock row's columns for these entries (steps increasing)."""
    data = codec.encode_chunk(steps, walls, _NO_VALUES.reshape(len(steps), 0))
    return {"first_step": int(steps[0]), "last_step": int(steps[-1]), "n": len(steps), "data": data}


def _decoded(row) -> tuple | None:
    """(steps, walls) of one clock row; kept per process by id and checksum (a tail row that grew is
    another blob, so never a stale answer), as every read of a key's points asks for the same rows."""
    key = (row.id, bytes(row.data[12:16]), len(row.data))
    hit = _cache.get(key)
    if hit is None:
        try:
            s, w, _values, _missing = codec.decode_chunk(row.data)
        except codec.Corrupt as exc:
            log.error(
                "gradwatch: corrupt run clock row %s (steps %s-%s): %s", row.id, row.first_step, row.last_step, exc
            )
            return None
        if len(_cache) >= _CACHED:
            _cache.pop(next(iter(_cache)))
        hit = _cache[key] = (s, w)
    return hit


_cache: dict = {}  # (row id, crc, length) -> (steps, walls), oldest first
_CACHED = 256  # rows: ~1M steps of clocks, ~16 MB


def _entries(rows) -> tuple[np.ndarray, np.ndarray]:
    """(steps, walls) of clock rows in step order; a damaged row is logged and left out."""
    steps, walls = [np.zeros(0, np.int64)], [np.zeros(0)]
    for row in rows:
        pair = _decoded(row)
        if pair is not None:
            steps.append(pair[0])
            walls.append(pair[1])
    steps, walls = np.concatenate(steps), np.concatenate(walls)
    order = np.argsort(steps, kind="stable")
    return steps[order], walls[order]


def _stored(conn, run_id: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Clock entries of a run over [lo, hi], in step order."""
    return _entries(conn.execute(_BY_RUN, {"run": run_id, "lo": lo, "hi": hi}).all())


def _range(by):
    c = db.run_clock.c
    query = select(c.id, c.first_step, c.last_step, c.data).where(
        c.run_id == by, c.last_step >= bindparam("lo"), c.first_step <= bindparam("hi")
    )
    return query.order_by(c.first_step)


# Built once: a chart's read asks for these every time (building a select costs more than running it).
_BY_RUN = _range(bindparam("run"))
_BY_KEY = _range(select(db.metric_keys.c.run_id).where(db.metric_keys.c.id == bindparam("key")).scalar_subquery())


def _lookup(steps: np.ndarray, walls: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(walls, found) of ``wanted`` steps in sorted clock entries."""
    at = np.clip(np.searchsorted(steps, wanted), 0, max(0, len(steps) - 1))
    found = steps[at] == wanted if len(steps) else np.zeros(len(wanted), dtype=bool)
    out = walls[at] if len(steps) else np.full(len(wanted), np.nan)
    return np.where(found, out, np.nan), found


def walls_of(conn, key_id: int, steps: np.ndarray) -> np.ndarray:
    """The run clock's wall times at these steps of a key's chunk (readers); NaN, logged, where it has none."""
    rows = conn.execute(_BY_KEY, {"key": key_id, "lo": int(steps.min()), "hi": int(steps.max())}).all()
    c_steps, c_walls = _entries(rows)
    walls, found = _lookup(c_steps, c_walls, steps)
    if not found.all():
        log.error(
            "gradwatch: run clock of key id %s lacks %d steps; their wall times read as NaN", key_id, (~found).sum()
        )
    return walls


class Clock:
    """The writer's clock of one run: its newest written row and the entries not yet written."""

    def __init__(self, run_id: int, tail=None) -> None:
        self.run_id = run_id
        self.tail_id = None if tail is None else tail.id
        self.steps, self.walls = _entries([tail]) if tail is not None else (np.zeros(0, np.int64), np.zeros(0))
        self.written = len(self.steps)  # entries of ``steps`` already in the tail row
        self.last = int(self.steps[-1]) if len(self.steps) else None
        self.dirty = False  # a chunk of this batch relies on unwritten entries
        if tail is not None and not len(self.steps):  # a damaged tail row: never overwritten, never overlapped
            self.tail_id, self.last = None, int(tail.last_step)

    @classmethod
    def load(cls, conn, run_id: int) -> Clock:
        c = db.run_clock.c
        tail = conn.execute(
            select(c.id, c.first_step, c.last_step, c.data)
            .where(c.run_id == run_id)
            .order_by(c.last_step.desc())
            .limit(1)
        ).first()
        return cls(run_id, tail)

    @classmethod
    def whole(cls, conn, run_id: int) -> Clock:
        """Every entry of a run's clock in memory, read only (``gradwatch db compact`` of an ended run)."""
        out = cls(run_id)
        out.steps, out.walls = _stored(conn, run_id, -(2**63), 2**63 - 1)
        out.written = len(out.steps)
        out.last = int(out.steps[-1]) if len(out.steps) else None
        return out

    def observe(self, steps: np.ndarray, walls: np.ndarray, ascending: bool = False) -> None:
        """A batch's records: each step above the clock's newest, with its first record's wall time.

        ``ascending``: the steps strictly increase (a live batch's), so the new ones are a suffix and
        none repeats: no ``np.unique`` (a third of this call's cost on a two-step batch).
        """
        if not len(steps):
            return
        if ascending:
            if self.last is None or int(steps[0]) > self.last:  # all new: a live batch's usual case
                fresh, fresh_walls = steps, walls
            else:
                start = int(np.searchsorted(steps, self.last, side="right"))
                if start == len(steps):
                    return
                fresh, fresh_walls = steps[start:], walls[start:]
        else:
            new = steps > self.last if self.last is not None else np.ones(len(steps), dtype=bool)
            if not new.any():
                return
            fresh, first = np.unique(steps[new], return_index=True)
            fresh_walls = walls[new][first]
        self.steps = np.concatenate([self.steps, np.asarray(fresh, dtype=np.int64)])
        self.walls = np.concatenate([self.walls, fresh_walls])
        self.last = int(fresh[-1])

    def omits(self, conn, steps: np.ndarray, walls: np.ndarray) -> bool:
        """Whether these walls are all the clock's at these steps (bit for bit), so a chunk may leave them out."""
        if not len(steps) or self.last is None or steps.max() > self.last:
            return False
        mine, found = _lookup(self.steps, self.walls, steps)
        older = ~found & (steps < (self.steps[0] if len(self.steps) else self.last + 1))
        if older.any():  # a sparse key's chunk reaches back past the rows held in memory
            s, w = _stored(conn, self.run_id, int(steps[older].min()), int(steps[older].max()))
            mine[older], found[older] = _lookup(s, w, steps[older])
        same = found.all() and (mine.view(np.int64) == np.ascontiguousarray(walls, np.float64).view(np.int64)).all()
        if same and steps.max() >= (self.steps[self.written] if self.written < len(self.steps) else self.last + 1):
            self.dirty = True
        return bool(same)

    def flush(self, conn) -> None:
        """Write the entries a chunk of this transaction relies on (the tail row grows up to BLOCK entries)."""
        if not self.dirty or self.written == len(self.steps):
            self.dirty = False
            return
        c = db.run_clock.c
        begin = pos = 0  # the window always starts at the tail row's first entry
        if self.tail_id is not None:
            pos = min(len(self.steps), BLOCK)
            if pos > self.written:  # the tail row grows
                values = _blob(self.steps[:pos], self.walls[:pos])
                conn.execute(update(db.run_clock).where(c.id == self.tail_id).values(**values))
        for i in range(pos, len(self.steps), BLOCK):
            row = {"run_id": self.run_id, **_blob(self.steps[i : i + BLOCK], self.walls[i : i + BLOCK])}
            self.tail_id = conn.execute(db.run_clock.insert().returning(c.id), row).scalar()
            begin = i
        self.steps, self.walls = self.steps[begin:], self.walls[begin:]
        self.written = len(self.steps)
        self.dirty = False


def delete_run(conn, run_id: int) -> None:
    conn.execute(delete(db.run_clock).where(db.run_clock.c.run_id == run_id))


def build(conn, run_id: int, key_points: list) -> int:
    """An ended run's clock from its chunks' points (``gradwatch db compact``), if it has none: at each
    step the wall time most of its points there carry. Returns the entries written."""
    if conn.execute(select(func.count()).where(db.run_clock.c.run_id == run_id)).scalar():
        return 0
    pairs = [np.stack([p.steps, p.walls.view(np.int64)], axis=1) for p in key_points if len(p)]
    if not pairs:
        return 0
    unique, counts = np.unique(np.concatenate(pairs), axis=0, return_counts=True)
    order = np.lexsort((-counts, unique[:, 0]))  # by step, the most common wall first
    ranked = unique[order]
    first = np.flatnonzero(np.diff(ranked[:, 0], prepend=ranked[0, 0] - 1) != 0)
    steps, walls = ranked[first, 0], ranked[first, 1].view(np.float64)
    rows = [
        {"run_id": run_id, **_blob(steps[i : i + BLOCK], walls[i : i + BLOCK])} for i in range(0, len(steps), BLOCK)
    ]
    conn.execute(db.run_clock.insert(), rows)
    return len(steps)
