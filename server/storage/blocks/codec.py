"""Compressed, checksummed blocks: a chunk's points or a rollup's summary as one small blob, bit-exact.

The scheme (measured in docs/storage.md, benchmarks/bench_storage.py), vectorised in numpy:

- steps and wall times: delta-of-delta of their int64 bit patterns (wrapping, so exact for any
  value), zigzag, so a steady step or clock is a run of zeros;
- values: float32 when every value of the block round-trips bit-exactly through float32 (what a
  float32 tensor produced), else float64; stored layer-major, each slot's bits either XORed with
  the previous step's (Gorilla's idea: noise and constants), as offsets from the slot's first value
  (per-layer noise around a level) or as a delta-of-delta (a smooth schedule, a counter), whichever
  compresses the block smaller; a one-slot block whose values are all short decimals (decimal.py:
  counters, typed constants, gradwatch's own timers at 1 us) is stored as those integers instead;
- every array byte-shuffled (all first bytes, then all second bytes...: Blosc's idea), then one
  zstd frame (zlib when ``zstandard`` is not installed; a blob says which it used); since 0009 a
  chunk may instead hold one zstd frame per byte plane (PLANES), where that is smaller;
- a 16-byte header (kind, flags, sizes, CRC-32 of header and body), so a flipped bit or a cut
  blob is detected (``Corrupt``) before anything is decoded from it.

A raw (0.2-format) blob is always a whole number of 8-byte values; an encoded blob's length is
padded to 5 modulo 8, so ``is_encoded`` tells them apart without a schema change.
"""

from __future__ import annotations

import struct
import threading
import zlib

import numpy as np

from gradwatch_server.storage.blocks import decimal, planes

try:  # optional: ~5x faster than zlib at the same size (docs/storage.md); zlib is the fallback
    import zstandard
except ImportError:  # pragma: no cover - depends on the environment
    zstandard = None

CHUNK, ARRAY = 0xC1, 0xA1  # kinds of blob
RAW, ZLIB, ZSTD = 0, 1, 2  # how the body is compressed (flag bits 0-1)
PLANES = 3  # since 0009: one zstd frame per byte plane of a vector's chunk (each plane its own statistics)
F32, MISSING, CLOCK = 4, 8, 16  # flag bits: values as float32, a missing mask follows, walls left to the run clock
PALETTE = 4  # an array's flag bit: some float64 rows are a palette of their distinct values and a byte index each
ABSENT = 8  # an array's flag bit: rows that are all ABSENT_VALUE (a summary's "no such step") are left out
ABSENT_VALUE = -1.0
# A chunk's value transform along time (the header's third field: bits 0-3 the transform, 4-8 and 9-13 the
# decimal exponent and factor of T_DEC_*). Each number's meaning is fixed once written: new ones are added.
T_NONE, T_XOR, T_DOD = 0, 1, 2  # as first released
T_FOR = 3  # each slot's bits minus its first value's (noise around a level: no previous-step noise added)
T_DEC_DOD, T_DEC_DELTA, T_DEC_FOR = 4, 5, 6  # decimals (decimal.py): their integers, as dod, delta or FOR
DEC_TRANSFORMS = (T_DEC_DOD, T_DEC_DELTA, T_DEC_FOR)
_HEAD = struct.Struct(
    "<BBHIII"
)  # kind, flags (bits 5-7: padding), transform (chunk) or f32 row mask (array), n, width, crc32
_LEVELS = {ZLIB: 6, ZSTD: 3}


class Corrupt(ValueError):
    """A blob that fails its checksum or does not decode to the size its header says."""


def default_compressor() -> int:
    return ZSTD if zstandard is not None else ZLIB


def is_encoded(blob: bytes) -> bool:
    return len(blob) % 8 == 5


def encode_chunk(steps, walls, values, missing=None, compressor: int | None = None) -> bytes:
    """One chunk's points: steps (n,) int64, walls (n,) float64 or None, values (n, width) float64, missing (n, width) bool.

    ``walls`` None: the chunk's wall times are the run clock's at its steps (storage/blocks/clock.py)
    and are not stored (the CLOCK flag); the reader fills them from the clock.

    The values go through the transform that compresses them best, tried on the block: XOR with the
    previous step (noise, constants), each slot's offset from its first value (noise around a level),
    delta-of-delta of the bits (smooth float64 schedules, counters), or, for float64 values that are all
    decimals (``blocks/decimal.py``: 0.1034, a rounded timer), their integers as dod, delta or offsets.
    """
    n, width = values.shape
    layer_major = np.ascontiguousarray(np.asarray(values, dtype="<f8").T)
    flags, bits = _value_bits(layer_major)
    head = _shuffle(_zigzag(_dod(np.asarray(steps, dtype="<i8"))))
    if walls is None:
        flags |= CLOCK
    else:
        head += _shuffle(_zigzag(_dod(np.ascontiguousarray(walls, dtype="<f8").view("<i8"))))
    tail = b""
    if missing is not None and missing.any():
        flags |= MISSING
        tail = np.packbits(np.ascontiguousarray(missing.T)).tobytes()
    # Per-layer float32 norms are noise (docs/storage.md): XOR or offsets, never delta-of-delta.
    tries = [(T_XOR, bits), (T_FOR, bits)] if width > 1 and flags & F32 else [(T_XOR, bits), (T_DOD, bits)]
    tries = [(flags, field, data) for field, data in tries]
    found = decimal.find(layer_major) if width == 1 else None  # counters, rounded timers, typed decimals
    if found is not None:
        exponent, factor, ints = found
        mark = (exponent << 4) | (factor << 9)
        # Their integers beat the float bits (measured on counters, schedules, rounded timers): only those tried.
        tries = [(flags & ~F32, t | mark, ints) for t in DEC_TRANSFORMS]  # integers: 8-byte planes
    blobs = []
    for how, field, data in tries:
        coded = _forward(data, field & 15)
        # Where each byte plane ends (a vector's: a scalar block decoded 11 % slower as 10 frames, measured).
        cut = [len(head)] + [coded.size] * coded.dtype.itemsize + [len(tail)] if width > 1 else ()
        blobs.append(_seal(CHUNK, how, field, n, width, head + _shuffle(coded.ravel()) + tail, compressor, cut))
    return min(blobs, key=len)


def _forward(bits: np.ndarray, transform: int) -> np.ndarray:
    """(width, n) unsigned bit patterns, each row transformed along time (wrapping integer arithmetic)."""
    first = np.zeros((bits.shape[0], 1), bits.dtype)
    with np.errstate(over="ignore"):
        if transform == T_NONE:
            return bits
        if transform == T_XOR:
            return bits ^ np.concatenate([first, bits[:, :-1]], axis=1)
        if transform == T_DOD:
            return np.diff(np.diff(bits, axis=1, prepend=first), axis=1, prepend=first)
        if transform == T_DEC_DOD:
            return _zigzag_any(np.diff(np.diff(bits, axis=1, prepend=first), axis=1, prepend=first))
        if transform == T_DEC_DELTA:
            return _zigzag_any(np.diff(bits, axis=1, prepend=first))
        out = bits - bits[:, :1]  # T_FOR, T_DEC_FOR: offsets from the slot's first value, which stays itself
        out[:, :1] = bits[:, :1]
        return _zigzag_any(out)


def _inverse(bits: np.ndarray, transform: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        if transform == T_XOR:
            return np.bitwise_xor.accumulate(bits, axis=1)
        if transform == T_DOD:
            return np.cumsum(np.cumsum(bits, axis=1, dtype=bits.dtype), axis=1, dtype=bits.dtype)
        if transform == T_DEC_DOD:
            return np.cumsum(np.cumsum(_unzigzag_any(bits), axis=1, dtype=bits.dtype), axis=1, dtype=bits.dtype)
        if transform == T_DEC_DELTA:
            return np.cumsum(_unzigzag_any(bits), axis=1, dtype=bits.dtype)
        if transform in (T_FOR, T_DEC_FOR):
            out = _unzigzag_any(bits)
            out[:, 1:] += out[:, :1]
            return out
    if transform == T_NONE:
        return bits
    raise Corrupt(f"unknown value transform {transform}")


def decode_chunk(blob: bytes) -> tuple:
    """``encode_chunk``'s inputs back: steps, walls (None: the run clock's), values (n, width; a transposed
    view), missing or None."""
    kind, flags, transform, n, width, body = _open(blob)
    if kind != CHUNK:
        raise Corrupt("not a chunk blob")
    size = 4 if flags & F32 else 8
    start = 8 * n if flags & CLOCK else 16 * n
    expect = start + size * n * width + (-(-n * width // 8) if flags & MISSING else 0)
    if len(body) != expect:
        raise Corrupt(f"chunk body is {len(body)} bytes, its header says {expect}")
    steps = _undod(_unzigzag(_unshuffle(body[: 8 * n], 8)))
    walls = None if flags & CLOCK else _undod(_unzigzag(_unshuffle(body[8 * n : 16 * n], 8))).view("<f8")
    end = start + size * n * width
    bits = _inverse(_unshuffle(body[start:end], size).reshape(width, n), transform & 15)
    if transform & 15 in DEC_TRANSFORMS:
        values = decimal.restore(bits.view("<i8"), (transform >> 4) & 31, transform >> 9)
    else:
        values = bits.view("<f4").astype(np.float64) if size == 4 else bits.view("<f8")
    missing = None
    if flags & MISSING:
        missing = np.unpackbits(np.frombuffer(body[end:], np.uint8), count=n * width).reshape(width, n).T != 0
    return steps, walls, values.T, missing


def encode_array(data: np.ndarray, compressor: int | None = None) -> bytes:
    """A (rows <= 16, width) float64 array (a rollup summary), each row float32 where that is exact."""
    data = np.asarray(data, dtype="<f8")
    rows, width = data.shape
    if rows > 16:
        raise ValueError(f"a summary array has at most 16 rows, not {rows}")
    with np.errstate(all="ignore"):  # values past float32's range simply stay float64
        exact = (data.astype("<f4").astype("<f8").view("<i8") == data.view("<i8")).all(axis=1)
    absent = (data.view("<i8") == np.float64(ABSENT_VALUE).view("<i8")).all(axis=1)
    exact &= ~absent
    mask = int(np.dot(exact, 1 << np.arange(rows)))
    palettes = _palettes(data, exact | absent) if width >= PALETTE_WIDTH else []
    plain = ~exact & ~absent
    plain[[r for r, _ in palettes]] = False
    flags, parts = 0, []
    if absent.any():  # a scalar's NaN/inf step rows and their walls: 24 of a block's ~77 bytes
        flags |= ABSENT
        parts.append(struct.pack("<H", int(np.dot(absent, 1 << np.arange(rows)))))
    if palettes:
        flags |= PALETTE
        parts.append(struct.pack("<H", sum(1 << r for r, _ in palettes)))
    parts += [_shuffle(data[exact].astype("<f4").ravel()), _shuffle(data[plain].ravel())]
    for _row, (distinct, index) in palettes:
        parts += [bytes([len(distinct) - 1]), _shuffle(distinct), index.astype(np.uint8).tobytes()]
    return _seal(ARRAY, flags, mask, rows, width, b"".join(parts), compressor)


def encode_arrays(arrays: list, compressor: int | None = None) -> list[bytes]:
    """``encode_array`` of each array, the same blobs: arrays narrower than PALETTE_WIDTH (a scalar's summary)
    are stacked by shape and row layout, their float32 and absent rows told and byte-shuffled in one numpy pass
    each (a bulk batch writes thousands of summaries: per array, those numpy calls cost more than zstd)."""
    out: list = [None] * len(arrays)
    shapes: dict = {}  # (rows, width) -> indices of the arrays of that shape
    for i, data in enumerate(arrays):
        rows, width = np.shape(data)
        if rows <= 16 and width < PALETTE_WIDTH:
            shapes.setdefault((rows, width), []).append(i)
        else:
            out[i] = encode_array(data, compressor)
    for (rows, width), index in shapes.items():
        stack = np.stack([np.asarray(arrays[i], dtype="<f8") for i in index])
        bits = stack.view("<i8")
        with np.errstate(all="ignore"):
            exact = (stack.astype("<f4").astype("<f8").view("<i8") == bits).all(axis=2)
        absent = (bits == np.float64(ABSENT_VALUE).view("<i8")).all(axis=2)
        weights = 1 << np.arange(rows)
        layouts: dict = {}  # (f32 row mask, absent row mask) -> positions in the stack
        for j, key in enumerate(zip((exact & ~absent) @ weights, absent @ weights)):
            layouts.setdefault((int(key[0]), int(key[1])), []).append(j)
        for (mask, gone), members in layouts.items():
            f32 = [r for r in range(rows) if mask >> r & 1]
            f64 = [r for r in range(rows) if not (mask | gone) >> r & 1]
            head, flags = (struct.pack("<H", gone), ABSENT) if gone else (b"", 0)
            group = stack[members]
            for j, a, b in zip(members, _shuffled(group[:, f32].astype("<f4")), _shuffled(group[:, f64])):
                out[index[j]] = _seal(ARRAY, flags, mask, rows, width, head + a + b, compressor)
    return out


def _shuffled(stack: np.ndarray) -> list[bytes]:
    """``_shuffle`` of each array of a (k, ...) stack (each one's values row-major)."""
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
    kind, flags, mask, rows, width, body = _open(blob)
    if kind != ARRAY:
        raise Corrupt("not an array blob")
    block = _group([body], mask, *_layout(body, flags, mask, rows, width), rows, width, None)
    if block is None:
        raise Corrupt("rollup blob does not match its header")
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
    except Corrupt:
        return None
    return out


_MASK_BYTES = {ABSENT: 2, PALETTE: 2, ABSENT | PALETTE: 4}  # the row masks that open an array's body
_HEAD_DTYPE = np.dtype(
    [("kind", "u1"), ("flags", "u1"), ("mask", "<u2"), ("n", "<u4"), ("width", "<u4"), ("crc", "<u4")]
)


def _bodies(blobs: list, rows: int, width: int) -> tuple | None:
    """(flags, masks, decompressed bodies) of array blobs of this shape, checksums verified; None if any
    is damaged or of another shape. Comprehensions and numpy over all headers: a chart opens ~1,000 blobs,
    and a loop's Python around the C calls (checksum, zstd) cost more than the calls."""
    size, crc32 = _HEAD.size, zlib.crc32
    lengths = np.fromiter(map(len, blobs), np.int64, len(blobs))
    if ((lengths % 8 != 5) | (lengths < size)).any():
        return None
    head = np.frombuffer(b"".join([b[:size] for b in blobs]), _HEAD_DTYPE)
    if (head["kind"] != ARRAY).any() or (head["n"] != rows).any() or (head["width"] != width).any():
        return None
    if (np.array([crc32(b[size:], crc32(b[:12])) for b in blobs], np.uint32) != head["crc"]).any():
        return None
    ends, how = (lengths - (head["flags"] >> 5)).tolist(), head["flags"] & 3
    try:
        if zstandard is not None and (how == ZSTD).all():
            inflate = _zstd()[1].decompress
            bodies = [inflate(b[size:end]) for b, end in zip(blobs, ends)]
        else:
            bodies = [_decompress(memoryview(b)[size:end], h) for b, end, h in zip(blobs, ends, how.tolist())]
    except (Corrupt, *_DECOMPRESS_ERRORS):
        return None
    return (head["flags"] & (ABSENT | PALETTE)).tolist(), head["mask"].tolist(), bodies


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
    alike = (flags & (ABSENT | PALETTE), mask, bytes(body[:4]), len(body))
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
    if len(body) < 2 * bool(flags & ABSENT) + 2 * bool(flags & PALETTE):
        raise Corrupt("rollup blob too short for its row masks")
    if flags & ABSENT:
        (amask,), pos = struct.unpack_from("<H", body, pos), pos + 2
    if flags & PALETTE:
        (pmask,), pos = struct.unpack_from("<H", body, pos), pos + 2
    start, full = pos, (1 << rows) - 1
    if amask & mask or pmask & mask or amask & pmask or (amask | pmask) & ~full:
        raise Corrupt("rollup blob's row masks do not match its header")
    pos += width * (4 * bin(mask & full).count("1") + 8 * bin(~(mask | pmask | amask) & full).count("1"))
    counts = []
    for _row in range(bin(pmask).count("1")):
        if pos >= len(body):
            raise Corrupt("rollup blob's palettes are cut short")
        counts.append(body[pos] + 1)
        pos += 1 + 8 * counts[-1] + width
    if pos != len(body):
        raise Corrupt("rollup blob's palettes do not match its header")
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
    block[:, absent] = ABSENT_VALUE
    block[:, exact] = _planes(raw, start, 4, n32, width, slot).view("<f4").reshape(k, n32, cols)
    start += 4 * n32 * width
    block[:, plain] = _planes(raw, start, 8, n64, width, slot).view("<f8").reshape(k, n64, cols)
    start += 8 * n64 * width
    for row, count in zip(np.flatnonzero(pal).tolist(), counts):
        distinct = _interleave(raw[:, start + 1 : start + 1 + 8 * count].reshape(k, 8, count), 1).view("<f8")[..., 0]
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
    return _interleave(section, 1)


def _interleave(planes: np.ndarray, axis: int) -> np.ndarray:
    """Byte planes along ``axis`` back into values (a last axis of bytes): one strided copy per plane,
    ~3x faster than a transposing copy of a byte array (what numpy does one byte at a time)."""
    size = planes.shape[axis]
    moved = np.moveaxis(planes, axis, 0)
    out = np.empty((*moved.shape[1:], size), np.uint8)
    for j in range(size):
        out[..., j] = moved[j]
    return out


def has_header(blob: bytes, kind: int, rows: int, width: int) -> bool:
    """Whether an encoded-length blob's header names this kind and shape (not checking its checksum)."""
    head = _HEAD.unpack_from(blob) if len(blob) >= _HEAD.size else None
    return head is not None and head[0] == kind and head[3] == rows and head[4] == width


def leaves_walls(blob: bytes) -> bool:
    """Whether an encoded chunk blob left its wall times to the run clock (its header's CLOCK flag)."""
    return bool(_HEAD.unpack_from(blob)[1] & CLOCK)


def rows_of(blob: bytes) -> int:
    """The rows an encoded array blob's header names (a lean summary has fewer), without decoding it."""
    return _HEAD.unpack_from(blob)[3]


def width_of(blob: bytes) -> int:
    """The width (slots) an encoded blob's header names, without decoding it."""
    return _HEAD.unpack_from(blob)[4]


def _value_bits(layer_major: np.ndarray) -> tuple[int, np.ndarray]:
    """(flags, unsigned bit patterns): float32 when the whole block round-trips through it bit-exactly."""
    with np.errstate(all="ignore"):  # values past float32's range: the block stays float64
        as32 = layer_major.astype("<f4")
    if (as32.astype("<f8").view("<i8") == layer_major.view("<i8")).all():
        return F32, as32.view("<u4")
    return 0, layer_major.view("<u8")


def _seal(kind: int, flags: int, mask: int, n: int, width: int, body: bytes, compressor: int | None, cut=()) -> bytes:
    """The blob: header, CRC, the body compressed (``cut``: the lengths of its byte planes, for PLANES)."""
    how = default_compressor() if compressor is None else compressor
    packed = _compress(body, how) if how != PLANES else planes.pack(body, cut, _zstd()[0].compress)
    if compressor is None and how == ZSTD and cut:  # one frame per plane where that is smaller
        split = planes.pack(body, cut, _zstd()[0].compress)
        how, packed = (PLANES, split) if len(split) < len(packed) else (how, packed)
    if len(packed) >= len(body):  # incompressible (a tiny block): stored as it is
        how, packed = RAW, body
    pad = (5 - (_HEAD.size + len(packed))) % 8
    flags |= how | (pad << 5)
    head = _HEAD.pack(kind, flags, mask, n, width, 0)
    crc = zlib.crc32(bytes(pad), zlib.crc32(packed, zlib.crc32(head[:12])))
    return head[:12] + struct.pack("<I", crc) + packed + bytes(pad)


def _open(blob: bytes) -> tuple:
    """Header fields and the decompressed body of a blob, its checksum verified."""
    if len(blob) < _HEAD.size or not is_encoded(blob):
        raise Corrupt(f"blob of {len(blob)} bytes is cut short")
    kind, flags, mask, n, width, crc = _HEAD.unpack_from(blob)
    view = memoryview(blob)  # slices without copies
    if zlib.crc32(view[_HEAD.size :], zlib.crc32(view[:12])) != crc:  # everything but the checksum itself
        raise Corrupt("checksum mismatch")
    packed = view[_HEAD.size : len(blob) - (flags >> 5)]
    return kind, flags & 31, mask, n, width, _decompress(packed, flags & 3)


def _zstd():
    """This thread's zstd compressor and decompressor (their objects must not be shared by threads)."""
    pair = getattr(_local, "zstd", None)
    if pair is None:
        pair = _local.zstd = (zstandard.ZstdCompressor(level=_LEVELS[ZSTD]), zstandard.ZstdDecompressor())
    return pair


def _compress(body: bytes, how: int) -> bytes:
    if how == ZSTD:
        return _zstd()[0].compress(body)
    return zlib.compress(body, _LEVELS[ZLIB]) if how == ZLIB else body


def _decompress(packed: bytes, how: int) -> bytes:
    try:
        if how == PLANES:
            return planes.unpack(packed, lambda piece: _inflate(piece, ZSTD))
        return _inflate(packed, how)
    except planes.Cut as exc:
        raise Corrupt(str(exc)) from exc
    except _DECOMPRESS_ERRORS as exc:  # a body that passed its checksum yet does not decompress
        raise Corrupt(f"does not decompress: {exc}") from exc


def _inflate(packed: bytes, how: int) -> bytes:
    if how == RAW:
        return bytes(packed)
    if how == ZLIB:
        return zlib.decompress(packed)
    if zstandard is None:
        raise Corrupt("block compressed with zstd: install the zstandard package to read it")
    return _zstd()[1].decompress(packed)


_local = threading.local()
_DECOMPRESS_ERRORS = (zlib.error,) + ((zstandard.ZstdError,) if zstandard is not None else ())


def _dod(x: np.ndarray) -> np.ndarray:
    """Delta of delta, wrapping (int64 overflow wraps, so ``_undod`` is exact for any input)."""
    with np.errstate(over="ignore"):
        return np.diff(np.diff(x, prepend=np.int64(0)), prepend=np.int64(0))


def _undod(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.cumsum(np.cumsum(x, dtype=np.int64), dtype=np.int64)


def _zigzag(x: np.ndarray) -> np.ndarray:
    """Small negative numbers to small positive ones, so their high bytes are zero."""
    return ((x << 1) ^ (x >> 63)).view("<u8")


def _unzigzag(u: np.ndarray) -> np.ndarray:
    return ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view("<i8")


def _zigzag_any(u: np.ndarray) -> np.ndarray:
    """``_zigzag`` of unsigned bit patterns of any width, read as signed (small offsets either way: small)."""
    s = u.view(f"<i{u.dtype.itemsize}")
    return ((s << 1) ^ (s >> (8 * u.dtype.itemsize - 1))).view(u.dtype)


def _unzigzag_any(u: np.ndarray) -> np.ndarray:
    one = u.dtype.type(1)
    return (u >> one) ^ (u.dtype.type(0) - (u & one))


def _shuffle(a: np.ndarray) -> bytes:
    """Byte planes: every value's first byte, then every second byte, ..."""
    return np.ascontiguousarray(a.view(np.uint8).reshape(-1, a.dtype.itemsize).T).tobytes()


def _unshuffle(body: bytes, size: int) -> np.ndarray:
    planes = np.frombuffer(body, dtype=np.uint8).reshape(size, -1)
    return _interleave(planes, 0).view(f"<u{size}").ravel()
