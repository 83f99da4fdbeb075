"""The gradwatch wire protocol, shared by the training-side hook and the server.

One websocket per run, JSON text frames. Non-finite floats travel as the strings
"NaN", "Infinity" and "-Infinity" (strict JSON has no NaN), so every frame is valid
JSON and NaN/inf arrive exactly. A vector slot that is JSON ``null`` means "no value"
(a parameter whose ``.grad`` was None), which is different from NaN.

Conversation (client -> server unless marked):

1. ``hello``   {"type": "hello", "protocol": 1, "run": {uid, secret, project, name, config, meta, alerts},
   "resume_from": n, "layouts": {...}} (both optional: the oldest batch the client still holds
   - when the server has committed less than n - 1, those batches are gone for good and it
   carries on from n, with a ``data_gap`` alert - and every vector layout sent so far, which the
   server takes for vector keys it does not know)
2. ``welcome`` (server) {"type": "welcome", "protocol": 1, "run_id": int, "acked_seq": int,
   "features": [...], "max_frame_bytes": int} - the largest frame it takes; optional capabilities; "vector_f64" lets vectors travel as
   {"f64": base64 little-endian float64, "missing": [slot, ...]} instead of JSON lists
   ``acked_seq`` is the last batch the server has committed for this run uid; the client
   forgets batches up to it and resends the rest, in order.
   "columns": a batch may carry "columns" (see encode_columns) instead of "records".
3. ``batch``   {"type": "batch", "seq": n, "records": [...] or "columns": {...}, "layouts": {...}, "events": [...]}
   ``seq`` starts at 1 and increases by one. Each record is
   {"step": int, "t": unix seconds, "scalars": {key: value}, "vectors": {key: [values]}}.
   ``layouts`` names the slots of a vector key ({"grad": ["fc1.weight", ...]}) and is sent
   with the first batch after the layout changes.
   ``events`` are run-level facts: {"type": "status", "status": "finished" | "failed"},
   {"type": "exception", ...}, {"type": "alert", ...} (alerts only the client can see, like OOM).
4. ``ack``     (server) {"type": "ack", "seq": n} once batch n is committed. A batch with a
   seq already committed is acked again and not stored twice. {"type": "ack", "seq": n,
   "refused": reason}: part of it could not be stored (the rest was); never resend it.
5. ``nack``    (server) {"type": "nack", "expected": n}: a gap; resend from n.
6. ``error``   (server) {"type": "error", "message": str}; the server then closes. With
   "code": "run_deleted" (close 4003) the run was deleted on the server: stop sending it.
"""

from __future__ import annotations

import array
import base64
import json
import math
import sys
from typing import Any

# The shared facts (float codec, loss keys, limits) live in gradwatch.contract; these names stay
# importable from gradwatch.protocol, where callers have always found them.
from gradwatch.contract import MAX_KEY_LEN, ProtocolError, decode_float
from gradwatch.contract import MAX_STEP as MAX_STEP
from gradwatch.contract import encode_float as encode_float
from gradwatch.contract import is_loss_key as is_loss_key

PROTOCOL_VERSION = 1
INGEST_PATH = "/ws/ingest"
DEFAULT_SERVER = "http://127.0.0.1:8765"

# Close code sent with an ``error`` for a protocol version mismatch (4000-4999: private use).
CLOSE_PROTOCOL_MISMATCH = 4001
CLOSE_BAD_MESSAGE = 4002
CLOSE_RUN_DELETED = 4003  # with {"type": "error", "code": "run_deleted"}: stop sending this run

# Features a server announces in ``welcome``; a client uses one only when announced.
VECTOR_F64 = "vector_f64"  # a vector may travel as {"f64": base64 of little-endian float64, "missing": [i]}
COLUMNS = "columns"  # a batch may carry "columns" (one packed array per key) instead of "records"
MEDIA = "media"  # a batch may carry "media": histograms, images, tables and text (see MEDIA_KINDS)
RUN_EVENTS = "run_events"  # a batch's events may be RUN_EVENT_TYPES (W&B's run.summary, config updates, define_metric)
HISTOGRAM_PACKED = "histogram_packed"  # histogram counts may travel packed (gradwatch.contract.wire.encode_counts)
SERVER_FEATURES = [VECTOR_F64, COLUMNS, MEDIA, RUN_EVENTS, HISTOGRAM_PACKED]
# {"type": "summary", "set": {key: value}, "remove": [key]}, {"type": "config", "config": {changes}},
# {"type": "meta", "meta": {changes}}: a server without RUN_EVENTS refuses them (a client holds them back).
RUN_EVENT_TYPES = ("summary", "config", "meta")
# "media" entries: {"step": int, "t": float, "key": str, "kind": one of MEDIA_KINDS, "value": {...}} where value is
# histogram {"lo", "hi", "counts": [int]} or {"edges": [n + 1], "counts": [n]}, plus "nan", "inf", "ninf" counts
# ("counts" {"u16" | "u32": base64, "scale": k}, or many of one step as {"keys": [...], "lo": [...], ..., "counts":
# packed keys x bins} to a server announcing HISTOGRAM_PACKED: docs/protocol.md);
# image {"images": [{"png": base64, "width", "height", "caption"?}]}; table {"columns": [str], "rows": [[cell]]}
# (non-finite numbers as the float codec's strings); text {"text": str}. A server without the feature ignores them.
MEDIA_KINDS = ("histogram", "image", "table", "text")


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
        raise ProtocolError('a vector must be a list or {"f64": base64, "missing": [...]}')
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


# One encoder for every frame: json.dumps with options builds a new JSONEncoder at each call (~3 µs, a
# tenth of an ack's encoding; the server encodes an ack and a push per live batch).
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def dumps(message: dict) -> str:
    """Serialise a message as strict JSON (NaN must already be encoded)."""
    return _ENCODER.encode(message)


def loads(text: str | bytes) -> dict:
    """Parse one frame; raises ProtocolError when it is not a JSON object with a type."""
    try:
        message = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("frame is nested too deeply") from None
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


def batch(
    seq: int, records: list, layouts: dict | None = None, events: list | None = None, media: list | None = None
) -> dict:
    """A numbered batch of records; values must already be encoded with ``encode_float``."""
    msg: dict = {"type": "batch", "seq": seq, "records": records}
    if layouts:
        msg["layouts"] = layouts
    if events:
        msg["events"] = events
    if media:
        msg["media"] = media
    return msg


def batch_text(
    seq: int,
    record_texts: list[str],
    layouts: dict | None = None,
    events: list | None = None,
    media: list | None = None,
) -> str:
    """``dumps(batch(...))`` from records serialised one by one (lets a sender pause between them)."""
    head = dumps(batch(seq, [], layouts, events, media))
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
    if not isinstance(run, dict) or not isinstance(run.get("uid"), str) or not 0 < len(run["uid"]) <= 64:
        raise ProtocolError("hello.run must be an object with a 'uid' string of 1-64 characters")
    for name in ("project", "name", "secret"):
        if run.get(name) is not None and not isinstance(run.get(name), str):
            raise ProtocolError(f"hello.run.{name} must be a string")
    for name, kind in (("config", dict), ("meta", dict), ("alerts", dict), ("tags", list)):
        if run.get(name) is not None and not isinstance(run.get(name), kind):
            raise ProtocolError(f"hello.run.{name} must be {'an object' if kind is dict else 'a list'}")
    return run


def hello_layouts(message: dict) -> dict | None:
    """The ``layouts`` of a hello when it is an object of lists; ProtocolError otherwise."""
    layouts = message.get("layouts")
    if layouts is None:
        return None
    if not isinstance(layouts, dict) or not all(isinstance(v, list) for v in layouts.values()):
        raise ProtocolError("hello.layouts must be an object of key -> list of slot names")
    for key in layouts:
        check_key(key)
    return layouts


def decode_record(record: Any) -> tuple[int, float, dict, dict]:
    """Validate one record; returns (step, wall_time, scalars, vectors) with decoded floats."""
    if not isinstance(record, dict):
        raise ProtocolError("record must be an object")
    step, wall = record.get("step"), record.get("t")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ProtocolError(f"record.step must be a non-negative integer, got {step!r}")
    if not isinstance(wall, (int, float)) or isinstance(wall, bool) or not math.isfinite(wall):
        raise ProtocolError(f"record.t must be a finite number, got {wall!r}")
    if not isinstance(record.get("scalars") or {}, dict) or not isinstance(record.get("vectors") or {}, dict):
        raise ProtocolError("record.scalars and record.vectors must be objects")
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
    """Metric keys are non-empty strings of at most MAX_KEY_LEN characters of valid Unicode (no lone surrogates)."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LEN:
        shown = repr(key) if not isinstance(key, str) or len(key) <= 60 else f"{key[:40]!r}... ({len(key)} chars)"
        raise ProtocolError(f"metric key must be a non-empty string of <= {MAX_KEY_LEN} chars, got {shown}")
    if not valid_unicode(key):
        raise ProtocolError(f"metric key {key!r} is not valid Unicode (a lone surrogate)")
    return key


def valid_unicode(text: str) -> bool:
    """Whether a string can be stored and served as UTF-8 (JSON lets a lone surrogate through)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clean_text(text) -> str:
    """A peer's string made safe to store and serve (a lone surrogate becomes '?')."""
    text = str(text)
    return text if valid_unicode(text) else text.encode("utf-8", "replace").decode("utf-8")


# -- columnar batches (feature "columns") ------------------------------------------------------
# A batch's records as one packed array per key: the server decodes a whole batch with a few
# numpy calls instead of a Python loop per record, and the client encodes it with one array
# append per value. Arrays are little-endian base64: steps int64, times and values float64 (NaN and
# inf bit-exact), rows (indices into steps, only when a key is not in every record) int32, and a
# vector's "missing" a uint8 mask of its k x slots values (1 = no value, .grad was None).


def _b64(typecode: str, values) -> str:
    data = array.array(typecode, values)
    if sys.byteorder != "little":
        data.byteswap()
    return base64.b64encode(data.tobytes()).decode("ascii")


def _unb64(text: Any, typecode: str, what: str) -> array.array:
    if not isinstance(text, str):
        raise ProtocolError(f"{what} must be a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"{what} is not valid base64: {exc}") from None
    data = array.array(typecode)
    if len(raw) % data.itemsize:
        raise ProtocolError(f"{what} must hold whole {data.itemsize}-byte values")
    data.frombytes(raw)
    if sys.byteorder != "little":
        data.byteswap()
    return data


def encode_columns(records: list) -> dict:
    """Records ``(step, wall, scalars, vectors)`` (vectors: key -> list, None = missing) as columns."""
    n = len(records)
    out: dict = {"steps": _b64("q", [r[0] for r in records]), "t": _b64("d", [r[1] for r in records])}
    first = records[0][2].keys() if records else ()
    if all(r[2].keys() == first for r in records):  # the usual case: the same keys every step
        out["scalars"] = {key: {"f64": _b64("d", [r[2][key] for r in records])} for key in first}
    else:
        scalars: dict = {}
        for i, (_step, _wall, sc, _vec) in enumerate(records):
            for key, value in sc.items():
                col = scalars.get(key)
                if col is None:
                    col = scalars[key] = ([], [])
                col[0].append(i)
                col[1].append(value)
        out["scalars"] = {key: _column(rows, n, {"f64": _b64("d", values)}) for key, (rows, values) in scalars.items()}
    vectors: dict = {}
    for i, (_step, _wall, _sc, vec) in enumerate(records):
        for key, values in vec.items():
            col = vectors.get(key)
            if col is None:
                col = vectors[key] = ([], [], len(values))
            if len(values) != col[2]:
                raise ValueError(f"vector {key!r} changes width inside one batch")
            col[0].append(i)
            col[1].append(values)
    out["vectors"] = {
        key: _column(rows, n, _vector_column(values, slots)) for key, (rows, values, slots) in vectors.items()
    }
    return out


def _column(rows: list, n: int, body: dict) -> dict:
    if len(rows) != n:
        body["rows"] = _b64("i", rows)
    return body


def _vector_column(values: list, slots: int) -> dict:
    flat = [v for row in values for v in row]
    body: dict = {"slots": slots}
    if None in flat:
        body["missing"] = _b64("B", [v is None for v in flat])
        flat = [math.nan if v is None else v for v in flat]
    body["f64"] = _b64("d", flat)
    return body


def decode_columns(cols: Any) -> tuple:
    """Validate a batch's "columns"; returns (steps, walls, scalars, vectors) as ``array.array``s.

    ``scalars``: key -> (rows or None for every record, values); ``vectors``: key -> (rows or None,
    slots, values of k * slots, missing mask or None). Raises ProtocolError with the reason.
    """
    if not isinstance(cols, dict):
        raise ProtocolError("batch.columns must be an object")
    steps = _unb64(cols.get("steps"), "q", "columns.steps")
    walls = _unb64(cols.get("t"), "d", "columns.t")
    n = len(steps)
    if len(walls) != n:
        raise ProtocolError("columns.t must have one time per step")
    if n and min(steps) < 0:
        raise ProtocolError("steps must be non-negative")
    if not all(math.isfinite(w) for w in walls):
        raise ProtocolError("columns.t must be finite numbers")
    scalars, vectors = {}, {}
    for kind, out in (("scalars", scalars), ("vectors", vectors)):
        section = cols.get(kind) or {}
        if not isinstance(section, dict):
            raise ProtocolError(f"columns.{kind} must be an object")
        for key, body in section.items():
            check_key(key)
            if not isinstance(body, dict):
                raise ProtocolError(f"{kind} column {key!r} must be an object")
            rows = _rows(body, n, key)
            k = n if rows is None else len(rows)
            values = _unb64(body.get("f64"), "d", f"column {key!r}")
            if kind == "scalars":
                if len(values) != k:
                    raise ProtocolError(f"column {key!r} has {len(values)} values for {k} rows")
                out[key] = (rows, values)
                continue
            slots = body.get("slots")
            if type(slots) is not int or slots < 0 or len(values) != k * slots:
                raise ProtocolError(f"vector column {key!r} needs an integer 'slots' and rows x slots values")
            missing = body.get("missing")
            if missing is not None:
                missing = _unb64(missing, "B", f"column {key!r} missing")
                if len(missing) != len(values):
                    raise ProtocolError(f"vector column {key!r}: missing mask has the wrong length")
            out[key] = (rows, slots, values, missing)
    return steps, walls, scalars, vectors


def _rows(body: dict, n: int, key: str):
    if "rows" not in body:
        return None
    rows = _unb64(body["rows"], "i", f"column {key!r} rows")
    if any(not 0 <= r < n for r in rows) or any(b <= a for a, b in zip(rows, rows[1:])):
        raise ProtocolError(f"column {key!r} rows must be increasing record indices")
    return rows
