"""One zstd frame per byte plane (codec.py's PLANES): a block body's sections compressed each on its own.

Each section (a byte plane of a chunk's values, its steps, its missing mask) gets its own entropy tables:
a float32 norm's sign and exponent bytes are nearly constant, its low mantissa bytes nearly random, and one
frame for all of them codes both with the same statistics (docs/storage.md). Packed: per section, a varint
of its stored length * 2 + 1 when it is stored as it is (zstd could not shrink it), then its bytes.
"""

from __future__ import annotations


class Cut(ValueError):
    """A packed body whose sections do not add up (codec.py reports it as Corrupt)."""


def pack(body: bytes, cut, compress) -> bytes:
    """``body``'s sections (lengths ``cut``, the rest one more), each ``compress``ed or as it is if smaller."""
    out, at = [], 0
    for size in [*cut, len(body) - sum(cut)]:
        if size:
            plain = body[at : at + size]
            frame = compress(plain)
            raw = len(frame) >= size
            out += [_varint(2 * min(size, len(frame)) + raw), plain if raw else frame]
            at += size
    return b"".join(out)


def unpack(packed, decompress) -> bytes:
    """``pack`` undone: its sections, ``decompress``ed where they were compressed, joined."""
    packed = memoryview(packed).cast("B")  # indexing gives ints whatever the driver's buffer format (psycopg2: 'c')
    out, at = [], 0
    while at < len(packed):
        head, at = _read_varint(packed, at)
        size = head >> 1
        if at + size > len(packed):
            raise Cut("a byte plane is cut short")
        piece = packed[at : at + size]
        out.append(bytes(piece) if head & 1 else decompress(piece))
        at += size
    return b"".join(out)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 56:
            raise Cut("a byte plane's length is cut short")
        byte = data[at]
        value, at, shift = value | (byte & 0x7F) << shift, at + 1, shift + 7
        if byte < 0x80:
            return value, at
