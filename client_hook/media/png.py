"""A PNG writer with only ``zlib``: 8-bit grayscale, RGB or RGBA rows, for when Pillow is not installed."""

from __future__ import annotations

import struct
import zlib

COLOR_TYPES = {1: 0, 3: 2, 4: 6}  # channels -> PNG colour type (gray, RGB, RGBA)


def encode(pixels: bytes, width: int, height: int, channels: int, level: int = 6) -> bytes:
    """PNG bytes of ``height`` rows of ``width * channels`` uint8 values (row-major, no padding)."""
    if channels not in COLOR_TYPES:
        raise ValueError(f"a PNG needs 1, 3 or 4 channels, got {channels}")
    stride = width * channels
    if len(pixels) != stride * height:
        raise ValueError("pixel buffer does not match width x height x channels")
    raw = bytearray()
    for row in range(height):  # filter type 0 (none) before each row
        raw += b"\x00"
        raw += pixels[row * stride : (row + 1) * stride]
    header = struct.pack(">IIBBBBB", width, height, 8, COLOR_TYPES[channels], 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(bytes(raw), level))
        + _chunk(b"IEND", b"")
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def size_of(data: bytes) -> tuple[int, int] | None:
    """(width, height) of PNG bytes, or None when they are not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", data[16:24])
