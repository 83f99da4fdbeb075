"""Compressed, checksummed blocks: a chunk's points or a rollup's summary (its array part: arrays.py) as one
small blob, bit-exact.

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
HEAD = struct.Struct(
    "<BBHIII"
)  # kind, flags (bits 5-7: padding), transform (chunk) or f32 row mask (array), n, width, crc32
_LEVELS = {ZLIB: 6, ZSTD: 3}
SMALL_BODY = 8192  # bytes: below this a wide chunk tries one frame beside its planes, whatever they shrink to


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
    head = shuffle(_zigzag(_dod(np.asarray(steps, dtype="<i8"))))
    if walls is None:
        flags |= CLOCK
    else:
        head += shuffle(_zigzag(_dod(np.ascontiguousarray(walls, dtype="<f8").view("<i8"))))
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
        blobs.append(seal(CHUNK, how, field, n, width, head + shuffle(coded.ravel()) + tail, compressor, cut))
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
    kind, flags, transform, n, width, body = open_blob(blob)
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


def interleave(planes: np.ndarray, axis: int) -> np.ndarray:
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
    head = HEAD.unpack_from(blob) if len(blob) >= HEAD.size else None
    return head is not None and head[0] == kind and head[3] == rows and head[4] == width


def leaves_walls(blob: bytes) -> bool:
    """Whether an encoded chunk blob left its wall times to the run clock (its header's CLOCK flag)."""
    return bool(HEAD.unpack_from(blob)[1] & CLOCK)


def rows_of(blob: bytes) -> int:
    """The rows an encoded array blob's header names (a lean summary has fewer), without decoding it."""
    return HEAD.unpack_from(blob)[3]


def width_of(blob: bytes) -> int:
    """The width (slots) an encoded blob's header names, without decoding it."""
    return HEAD.unpack_from(blob)[4]


def _value_bits(layer_major: np.ndarray) -> tuple[int, np.ndarray]:
    """(flags, unsigned bit patterns): float32 when the whole block round-trips through it bit-exactly."""
    with np.errstate(all="ignore"):  # values past float32's range: the block stays float64
        as32 = layer_major.astype("<f4")
    if (as32.astype("<f8").view("<i8") == layer_major.view("<i8")).all():
        return F32, as32.view("<u4")
    return 0, layer_major.view("<u8")


def seal(kind: int, flags: int, mask: int, n: int, width: int, body: bytes, compressor: int | None, cut=()) -> bytes:
    """The blob: header, CRC, the body compressed (``cut``: the lengths of its byte planes, for PLANES)."""
    how = default_compressor() if compressor is None else compressor
    if compressor is None and how == ZSTD and cut:  # a frame per byte plane, or one frame where that is no bigger
        how, packed = PLANES, planes.pack(body, cut, zstd_pair()[0].compress)
        # Only planes that shrink to under half can hold the repeated values one frame may find across them:
        # noisy norms (the low planes incompressible) always kept planes, so they are compressed once, not twice.
        # A small body tries both (a frame's own overhead decides there; trying is cheap).
        if 2 * len(packed) < len(body) or len(body) < SMALL_BODY:
            whole = _compress(body, ZSTD)
            how, packed = (ZSTD, whole) if len(whole) <= len(packed) else (how, packed)
    else:
        packed = _compress(body, how) if how != PLANES else planes.pack(body, cut, zstd_pair()[0].compress)
    if len(packed) >= len(body):  # incompressible (a tiny block): stored as it is
        how, packed = RAW, body
    pad = (5 - (HEAD.size + len(packed))) % 8
    flags |= how | (pad << 5)
    head = HEAD.pack(kind, flags, mask, n, width, 0)
    crc = zlib.crc32(bytes(pad), zlib.crc32(packed, zlib.crc32(head[:12])))
    return head[:12] + struct.pack("<I", crc) + packed + bytes(pad)


def open_blob(blob: bytes) -> tuple:
    """Header fields and the decompressed body of a blob, its checksum verified."""
    if len(blob) < HEAD.size or not is_encoded(blob):
        raise Corrupt(f"blob of {len(blob)} bytes is cut short")
    kind, flags, mask, n, width, crc = HEAD.unpack_from(blob)
    view = memoryview(blob)  # slices without copies
    if zlib.crc32(view[HEAD.size :], zlib.crc32(view[:12])) != crc:  # everything but the checksum itself
        raise Corrupt("checksum mismatch")
    packed = view[HEAD.size : len(blob) - (flags >> 5)]
    return kind, flags & 31, mask, n, width, decompress(packed, flags & 3)


def zstd_pair():
    """This thread's zstd compressor and decompressor (their objects must not be shared by threads)."""
    pair = getattr(_local, "zstd", None)
    if pair is None:
        pair = _local.zstd = (zstandard.ZstdCompressor(level=_LEVELS[ZSTD]), zstandard.ZstdDecompressor())
    return pair


def _compress(body: bytes, how: int) -> bytes:
    if how == ZSTD:
        return zstd_pair()[0].compress(body)
    return zlib.compress(body, _LEVELS[ZLIB]) if how == ZLIB else body


def decompress(packed: bytes, how: int) -> bytes:
    try:
        if how == PLANES:
            return planes.unpack(packed, lambda piece: _inflate(piece, ZSTD))
        return _inflate(packed, how)
    except planes.Cut as exc:
        raise Corrupt(str(exc)) from exc
    except DECOMPRESS_ERRORS as exc:  # a body that passed its checksum yet does not decompress
        raise Corrupt(f"does not decompress: {exc}") from exc


def _inflate(packed: bytes, how: int) -> bytes:
    if how == RAW:
        return bytes(packed)
    if how == ZLIB:
        return zlib.decompress(packed)
    if zstandard is None:
        raise Corrupt("block compressed with zstd: install the zstandard package to read it")
    return zstd_pair()[1].decompress(packed)


_local = threading.local()
DECOMPRESS_ERRORS = (zlib.error,) + ((zstandard.ZstdError,) if zstandard is not None else ())


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


def shuffle(a: np.ndarray) -> bytes:
    """Byte planes: every value's first byte, then every second byte, ..."""
    return np.ascontiguousarray(a.view(np.uint8).reshape(-1, a.dtype.itemsize).T).tobytes()


def _unshuffle(body: bytes, size: int) -> np.ndarray:
    planes = np.frombuffer(body, dtype=np.uint8).reshape(size, -1)
    return interleave(planes, 0).view(f"<u{size}").ravel()
