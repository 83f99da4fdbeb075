"""A batch's histograms, images, tables and text (``batch.media``), and its ``summary``/``config``/``meta`` events.

Called once per batch by ``apply.apply_batch`` on the writer thread. Each entry is checked on its own
(kind, key, step, sizes, a real PNG); one that fails is left out and named in ``batch.problems`` (a
``data_refused`` alert and the ack say so), the rest is stored. A run's media stop at
``media_max_run_bytes``; each value at ``media_max_item_bytes``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select, update

from gradwatch import contract, protocol
from gradwatch.media import limits as client_limits
from gradwatch.media import png
from gradwatch_server.ingest.hello import clean_json
from gradwatch_server.storage import db
from gradwatch_server.storage.media import rows as media_store
from gradwatch_server.storage.media import summary as run_summary

RUN_EVENTS = protocol.RUN_EVENT_TYPES  # the events this module takes out of a batch
MAX_COLUMNS = 1000


@dataclass
class MediaLimits:
    """Caps on what one run may store (server settings ``media_*``)."""

    run_bytes: int = 1 << 30
    item_bytes: int = 4 << 20
    table_rows: int = client_limits.MAX_TABLE_ROWS
    bins: int = client_limits.MAX_BINS
    # the wire features this server announces (setting ``wire_features``): without MEDIA the batch's media are
    # ignored, without RUN_EVENTS its run events are left to the other events (refused), as an older server did
    features: frozenset = frozenset(protocol.SERVER_FEATURES)


def apply(conn, state, batch, limits: MediaLimits) -> None:
    """Store the batch's media rows and run events; what is refused goes to ``batch.problems``.

    ``state``: the writer's ``RunState`` of the run; ``state.media_bytes`` caches the bytes of media it
    holds (summed once, then kept; a rebuilt state sums again).
    """
    run_id = state.run_id
    takes_events = protocol.RUN_EVENTS in limits.features
    events = [e for e in batch.events if takes_events and isinstance(e, dict) and e.get("type") in RUN_EVENTS]
    if events:
        batch.events = [e for e in batch.events if not (isinstance(e, dict) and e.get("type") in RUN_EVENTS)]
        for ev in events:
            try:
                _run_event(conn, run_id, ev)
            except (protocol.ProtocolError, TypeError, ValueError) as exc:
                batch.problems.append(f"{ev.get('type')} event: {exc}")
    if not batch.media or protocol.MEDIA not in limits.features:
        return
    held = state.media_bytes
    if held is None:
        held = media_store.run_bytes(conn, run_id)
    budget = limits.run_bytes - held
    rows = []
    for i, entry in enumerate(batch.media):
        try:
            new = rows_of(entry, limits)
        except (protocol.ProtocolError, TypeError, ValueError, OverflowError) as exc:
            batch.problems.append(f"media {i}: {exc}"[:500])
            continue
        size = sum(len(r["body"]) for r in new)
        if size > budget:
            batch.problems.append(f"media {entry.get('key')!r}: the run holds its limit of {limits.run_bytes:,} bytes")
            continue
        budget -= size
        rows += new
    media_store.store(conn, run_id, rows)
    state.media_bytes = limits.run_bytes - budget  # a replaced value counts twice until the state is rebuilt


def rows_of(entry, limits: MediaLimits) -> list[dict]:
    """The stored rows of one wire entry (one, or one per image); ProtocolError/ValueError when it is not valid."""
    if not isinstance(entry, dict) or not isinstance(entry.get("value"), dict):
        raise protocol.ProtocolError("a media entry must be an object with a 'value' object")
    key = protocol.check_key(entry.get("key"))
    step, wall, kind = entry.get("step"), entry.get("t"), entry.get("kind")
    if type(step) is not int or not 0 <= step <= protocol.MAX_STEP:
        raise protocol.ProtocolError(f"media step must be an integer from 0 to 2**63-1, got {step!r}")
    if not isinstance(wall, (int, float)) or isinstance(wall, bool) or not math.isfinite(wall):
        raise protocol.ProtocolError("media t must be a finite number")
    if kind not in protocol.MEDIA_KINDS:
        raise protocol.ProtocolError(f"unknown media kind {kind!r}")
    base = {"key": key, "kind": kind, "step": step, "wall": float(wall)}
    value = entry["value"]
    if kind == "histogram" and "keys" in value:  # many histograms of one step (wire feature histogram_packed)
        return [{**base, "key": k, "idx": 0, "meta": meta, "body": body} for k, meta, body in _group(value, limits)]
    if kind == "histogram":
        meta, body = _histogram(value, limits)
        return [{**base, "idx": 0, "meta": meta, "body": body}]
    if kind == "image":
        return [{**base, "idx": i, "meta": meta, "body": body} for i, (meta, body) in enumerate(_images(value, limits))]
    body = json.dumps(_table(value, limits) if kind == "table" else _text(value), ensure_ascii=False).encode("utf-8")
    if len(body) > limits.item_bytes:
        raise ValueError(f"{kind} {key!r} of {len(body):,} bytes is over the limit of {limits.item_bytes:,}")
    return [{**base, "idx": 0, "meta": "{}", "body": body}]


def _count(value, what: str) -> int:
    if type(value) is not int or value < 0:
        raise protocol.ProtocolError(f"histogram {what} must be a non-negative integer")
    return value


def _histogram(value: dict, limits: MediaLimits) -> tuple[str, bytes]:
    counts = value.get("counts")
    if isinstance(counts, dict) and protocol.HISTOGRAM_PACKED not in limits.features:  # as a release without it did
        raise protocol.ProtocolError(f"histogram counts must be a list of 1-{limits.bins} integers")
    counts = contract.wire.decode_counts(counts) if isinstance(counts, (list, dict)) else None
    if counts is None or not 0 < len(counts) <= limits.bins:
        raise protocol.ProtocolError(f"histogram counts must be a list of 1-{limits.bins} integers")
    meta: dict = {name: _count(value.get(name, 0), name) for name in ("nan", "inf", "ninf")}
    if "edges" in value:
        edges = value["edges"]
        if not isinstance(edges, list) or len(edges) != len(counts) + 1:
            raise protocol.ProtocolError("histogram edges must be one more than its counts")
        edges = [float(e) for e in edges]
        if not all(math.isfinite(e) for e in edges) or any(b < a for a, b in zip(edges, edges[1:])):
            raise protocol.ProtocolError("histogram edges must be finite and increasing")
        meta["edges"] = edges
    else:
        lo, hi = value.get("lo"), value.get("hi")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (lo, hi)):
            raise protocol.ProtocolError("histogram lo and hi must be finite numbers")
        if hi < lo:
            raise protocol.ProtocolError("histogram hi must not be below lo")
        meta.update(lo=float(lo), hi=float(hi))
    return json.dumps(meta), np.asarray(counts, dtype="<i8").tobytes()


def _group(value: dict, limits: MediaLimits) -> list[tuple[str, str, bytes]]:
    """(key, meta, counts) of each histogram in a packed group: {"keys", "lo", "hi", "nan", "inf", "ninf", "scale"
    (one each), "counts": packed histograms x bins}; decoded with a few numpy calls, not a check per count."""
    if protocol.HISTOGRAM_PACKED not in limits.features:
        raise protocol.ProtocolError("histogram keys (a packed group) need the histogram_packed feature")
    keys = value.get("keys")
    if not isinstance(keys, list) or not keys:
        raise protocol.ProtocolError("histogram keys must be a non-empty list")
    keys = [protocol.check_key(k) for k in keys]
    n = len(keys)
    columns = {}
    for name in ("lo", "hi", "nan", "inf", "ninf", "scale"):
        column = value.get(name)
        if not isinstance(column, list) or len(column) != n:
            raise protocol.ProtocolError(f"histogram {name} must be a list with one entry per key")
        columns[name] = column
    for name in ("nan", "inf", "ninf", "scale"):
        if not all(type(c) is int and c >= (name == "scale") for c in columns[name]):
            raise protocol.ProtocolError(
                f"histogram {name} must be {'positive' if name == 'scale' else 'non-negative'} integers"
            )
    lo, hi = columns["lo"], columns["hi"]
    if not all(type(v) in (int, float) and math.isfinite(v) for v in lo + hi) or any(b < a for a, b in zip(lo, hi)):
        raise protocol.ProtocolError("histogram lo and hi must be finite numbers, hi not below lo")
    if not isinstance(value.get("counts"), dict):
        raise protocol.ProtocolError("histogram counts of a packed group must be packed")
    flat = contract.wire.decode_counts(value["counts"])
    bins = len(flat) // n
    if not 0 < bins <= limits.bins or bins * n != len(flat):
        raise protocol.ProtocolError(f"histogram counts must hold 1-{limits.bins} counts for each key")
    counts = np.asarray(flat, dtype="<i8").reshape(n, bins) * np.asarray(columns["scale"], dtype="<i8")[:, None]
    out = []
    for i, key in enumerate(keys):  # the meta each row gets from _histogram, without a json.dumps per row
        nan, inf, ninf, a, b = columns["nan"][i], columns["inf"][i], columns["ninf"][i], float(lo[i]), float(hi[i])
        meta = f'{{"nan": {nan}, "inf": {inf}, "ninf": {ninf}, "lo": {a!r}, "hi": {b!r}}}'
        out.append((key, meta, counts[i].tobytes()))
    return out


def _images(value: dict, limits: MediaLimits) -> list[tuple[str, bytes]]:
    images = value.get("images")
    if not isinstance(images, list) or not 0 < len(images) <= client_limits.MAX_IMAGES_PER_VALUE:
        raise protocol.ProtocolError(f"images must be a list of 1-{client_limits.MAX_IMAGES_PER_VALUE} images")
    out = []
    for image in images:
        text = image.get("png") if isinstance(image, dict) else None
        if not isinstance(text, str) or len(text) > limits.item_bytes * 4 // 3 + 4:
            raise ValueError(f"an image must be base64 PNG of at most {limits.item_bytes:,} bytes")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise protocol.ProtocolError("image png is not valid base64") from None
        size = png.size_of(data)
        if size is None:
            raise protocol.ProtocolError("image is not a PNG")
        meta = {"width": size[0], "height": size[1]}
        if image.get("caption") is not None:
            meta["caption"] = protocol.clean_text(image["caption"])[:1000]
        out.append((json.dumps(meta, ensure_ascii=False), data))
    return out


def _table(value: dict, limits: MediaLimits) -> dict:
    columns, rows = value.get("columns"), value.get("rows")
    if not isinstance(columns, list) or len(columns) > MAX_COLUMNS:
        raise protocol.ProtocolError(f"table columns must be a list of at most {MAX_COLUMNS} names")
    if not isinstance(rows, list) or len(rows) > limits.table_rows:
        raise ValueError(f"a table must have at most {limits.table_rows:,} rows")
    if not all(isinstance(r, list) and len(r) <= len(columns) for r in rows):
        raise protocol.ProtocolError("table rows must be lists no longer than its columns")
    cells = (c for r in rows for c in r)
    if not all(c is None or isinstance(c, (str, int, float, bool)) for c in cells):
        raise protocol.ProtocolError("table cells must be numbers, strings, booleans or null")
    return {"columns": [protocol.clean_text(c)[:200] for c in columns], "rows": clean_json(rows)}


def _text(value: dict) -> dict:
    text = value.get("text")
    if not isinstance(text, str) or len(text) > client_limits.MAX_TEXT_CHARS:
        raise ValueError(f"text must be a string of at most {client_limits.MAX_TEXT_CHARS:,} characters")
    return {"text": protocol.clean_text(text)}


def _run_event(conn, run_id: int, ev: dict) -> None:
    """run.summary changes, config updates and metadata (W&B group, job type, metric definitions)."""
    kind = ev["type"]
    if kind == "summary":
        values, removed = ev.get("set") or {}, ev.get("remove") or []
        if not isinstance(values, dict) or not isinstance(removed, list):
            raise protocol.ProtocolError("summary needs 'set' (an object) and 'remove' (a list)")
        texts = {}
        for key, value in values.items():
            text = json.dumps(clean_json(value), ensure_ascii=False)
            if len(text) > contract.MAX_DOC_BYTES:
                raise ValueError(f"summary {key!r} is over {contract.MAX_DOC_BYTES} bytes")
            texts[protocol.check_key(key)] = text
        run_summary.set_values(conn, run_id, texts, [str(k)[: contract.MAX_KEY_LEN] for k in removed])
        return
    change = ev.get(kind)
    if not isinstance(change, dict):
        raise protocol.ProtocolError(f"{kind} event needs a '{kind}' object")
    column = db.runs.c.config if kind == "config" else db.runs.c.meta
    current = json.loads(conn.execute(select(column).where(db.runs.c.id == run_id)).scalar() or "{}")
    merged = json.dumps(clean_json({**current, **change}), ensure_ascii=False)
    if len(merged) > contract.MAX_DOC_BYTES:
        raise ValueError(f"the run's {kind} would be over {contract.MAX_DOC_BYTES} bytes")
    conn.execute(update(db.runs).where(db.runs.c.id == run_id).values({column.name: merged}))
