"""Rollup summaries as blobs: small (rows, width) float64 arrays, each row float32 where that is exact, absent
rows left out, a wide summary's repeated rows as palettes; decoded many at a time for a chart.

The blob's header, checksum and compression are the chunks' (codec.py): ``codec.seal`` and ``codec.open_blob``.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from gradwatch_server.storage.blocks import codec


def encode_array(data: np.ndarray, compressor: int | None = None) -> bytes:
    """A (rows <= 16, width) float64 array (a rollup summary), each row float32 where that is exact."""
    return encode_arrays([data], compressor)[0]


def _with_palettes(data: np.ndarray, exact: np.ndarray, absent: np.ndarray, compressor: int | None) -> bytes:
    """One wide array with float64 rows (``exact``, ``absent``: its rows' kinds), those with few distinct values
    as palettes."""
    rows, width = data.shape
    mask = int(np.dot(exact, 1 << np.arange(rows)))
    palettes = _palettes(data, exact | absent)
    plain = ~exact & ~absent
    plain[[r for r, _ in palettes]] = False
    flags, parts = 0, []
    if absent.any():
        flags |= codec.ABSENT
        parts.append(struct.pack("<H", int(np.dot(absent, 1 << np.arange(rows)))))
    if palettes:
        flags |= codec.PALETTE
        parts.append(struct.pack("<H", sum(1 << r for r, _ in palettes)))
    parts += [codec.shuffle(data[exact].astype("<f4").ravel()), codec.shuffle(data[plain].ravel())]
    for _row, (distinct, index) in palettes:
        parts += [bytes([len(distinct) - 1]), codec.shuffle(distinct), index.astype(np.uint8).tobytes()]
    return codec.seal(codec.ARRAY, flags, mask, rows, width, b"".join(parts), compressor)


def encode_arrays(items: list, compressor: int | None = None) -> list[bytes]:
    """``encode_array`` of each array, the same blobs: arrays of a shape are stacked, their float32 and absent rows
    told and byte-shuffled in one numpy pass each (a bulk batch writes thousands of summaries: per array, those
    numpy calls cost more than zstd). A wide array with a row that is neither (walls: palettes) goes alone."""
    out: list = [None] * len(items)
    shapes: dict = {}  # (rows, width) -> indices of the arrays of that shape
    for i, data in enumerate(items):
        rows, width = np.shape(data)
        if rows > 16:
            raise ValueError(f"a summary array has at most 16 rows, not {rows}")
        shapes.setdefault((rows, width), []).append(i)
    for (rows, width), index in shapes.items():
        stack = np.stack([np.asarray(items[i], dtype="<f8") for i in index])
        exact, absent = _row_kinds(stack)
        weights = 1 << np.arange(rows)
        layouts: dict = {}  # (f32 row mask, absent row mask) -> positions in the stack
        for j, key in enumerate(zip(exact @ weights, absent @ weights)):
            layouts.setdefault((int(key[0]), int(key[1])), []).append(j)
        for (mask, gone), members in layouts.items():
            f64 = [r for r in range(rows) if not (mask | gone) >> r & 1]
            if f64 and width >= PALETTE_WIDTH:  # rows that may be palettes
                for j in members:
                    out[index[j]] = _with_palettes(stack[j], exact[j], absent[j], compressor)
                continue
            f32 = [r for r in range(rows) if mask >> r & 1]
            head, flags = (struct.pack("<H", gone), codec.ABSENT) if gone else (b"", 0)
            group = stack[members]
            for j, a, b in zip(members, _shuffled(group[:, f32].astype("<f4")), _shuffled(group[:, f64])):
                out[index[j]] = codec.seal(codec.ARRAY, flags, mask, rows, width, head + a + b, compressor)
    return out


def _row_kinds(stack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float32-exact, absent) flags, (k, rows) each, of a (k, rows, width) stack of summaries: a row is stored
    as float32 when every value round-trips bit-exactly, and left out when all are ABSENT_VALUE (not both)."""
    bits = stack.view("<i8")
    with np.errstate(all="ignore"):  # values past float32's range simply stay float64
        exact = (stack.astype("<f4").astype("<f8").view("<i8") == bits).all(axis=2)
    absent = (bits == np.float64(codec.ABSENT_VALUE).view("<i8")).all(axis=2)
    return exact & ~absent, absent


def _shuffled(stack: np.ndarray) -> list[bytes]:
    """``codec.shuffle`` of each array of a (k, ...) stack (each one's values row-major)."""
    k, size = len(stack), stack.dtype.itemsize
    flat = np.ascontiguousarray(stack).reshape(k, -1)
    planes = np.ascontiguousarray(flat.view(np.uint8).reshape(k, -1, size).transpose(0, 2, 1))
    return [row.tobytes() for row in planes.reshape(k, -1)]


PALETTE_WIDTH = 32  # arrays this wide may keep rows as palettes (a vector's summary; heat rows are float32)


def _palettes(data: np.ndarray, exact: np.ndarray) -> list:
    """(row, (distinct bit patterns, index of each slot's)) of the float64 rows with at most 256 distinct
    values: a summary's wall times, shared by every layer of a step (a block of 16 steps has 16)."""
    out = []
    for row in np.flatnonzero(~exact):
        distinct, index = np.unique(data[row].view("<u8"), return_inverse=True)
        if len(distinct) <= 256 and 8 * len(distinct) < 4 * data.shape[1]:
            out.append((int(row), (distinct, index)))
    return out


def decode_array(blob: bytes) -> np.ndarray:
    """``encode_array``'s input back, (rows, width) float64."""
    kind, flags, mask, rows, width, body = codec.open_blob(blob)
    if kind != codec.ARRAY:
        raise codec.Corrupt("not an array blob")
    block = _group([body], mask, *_layout(body, flags, mask, rows, width), rows, width, None)
    if block is None:
        raise codec.Corrupt("rollup blob does not match its header")
    return block[0]


def decode_arrays(blobs: list, rows: int, width: int, slot: int | None = None) -> np.ndarray | None:
    """Many ``encode_array`` blobs of one shape at once, (k, rows, width), or with ``slot`` only that
    column, (k, rows, 1); None if any is damaged or of another shape. Blobs that share a layout (row
    masks and sizes) are unshuffled in one numpy pass, and with ``slot`` only that column's bytes are
    gathered (a chart reads a few thousand blocks: per-blob numpy calls would cost more than decompressing)."""
    cols = width if slot is None else 1
    out = np.empty((len(blobs), rows, cols))
    opened = _bodies(blobs, rows, width)
    if opened is None:
        return None
    flags, masks, bodies = opened
    # Blobs alike (flags, masks, the body's row masks and size) share a layout: one key each, grouped in C.
    keys = [(m, f, bytes(b[: _MASK_BYTES[f]]), len(b)) if f else m for f, m, b in zip(flags, masks, bodies)]
    ids: dict = {}
    of = np.array([ids.setdefault(key, len(ids)) for key in keys])
    try:
        for key, g in ids.items():
            index = np.flatnonzero(of == g) if len(ids) > 1 else np.arange(len(bodies))
            for layout, at in _layouts(key, [bodies[i] for i in index], rows, width):
                block = _group([bodies[i] for i in index[at]], *layout, rows, width, slot)
                if block is None:
                    return None
                out[index[at]] = block
    except codec.Corrupt:
        return None
    return out


_MASK_BYTES = {
    codec.ABSENT: 2,
    codec.PALETTE: 2,
    codec.ABSENT | codec.PALETTE: 4,
}  # the row masks that open an array's body
_HEAD_DTYPE = np.dtype(
    [("kind", "u1"), ("flags", "u1"), ("mask", "<u2"), ("n", "<u4"), ("width", "<u4"), ("crc", "<u4")]
)


def _bodies(blobs: list, rows: int, width: int) -> tuple | None:
    """(flags, masks, decompressed bodies) of array blobs of this shape, checksums verified; None if any
    is damaged or of another shape. Comprehensions and numpy over all headers: a chart opens ~1,000 blobs,
    and a loop's Python around the C calls (checksum, zstd) cost more than the calls."""
    size, crc32 = codec.HEAD.size, zlib.crc32
    lengths = np.fromiter(map(len, blobs), np.int64, len(blobs))
    if ((lengths % 8 != 5) | (lengths < size)).any():
        return None
    head = np.frombuffer(b"".join([b[:size] for b in blobs]), _HEAD_DTYPE)
    if (head["kind"] != codec.ARRAY).any() or (head["n"] != rows).any() or (head["width"] != width).any():
        return None
    if (np.array([crc32(b[size:], crc32(b[:12])) for b in blobs], np.uint32) != head["crc"]).any():
        return None
    ends, how = (lengths - (head["flags"] >> 5)).tolist(), head["flags"] & 3
    try:
        if codec.zstandard is not None and (how == codec.ZSTD).all():
            inflate = codec.zstd_pair()[1].decompress
            bodies = [inflate(b[size:end]) for b, end in zip(blobs, ends)]
        else:
            bodies = [codec.decompress(memoryview(b)[size:end], h) for b, end, h in zip(blobs, ends, how.tolist())]
    except (codec.Corrupt, *codec.DECOMPRESS_ERRORS):
        return None
    return (head["flags"] & (codec.ABSENT | codec.PALETTE)).tolist(), head["mask"].tolist(), bodies


def _layouts(key, bodies: list, rows: int, width: int):
    """(layout, positions) of alike bodies: one layout for all, but palettes' sizes are each body's own."""
    if not isinstance(key, tuple):  # no row masks in the body: the float32 mask is the whole layout
        return [((key, 0, 0, 0, ()), slice(None))]
    mask, flags = key[0], key[1]
    first = _layout(bodies[0], flags, mask, rows, width)
    counts = first[3]
    # The masks and size the key holds fix the layout, but for the sizes of two palettes or more (the size
    # fixes the sum); a single palette's count byte is checked in each body.
    if not counts or len(counts) == 1 and all(b[-(1 + 8 * counts[0] + width)] == counts[0] - 1 for b in bodies):
        return [((mask, *first), slice(None))]
    seen: dict = {}
    each = [_remembered_layout(b, flags, mask, seen, rows, width) for b in bodies]
    return [(layout, [i for i, e in enumerate(each) if e == layout]) for layout in dict.fromkeys(each)]


def _remembered_layout(body: bytes, flags: int, mask: int, seen: dict, rows: int, width: int) -> tuple:
    """``(mask, *_layout(...))``, remembered in ``seen`` for blobs alike: the same masks and size, and at
    most one palette row, whose size the body's size then fixes (its count byte is checked; a chart's
    blobs are mostly alike, and ``_layout``'s Python was a third of a one-layer read)."""
    alike = (flags & (codec.ABSENT | codec.PALETTE), mask, bytes(body[:4]), len(body))
    hit = seen.get(alike)
    if hit is not None and (hit[1] is None or body[hit[1]] == hit[2]):
        return hit[0]
    key = (mask, *_layout(body, flags, mask, rows, width))
    counts = key[4]
    if len(counts) <= 1:
        at = len(body) - (1 + 8 * counts[0] + width) if counts else None
        seen[alike] = (key, at, counts[0] - 1 if counts else None)
    return key


def _layout(body: bytes, flags: int, mask: int, rows: int, width: int) -> tuple:
    """(where the shuffled rows start, absent rows' mask, palette rows' mask, each palette's size) of an
    array body (plain integers: a chart runs this for ~1,000 blobs); blobs alike decode together."""
    pos = amask = pmask = 0
    if len(body) < 2 * bool(flags & codec.ABSENT) + 2 * bool(flags & codec.PALETTE):
        raise codec.Corrupt("rollup blob too short for its row masks")
    if flags & codec.ABSENT:
        (amask,), pos = struct.unpack_from("<H", body, pos), pos + 2
    if flags & codec.PALETTE:
        (pmask,), pos = struct.unpack_from("<H", body, pos), pos + 2
    start, full = pos, (1 << rows) - 1
    if amask & mask or pmask & mask or amask & pmask or (amask | pmask) & ~full:
        raise codec.Corrupt("rollup blob's row masks do not match its header")
    pos += width * (4 * bin(mask & full).count("1") + 8 * bin(~(mask | pmask | amask) & full).count("1"))
    counts = []
    for _row in range(bin(pmask).count("1")):
        if pos >= len(body):
            raise codec.Corrupt("rollup blob's palettes are cut short")
        counts.append(body[pos] + 1)
        pos += 1 + 8 * counts[-1] + width
    if pos != len(body):
        raise codec.Corrupt("rollup blob's palettes do not match its header")
    return start, amask, pmask, tuple(counts)


def _group(bodies: list, mask: int, start: int, amask: int, pmask: int, counts: tuple, rows: int, width: int, slot):
    """(k, rows, cols) of array bodies with one layout, in a few numpy passes; None if they do not add up."""
    exact = (mask >> np.arange(rows)) & 1 == 1
    pal = (pmask >> np.arange(rows)) & 1 == 1
    absent = (amask >> np.arange(rows)) & 1 == 1
    plain = ~exact & ~pal & ~absent
    n32, n64 = int(exact.sum()), int(plain.sum())
    size = start + width * (4 * n32 + 8 * n64) + sum(1 + 8 * c + width for c in counts)
    if any(len(b) != size for b in bodies):
        return None
    k, cols = len(bodies), width if slot is None else 1
    raw = np.frombuffer(b"".join(bodies), np.uint8).reshape(k, size)
    block = np.empty((k, rows, cols))
    block[:, absent] = codec.ABSENT_VALUE
    block[:, exact] = _planes(raw, start, 4, n32, width, slot).view("<f4").reshape(k, n32, cols)
    start += 4 * n32 * width
    block[:, plain] = _planes(raw, start, 8, n64, width, slot).view("<f8").reshape(k, n64, cols)
    start += 8 * n64 * width
    for row, count in zip(np.flatnonzero(pal).tolist(), counts):
        distinct = codec.interleave(raw[:, start + 1 : start + 1 + 8 * count].reshape(k, 8, count), 1).view("<f8")[
            ..., 0
        ]
        at = start + 1 + 8 * count
        index = raw[:, at : at + width] if slot is None else raw[:, at + slot : at + slot + 1]
        if (index >= count).any():
            return None
        block[:, row] = np.take_along_axis(distinct, index.astype(np.intp), axis=1)
        start = at + width
    return block


def _planes(raw: np.ndarray, start: int, size: int, nrows: int, width: int, slot: int | None) -> np.ndarray:
    """(k, values, size) bytes of the shuffled section at ``start`` of each body, all columns or one."""
    count = nrows * width
    section = raw[:, start : start + size * count].reshape(len(raw), size, count)
    if slot is not None:
        section = section[:, :, slot::width]  # the column's value in every row, each byte plane
    return codec.interleave(section, 1)
