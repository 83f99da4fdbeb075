"""A key's points stored in blocks ("chunks"): packing, appending with compaction, reading a range.

Why blocks (measured in docs/storage.md): a row per point costs the database a B-tree entry,
an index entry and SQLAlchemy's per-row Python work; a row per few thousand points costs one
of each for all of them, so ingest beats raw row-per-point inserts. A live run sends small
batches, so each batch first lands as a small row; once a key's small rows hold a full chunk
they are merged into one (each point is written about twice, never rewritten in place).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import BigInteger, and_, bindparam, delete, func, insert, or_, select

from gradwatch_server.storage import db
from gradwatch_server.storage.blocks import clock, codec
from gradwatch_server.storage.prepared import Prepared

log = logging.getLogger("gradwatch.server")

CHUNK_VALUES = 2048  # values (steps x slots) per full chunk: 48 KiB for a scalar key
# Steps per full chunk of a wide vector (before 0009: 16). Fewer, bigger rows: SQLite's row and page
# overhead of a 300-layer key fell from ~0.7 to ~0.4 bytes a value (docs/benchmarks.md, issue #31).
MIN_STEPS, LEGACY_MIN_STEPS = 64, 16


def capacity(slots: int) -> int:
    """Steps per full chunk for a key with ``slots`` values per step."""
    return max(MIN_STEPS, CHUNK_VALUES // max(1, slots))


def legacy_capacity(slots: int) -> int:
    """Steps per full chunk as releases before 0009 wrote them (their rows carry no ``small`` mark)."""
    return max(LEGACY_MIN_STEPS, CHUNK_VALUES // max(1, slots))


def small_rows(slots: int):
    """The condition that picks a key's small rows: marked since 0009; before, fewer steps than a full chunk.
    ``n`` is tested first so that SQLite reads ``small`` (after the blobs in an upgraded file) only for them."""
    c = db.chunks.c
    return and_(c.n < capacity(slots), or_(c.small == 1, and_(c.small.is_(None), c.n < legacy_capacity(slots))))


def f64(array: np.ndarray) -> bytes:
    """float64 little-endian bytes (NaN/inf bit-exact): the one packing of values on the server."""
    return np.ascontiguousarray(array, dtype="<f8").tobytes()


def from_f64(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f8")


def all_present(shape: tuple) -> np.ndarray:
    """An all-true mask of this shape: read-only and made once for a live batch's small shapes (one per key a batch)."""
    return _small_mask(shape) if math.prod(shape) <= 4096 else np.ones(shape, dtype=bool)


@functools.lru_cache(maxsize=256)
def _small_mask(shape: tuple) -> np.ndarray:
    mask = np.ones(shape, dtype=bool)
    mask.setflags(write=False)
    return mask


FEW_STEPS = 64  # steps up to which plain Python answers faster than numpy (a live batch has one or two)


def span(steps: np.ndarray) -> tuple[int, int]:
    """(smallest, largest) of a non-empty array of steps, as ints; plain Python for a live batch's few."""
    if len(steps) <= FEW_STEPS:
        few = steps.tolist()
        return min(few), max(few)
    return int(steps.min()), int(steps.max())


@dataclass
class Points:
    """Points of one key in step order: steps (n,), walls (n,), values (n, slots), missing (n, slots) or None."""

    steps: np.ndarray
    walls: np.ndarray
    values: np.ndarray
    missing: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.steps)

    def present(self) -> np.ndarray:
        return all_present(self.values.shape) if self.missing is None else ~self.missing

    def take(self, index) -> Points:
        return Points(
            self.steps[index],
            self.walls[index],
            self.values[index],
            None if self.missing is None else self.missing[index],
        )


@dataclass
class Tail:
    """A key's small rows not yet merged into a full chunk (kept in memory to merge without a read)."""

    ids: list = field(default_factory=list)
    parts: list = field(default_factory=list)
    n: int = 0
    slots: int | None = None
    key_id: int | None = None
    sealed: bool = False  # its rows are one compressed row (``seal``)


def _row(key_id: int, p: Points, packed: bool = False, omits=None, small: bool = True) -> dict:
    """A chunk row: ``packed``, one compressed blob in ``data`` (codec.py; steps and walls empty),
    else the raw arrays (a live batch's small row: cheapest to write, merged away soon).
    ``omits(steps, walls)``: whether the run clock holds these walls, so the blob leaves them out;
    ``small``: a row still to be merged into a full chunk (marked so: ``small_rows``)."""
    missing = p.missing if p.missing is not None and p.missing.any() else None
    first, last = span(p.steps)
    row = {"key_id": key_id, "first_step": first, "last_step": last, "n": len(p)}
    row["small"] = 1 if small else None
    if packed:
        walls = None if omits is not None and omits(p.steps, p.walls) else p.walls
        blob = codec.encode_chunk(p.steps, walls, p.values, missing)
        return {**row, "steps": b"", "walls": b"", "data": blob, "missing": None}
    return {
        **row,
        "steps": np.ascontiguousarray(p.steps, dtype="<i8").tobytes(),
        "walls": f64(p.walls),
        "data": f64(p.values),
        "missing": None if missing is None else missing.astype(np.uint8).tobytes(),
    }


def packed_row(key_id: int, p: Points, omits=None, small: bool = True) -> dict:
    """A compressed chunk row of these points (``gradwatch db compact`` writes these); as in ``_row``."""
    return _row(key_id, p, packed=True, omits=omits, small=small)


def concat(parts: list[Points]) -> Points:
    if len(parts) == 1:
        return parts[0]
    missing = None
    if any(p.missing is not None for p in parts):
        missing = np.concatenate(
            [p.missing if p.missing is not None else np.zeros(p.values.shape, dtype=bool) for p in parts]
        )
    return Points(
        np.concatenate([p.steps for p in parts]),
        np.concatenate([p.walls for p in parts]),
        np.concatenate([p.values for p in parts]),
        missing,
    )


@dataclass
class Writes:
    """The chunk rows of one batch, across keys, written with a few statements in all (``flush``)."""

    deletes: list = field(default_factory=list)  # ids of small rows merged into full chunks
    full: list = field(default_factory=list)  # rows of full chunks
    small: list = field(default_factory=list)  # (tail, points, row) of small rows: their ids go to the tail

    def flush(self, conn) -> None:
        if self.deletes:
            conn.execute(delete(db.chunks).where(db.chunks.c.id.in_(self.deletes)))
        if self.full:
            conn.execute(db.chunks.insert(), self.full)
        if self.small:
            ids = _insert_small(conn, [row for _tail, _points, row in self.small])
            for (tail, points, _row), row_id in zip(self.small, ids):
                tail.ids.append(row_id)
                tail.parts.append(points)
                tail.n += len(points)
        self.deletes, self.full, self.small = [], [], []


SMALL_COLUMNS = ("key_id", "first_step", "last_step", "n", "small", "steps", "walls", "data", "missing")
SMALL_PER_INSERT = 64  # rows of one multi-row insert (9 parameters a row, well under SQLite's 32,766)
FEW_ROWS = 10  # up to this many small rows, SQLite inserts them one statement each (``_insert_small``)


def _insert_small(conn, rows: list[dict]) -> list[int]:
    """Insert a batch's small rows (a row per key): one statement for all its keys, or on SQLite one a row
    for a few of them; their ids in order."""
    if conn.dialect.name == "sqlite" and len(rows) <= FEW_ROWS:
        # SQLite's RETURNING costs more than a statement a row with the driver's lastrowid, for a few
        # rows (measured: 2 rows 31 against 12 µs; 10 rows 80 against 66; 50 rows 489 against 600)
        return [_SMALL_INSERT_ONE.run(conn, row).lastrowid for row in rows]
    if len({row["key_id"] for row in rows}) < len(rows):  # ids are matched by key: one statement per row
        return [_small_insert(1).run(conn, _numbered([row])).fetchone()[0] for row in rows]
    ids: dict = {}
    for start in range(0, len(rows), SMALL_PER_INSERT):
        part = rows[start : start + SMALL_PER_INSERT]
        # RETURNING promises no order for several rows (SQLite, PostgreSQL): match them by key id.
        ids.update((key_id, row_id) for row_id, key_id in _small_insert(len(part)).run(conn, _numbered(part)))
    return [ids[row["key_id"]] for row in rows]


def _numbered(rows: list[dict]) -> dict:
    return {f"{c}_{i}": row[c] for i, row in enumerate(rows) for c in SMALL_COLUMNS}


# inline(): no RETURNING a dialect might add for the new id (the driver's lastrowid gives it)
_SMALL_INSERT_ONE = Prepared(insert(db.chunks).values({c: bindparam(c) for c in SMALL_COLUMNS}).inline())


@functools.lru_cache(maxsize=SMALL_PER_INSERT)
def _small_insert(n: int) -> Prepared:
    """``INSERT INTO chunks ... VALUES (...) x n RETURNING id, key_id``, compiled once per n (storage/prepared.py)."""
    values = [{c: bindparam(f"{c}_{i}") for c in SMALL_COLUMNS} for i in range(n)]
    return Prepared(insert(db.chunks).values(values).returning(db.chunks.c.id, db.chunks.c.key_id))


def append(writes: Writes, tail: Tail, key_id: int, points: Points, omits=None) -> None:
    """Plan a batch's points of one key: a small row until the key's small rows fill a chunk, then
    full chunks (the small rows merged in first, so repeated steps keep their arrival order).
    ``omits``: the run clock's test (``clock.Clock.omits``), so compressed rows may leave walls out."""
    slots = points.values.shape[1]
    cap = capacity(slots)
    if tail.slots is not None and tail.slots != slots:  # the layout changed: leave the old rows as they are
        tail.ids, tail.parts, tail.n = [], [], 0
    tail.slots, tail.key_id, tail.sealed = slots, key_id, False
    if tail.n + len(points) >= cap:
        if tail.ids:
            writes.deletes += tail.ids
            points = concat(tail.parts + [points])
            tail.ids, tail.parts, tail.n = [], [], 0
        full = (len(points) // cap) * cap
        writes.full += [
            packed_row(key_id, points.take(slice(i, i + cap)), omits, small=False) for i in range(0, full, cap)
        ]
        if full == len(points):
            return
        points = points.take(slice(full, None))
    # Raw, a live step's or a bulk batch's remainder: merged into a compressed full chunk within a few
    # batches (a bulk import compressed each batch's remainder only to delete it: a third of its server CPU).
    writes.small.append((tail, points, _row(key_id, points)))


def seal(writes: Writes, tail: Tail, omits=None) -> None:
    """A key whose run ended: its small rows merged into one compressed row (they would stay raw for good)."""
    if tail.key_id is None or not tail.ids or tail.sealed:
        return
    writes.deletes += tail.ids
    points = concat(tail.parts)
    tail.ids, tail.parts, tail.n, tail.sealed = [], [], 0, True
    writes.small.append((tail, points, packed_row(tail.key_id, points, omits)))


def load_tail(conn, key_id: int, slots: int) -> Tail:
    """A key's small rows still waiting to be merged (after a server restart or a cache reload), so they
    are merged with the next ones instead of staying small for good."""
    cols = db.chunks.c
    rows = conn.execute(select(*_COLUMNS).where(cols.key_id == key_id, small_rows(slots)).order_by(cols.id)).all()
    tail = Tail(slots=slots)
    for row in rows:
        part = _decode_or_report(conn, key_id, row, None)
        if part is not None and part.values.shape[1] == slots:  # written under this layout
            tail.ids.append(row.id)
            tail.parts.append(part)
            tail.n += len(part)
    _fill(conn, key_id, tail.parts)
    return tail


def append_now(conn, tail: Tail, key_id: int, points: Points) -> None:
    """``append`` and write at once (one key)."""
    writes = Writes()
    append(writes, tail, key_id, points)
    writes.flush(conn)


_COLUMNS = (db.chunks.c.id, db.chunks.c.first_step, db.chunks.c.last_step) + tuple(
    db.chunks.c[name] for name in ("steps", "walls", "data", "missing")
)
_reported: set = set()  # corrupt chunk ids already logged by this process


def _arrays(row) -> tuple:
    """(steps, walls, values (n, width), missing or None) of a row in either format; codec.Corrupt if damaged."""
    if codec.is_encoded(row.data):
        return codec.decode_chunk(row.data)
    steps = np.frombuffer(row.steps, dtype="<i8")
    n = len(steps)
    if not n or len(row.data) % (8 * n) or len(row.walls) != 8 * n:
        raise codec.Corrupt(f"raw chunk of {n} steps holds {len(row.data)} value bytes, {len(row.walls)} wall bytes")
    width = len(row.data) // 8 // n
    missing = None if row.missing is None else np.frombuffer(row.missing, dtype=np.uint8)
    if missing is not None and len(missing) != n * width:
        raise codec.Corrupt("raw chunk's missing mask has the wrong size")
    return (
        steps,
        from_f64(row.walls),
        from_f64(row.data).reshape(n, width),
        None if missing is None else missing.reshape(n, width) != 0,
    )


def _decode_or_report(conn, key_id: int, row, slots: int | None, column: int | None = None) -> Points | None:
    """``_decode``, or None for a damaged row: logged once with its run, key and steps, and left out
    of the answer, so one bad block costs only its own points, never the request or other keys."""
    try:
        return _decode(row, slots, column)
    except codec.Corrupt as exc:
        if row.id not in _reported:
            _reported.add(row.id)
            k = db.metric_keys.c
            where = conn.execute(select(k.run_id, k.key).where(k.id == key_id)).first()
            run, key = (where.run_id, where.key) if where else ("?", f"key id {key_id}")
            log.error(
                "gradwatch: corrupt chunk %s of run %s, key %r, steps %s-%s: %s (its points are left out)",
                row.id,
                run,
                key,
                row.first_step,
                row.last_step,
                exc,
            )
        return None


def decode_row(conn, key_id: int, row) -> Points | None:
    """A chunk row (either format, as read with all its columns) as Points; None if it is damaged."""
    try:
        points = _decode(row, None)
    except codec.Corrupt:
        return None
    _fill(conn, key_id, [points])
    return points


def _fill(conn, key_id: int, parts: list) -> None:
    """Wall times of the parts whose blob left them to the run clock, read from it (one query for all)."""
    need = [p for p in parts if p.walls is None]
    if not need:
        return
    walls = clock.walls_of(conn, key_id, np.concatenate([p.steps for p in need]))
    at = 0
    for p in need:
        p.walls, at = walls[at : at + len(p)], at + len(p)


def _decode(row, slots: int | None, column: int | None = None) -> Points:
    """One chunk row as Points; ``slots`` pads (no value) or cuts rows written under another layout;
    ``column`` keeps only that slot (one layer of a vector), before anything is copied."""
    steps, walls, values, missing = _arrays(row)
    n, width = values.shape
    if column is not None:
        if column >= width:  # written under an older, smaller layout: no value in that slot
            return Points(steps, walls, np.full((n, 1), np.nan), np.ones((n, 1), dtype=bool))
        values = values[:, column : column + 1]
        missing = None if missing is None else missing[:, column : column + 1]
        return Points(steps, walls, values, missing)
    if slots is not None and slots != width:
        padded = np.full((n, slots), np.nan)
        gone = np.ones((n, slots), dtype=bool)
        keep = min(slots, width)
        padded[:, :keep] = values[:, :keep]
        gone[:, :keep] = False if missing is None else missing[:, :keep]
        values, missing = padded, gone
    return Points(steps, walls, values, missing)


def empty(width: int = 1) -> Points:
    return Points(np.zeros(0, np.int64), np.zeros(0), np.zeros((0, width)), None)


def _points(conn, key_id: int, rows, slots: int | None, column: int | None) -> Points:
    """Chunk rows decoded to one width (``slots``, one ``column``, else the widest) and concatenated."""
    parts = [p for p in (_decode_or_report(conn, key_id, r, slots, column) for r in rows) if p is not None]
    if not parts:
        return empty(1 if column is not None else slots or 1)
    if column is None and slots is None:
        width = max(p.values.shape[1] for p in parts)
        if any(p.values.shape[1] != width for p in parts):  # rows from before a layout change
            parts = [p for p in (_decode_or_report(conn, key_id, r, width) for r in rows) if p is not None]
    _fill(conn, key_id, parts)
    return concat(parts)


_LOWEST, _HIGHEST = -(2**63), 2**63 - 1  # an open end of a range: every step


def _in_range(*columns):
    """A key's chunk rows (these columns) that reach into [lo, hi]: built once, as a chart's every read
    asks for it (building a select costs more than SQLite running it)."""
    cols = db.chunks.c
    return select(*columns).where(
        cols.key_id == bindparam("key"),
        cols.last_step >= bindparam("lo", type_=BigInteger),
        cols.first_step <= bindparam("hi", type_=BigInteger),
    )


def _span(lo: int | None, hi: int | None) -> tuple[int, int]:
    return (_LOWEST if lo is None else lo, _HIGHEST if hi is None else hi)


def read(
    conn, key_id: int, lo: int | None = None, hi: int | None = None, slots: int | None = None, column: int | None = None
) -> Points:
    """Every point of a key with lo <= step <= hi, in step order (repeated steps in arrival order);
    with ``column``, only that slot of each step."""
    lo, hi = _span(lo, hi)
    if hi < lo:
        return empty(1 if column is not None else slots or 1)
    rows = conn.execute(_READ, {"key": key_id, "lo": lo, "hi": hi}).all()
    points = _points(conn, key_id, rows, slots, column)
    keep = (points.steps >= lo) & (points.steps <= hi)
    order = np.argsort(points.steps[keep], kind="stable")
    return points.take(np.flatnonzero(keep)[order])


def bounds(conn, key_id: int, start: int | None, end: int | None) -> tuple:
    """The (first, last) step of a key's points within [start, end], from chunk headers; (None, None) if none.

    Exact at the ends of a key's data; inside a chunk that straddles ``start`` or ``end`` the bound
    is the range edge itself (readers only use these to size buckets).
    """
    lo, hi = _span(start, end)
    lo, hi = conn.execute(_BOUNDS, {"key": key_id, "lo": lo, "hi": hi}).one()
    if lo is None or hi is None:
        return None, None
    lo = max(lo, start) if start is not None else lo
    hi = min(hi, end) if end is not None else hi
    return (lo, hi) if lo <= hi else (None, None)


_READ = _in_range(*_COLUMNS).order_by(db.chunks.c.id)
_BOUNDS = _in_range(func.min(db.chunks.c.first_step), func.max(db.chunks.c.last_step))


def latest(conn, key_id: int, count: int, slots: int | None = None) -> Points:
    """The ``count`` highest-step points of a key (for warming the health rules after a restart)."""
    cols = db.chunks.c
    rows = conn.execute(
        select(*_COLUMNS).where(cols.key_id == key_id).order_by(cols.last_step.desc()).limit(max(4, count))
    ).all()
    points = _points(conn, key_id, rows, slots, None)
    return points.take(np.argsort(points.steps, kind="stable")[-count:])


def delete_keys(conn, key_ids) -> None:
    conn.execute(delete(db.chunks).where(db.chunks.c.key_id.in_(key_ids)))
