"""The gradwatch wire protocol, shared by the training-side hook and the server.

One websocket per run, JSON text frames. Non-finite floats travel as the strings
"NaN", "Infinity" and "-Infinity" (strict JSON has no NaN), so every frame is valid
JSON and NaN/inf arrive exactly. A vector slot that is JSON ``null`` means "no value"
(a parameter whose ``.grad`` was None), which is different from NaN.

Conversation (client -> server unless marked):

1. ``hello``   {"type": "hello", "protocol": 1, "run": {uid, project, name, config, meta, alerts},
   "resume_from": n, "layouts": {...}} (both optional: the oldest batch the client still holds
   - when the server has committed less than n - 1, those batches are gone for good and it
   carries on from n, with a ``data_gap`` alert - and every vector layout sent so far, which the
   server takes for vector keys it does not know)
2. ``welcome`` (server) {"type": "welcome", "protocol": 1, "run_id": int, "acked_seq": int,
   "features": [...]} - optional capabilities; "vector_f64" lets vectors travel as
   {"f64": base64 little-endian float64, "missing": [slot, ...]} instead of JSON lists
   ``acked_seq`` is the last batch the server has committed for this run uid; the client
   forgets batches up to it and resends the rest, in order.
3. ``batch``   {"type": "batch", "seq": n, "records": [...], "layouts": {...}, "events": [...]}
   ``seq`` starts at 1 and increases by one. Each record is
   {"step": int, "t": unix seconds, "scalars": {key: value}, "vectors": {key: [values]}}.
   ``layouts`` names the slots of a vector key ({"grad": ["fc1.weight", ...]}) and is sent
   with the first batch after the layout changes.
   ``events`` are run-level facts: {"type": "status", "status": "finished" | "failed"},
   {"type": "exception", ...}, {"type": "alert", ...} (alerts only the client can see, like OOM).
4. ``ack``     (server) {"type": "ack", "seq": n} once batch n is committed. A batch with a
   seq already committed is acked again and not stored twice.
5. ``nack``    (server) {"type": "nack", "expected": n}: a gap; resend from n.
6. ``error``   (server) {"type": "error", "message": str}; the server then closes.
"""

from __future__ import annotations

import array
import base64
import json
import math
import sys
from typing import Any

PROTOCOL_VERSION = 1
INGEST_PATH = "/ws/ingest"
DEFAULT_SERVER = "http://127.0.0.1:8765"

# Close code sent with an ``error`` for a protocol version mismatch (4000-4999: private use).
CLOSE_PROTOCOL_MISMATCH = 4001
CLOSE_BAD_MESSAGE = 4002

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


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


# Features a server announces in ``welcome``; a client uses one only when announced.
VECTOR_F64 = "vector_f64"  # a vector may travel as {"f64": base64 of little-endian float64, "missing": [i]}
SERVER_FEATURES = [VECTOR_F64]


def encode_vector_f64(values: list) -> dict:
    """A vector as base64 float64 bytes (NaN/inf exact, ~8x cheaper than JSON numbers); None = missing."""
    missing = [i for i, v in enumerate(values) if v is None]
    data = array.array("d", [math.nan if v is None else v for v in values] if missing else values)
    if sys.byteorder != "little":
        data.byteswap()
    out: dict = {"f64": base64.b64encode(data.tobytes()).decode("ascii")}
    if missing:
        out["missing"] = missing
    return out


def decode_vector(value: Any) -> list:
    """A vector in either wire form, as floats with None for missing slots; ProtocolError otherwise."""
    if isinstance(value, list):
        # Plain finite floats (nearly every value) need no decoding; checking that is ~20x cheaper.
        return value if all(type(v) is float for v in value) else [decode_float(v) for v in value]
    if not isinstance(value, dict) or not isinstance(value.get("f64"), str):
        raise ProtocolError("a vector must be a list or {\"f64\": base64, \"missing\": [...]}")
    try:
        raw = base64.b64decode(value["f64"], validate=True)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"vector f64 is not valid base64: {exc}") from None
    if len(raw) % 8:
        raise ProtocolError("vector f64 must hold a whole number of float64 values")
    data = array.array("d")
    data.frombytes(raw)
    if sys.byteorder != "little":
        data.byteswap()
    out: list = data.tolist()
    missing = value.get("missing") or []
    if not isinstance(missing, list) or not all(type(i) is int and 0 <= i < len(out) for i in missing):
        raise ProtocolError("vector missing must be a list of slot indices")
    for i in missing:
        out[i] = None
    return out


def decode_float(value: Any) -> float | None:
    """Inverse of ``encode_float``; raises ProtocolError on anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ProtocolError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    raise ProtocolError(f"expected a number or 'NaN'/'Infinity'/'-Infinity', got {value!r}")


def is_loss_key(key: str) -> bool:
    """Keys whose last path part mentions 'loss' are the ones watched for NaN/inf and spikes."""
    return "loss" in key.rsplit("/", 1)[-1].lower()


def dumps(message: dict) -> str:
    """Serialise a message as strict JSON (NaN must already be encoded)."""
    return json.dumps(message, allow_nan=False, separators=(",", ":"))


def loads(text: str | bytes) -> dict:
    """Parse one frame; raises ProtocolError when it is not a JSON object with a type."""
    try:
        message = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError("frame must be a JSON object with a string 'type'")
    return message


def hello(run: dict, resume_from: int | None = None, layouts: dict | None = None) -> dict:
    """The first message of a connection.

    ``resume_from``: the oldest batch the client still holds; ``layouts``: every vector layout it
    has sent, so a server that lost the batch that carried one can still take the vectors.
    """
    msg = {"type": "hello", "protocol": PROTOCOL_VERSION, "run": run}
    if resume_from is not None:
        msg["resume_from"] = resume_from
    if layouts:
        msg["layouts"] = layouts
    return msg


def batch(seq: int, records: list, layouts: dict | None = None, events: list | None = None) -> dict:
    """A numbered batch of records; values must already be encoded with ``encode_float``."""
    msg: dict = {"type": "batch", "seq": seq, "records": records}
    if layouts:
        msg["layouts"] = layouts
    if events:
        msg["events"] = events
    return msg


def batch_text(seq: int, record_texts: list[str], layouts: dict | None = None, events: list | None = None) -> str:
    """``dumps(batch(...))`` from records serialised one by one (lets a sender pause between them)."""
    head = dumps(batch(seq, [], layouts, events))
    return head.replace('"records":[]', '"records":[' + ",".join(record_texts) + "]", 1)


def check_hello(message: dict) -> dict:
    """Validate a hello and return its run section; raises ProtocolError with a clear reason."""
    if message.get("type") != "hello":
        raise ProtocolError("first message must be 'hello'")
    version = message.get("protocol")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version mismatch: client speaks {version!r}, server speaks "
            f"{PROTOCOL_VERSION}; install the same gradwatch version on both sides"
        )
    run = message.get("run")
    if not isinstance(run, dict) or not isinstance(run.get("uid"), str) or not run["uid"]:
        raise ProtocolError("hello.run must be an object with a non-empty string 'uid'")
    return run


def decode_record(record: Any) -> tuple[int, float, dict, dict]:
    """Validate one record; returns (step, wall_time, scalars, vectors) with decoded floats."""
    if not isinstance(record, dict):
        raise ProtocolError("record must be an object")
    step, wall = record.get("step"), record.get("t")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ProtocolError(f"record.step must be a non-negative integer, got {step!r}")
    if not isinstance(wall, (int, float)) or isinstance(wall, bool) or not math.isfinite(wall):
        raise ProtocolError(f"record.t must be a finite number, got {wall!r}")
    scalars = {}
    for key, value in (record.get("scalars") or {}).items():
        check_key(key)
        decoded = decode_float(value)
        if decoded is None:
            raise ProtocolError(f"scalar {key!r} has no value")
        scalars[key] = decoded
    vectors = {}
    for key, values in (record.get("vectors") or {}).items():
        check_key(key)
        try:
            vectors[key] = decode_vector(values)
        except ProtocolError as exc:
            raise ProtocolError(f"vector {key!r}: {exc}") from None
    return step, float(wall), scalars, vectors


def check_key(key: Any) -> str:
    """Metric keys are non-empty strings of at most 256 characters."""
    if not isinstance(key, str) or not key or len(key) > 256:
        shown = repr(key) if not isinstance(key, str) or len(key) <= 60 else f"{key[:40]!r}... ({len(key)} chars)"
        raise ProtocolError(f"metric key must be a non-empty string of <= 256 chars, got {shown}")
    return key
