"""What travels between the hook, the server and the pages: run statuses, size limits, the float and counts codecs.

Non-finite floats travel as "NaN", "Infinity", "-Infinity" (strict JSON has no NaN). Standard library
only: the client imports it.
"""

from __future__ import annotations

import array
import base64
import binascii
import math
import sys
from typing import Any

# -- run statuses -------------------------------------------------------------------------------
STATUSES = ("running", "stalled", "finished", "failed", "crashed")
ACTIVE_STATUSES = ("running", "stalled")  # a training job may still be writing to the run
ENDED_STATUSES = frozenset({"finished", "failed", "crashed"})
CLIENT_STATUSES = ("running", "finished", "failed")  # what a client's status event may say
CLIENT_ENDINGS = ("finished", "failed")  # a client ends its own run with one of these

# -- limits -------------------------------------------------------------------------------------
MAX_KEY_LEN = 256  # characters in a metric key, a layer (slot) name or an alert key
# characters in a run or project name: a hello cuts a longer one (never refuse a training job over a
# name), an edit by a person is refused with the reason
MAX_NAME_LEN = 200
MAX_STEP = (1 << 63) - 1  # steps are stored as signed 64-bit integers
OUTBOX_MEMORY_BYTES = 32 << 20  # default memory for unacked batches before the client spools to disk
MAX_KEYS_PER_RUN = 10000  # default: most distinct metric keys one run may create
MAX_LAYERS = 100000  # default: most slots (layers) in one per-layer vector key
# What one client may make the server hold or do (docs/security.md lists each and what happens past it).
MAX_DOC_BYTES = 1 << 20  # a run's config or meta, as JSON: a bigger hello is refused
MAX_DOC_DEPTH = 32  # nesting of a run's config or meta (a deeper hello is refused)
MAX_TAGS = 100  # tags on one run (a hello or an edit with more is refused)
MAX_TAG_LEN = 64  # characters in one tag
MAX_ALERT_EVENTS_PER_BATCH = 100  # client alert events one batch may raise; the rest are refused
LINK_MIN_GAP = 0.04  # seconds: an idle client link sends a batch at most this often (25 frames a second)
LINK_MAX_GAP = 1.0  # seconds: the longest gap a server's ack may ask a link to leave between batches
MAX_ALERTS_PER_RUN = 1000  # distinct alerts one run may hold; new ones past it are refused (recurrences count on)

# -- the float codec ----------------------------------------------------------------------------
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class ProtocolError(ValueError):
    """A message that does not follow the protocol."""


def encode_float(value: float | None) -> float | str | None:
    """Turn a float into a JSON-safe value, non-finite floats into strings."""
    if value is None:
        return None
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def decode_float(value: Any) -> float | None:
    """Inverse of ``encode_float``; raises ProtocolError on anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ProtocolError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in NONFINITE:
        return NONFINITE[value]
    raise ProtocolError(f"expected a number or 'NaN'/'Infinity'/'-Infinity', got {value!r}")


def encode_floats(values) -> list:
    """``encode_float`` over a list (None, "no value", stays None)."""
    return [encode_float(v) for v in values]


def decode_floats(values) -> list:
    """``decode_float`` over a list (None stays None)."""
    return [decode_float(v) for v in values]


# -- histogram counts (wire feature "histogram_packed", gradwatch.protocol.HISTOGRAM_PACKED) ---------
# Counts travel as a JSON list of integers (always valid) or, to a server that announced the feature, as
# {"u16" | "u32": base64 of little-endian unsigned integers, "scale": k}: 2-4 bytes a count instead of a
# number's text, decoded with one call instead of one check per count; a sampled histogram's counts
# travel as the sample's (small) counts and the factor ``scale`` (default 1) that brings them to the tensor's size.
COUNT_WIDTHS = {"u16": ("H", 2, 1 << 16), "u32": ("I", 4, 1 << 32)}


def encode_counts(counts: list, scale: int = 1) -> list | dict:
    """Non-negative integer counts (times ``scale``) in the narrowest packed form; a plain list past 2**32."""
    top = max(counts) if counts else 0
    for name, (code, size, limit) in COUNT_WIDTHS.items():
        if top < limit and array.array(code).itemsize == size:
            data = array.array(code, counts)
            if sys.byteorder != "little":
                data.byteswap()
            out: dict = {name: base64.b64encode(data.tobytes()).decode("ascii")}
            if scale != 1:
                out["scale"] = scale
            return out
    return [c * scale for c in counts]


def encode_count_array(counts) -> list | dict:
    """``encode_counts`` of a numpy array of non-negative integers, packed by numpy (no list of ints on the way)."""
    top = int(counts.max()) if counts.size else 0
    for name, (_code, size, limit) in COUNT_WIDTHS.items():
        if top < limit:
            return {name: base64.b64encode(counts.astype(f"<u{size}").tobytes()).decode("ascii")}
    return counts.reshape(-1).tolist()


def decode_counts(value: Any) -> list:
    """Counts in either form as a list of non-negative ints (scaled); ProtocolError otherwise."""
    if isinstance(value, list):
        if not all(type(c) is int and c >= 0 for c in value):
            raise ProtocolError("histogram counts must be non-negative integers")
        return value
    names = [n for n in COUNT_WIDTHS if isinstance(value, dict) and n in value]
    scale = value.get("scale", 1) if isinstance(value, dict) else None
    if len(names) != 1 or not isinstance(value[names[0]], str) or set(value) - {names[0], "scale"}:
        raise ProtocolError('histogram counts must be a list of integers or {"u16" | "u32": base64, "scale": k}')
    if type(scale) is not int or scale < 1:
        raise ProtocolError("histogram counts scale must be a positive integer")
    code, size, _limit = COUNT_WIDTHS[names[0]]
    try:
        raw = base64.b64decode(value[names[0]], validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"histogram counts {names[0]} is not valid base64") from None
    if len(raw) % size or array.array(code).itemsize != size:
        raise ProtocolError(f"histogram counts {names[0]} must hold whole {size}-byte integers")
    data = array.array(code)
    data.frombytes(raw)
    if sys.byteorder != "little":
        data.byteswap()
    return data.tolist() if scale == 1 else [c * scale for c in data]


# The JavaScript twins of decode_float and encode_float. The pages trust the server, so decodeFloat
# passes anything it does not know through unchanged instead of raising.
_JS_FLOATS = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}  # NONFINITE's values as JS
JS = """
export const decodeFloat = (v) => (NONFINITE.has(v) ? NONFINITE.get(v) : v);
export function encodeFloat(v) {
  if (typeof v !== "number" || isFinite(v)) return v;
  for (const [text, x] of NONFINITE) if (Object.is(x, v)) return text;
}
"""


def js_nonfinite() -> str:
    """The NONFINITE map as a JavaScript statement."""
    import json

    pairs = ", ".join(f"[{json.dumps(text)}, {_JS_FLOATS[text]}]" for text in NONFINITE)
    return f"const NONFINITE = new Map([{pairs}]);"
