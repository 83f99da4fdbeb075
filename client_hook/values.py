"""Turning logged values into floats without forcing a host-device sync per step.

Host values (Python numbers, CPU tensors) become floats at once. Device tensors are kept
as detached references and read off the device later, many at once, by ``resolve``
on the background thread: one copy per device per flush instead of one sync per value.
"""

from __future__ import annotations

import math
import numbers
import sys
import time
from typing import Any

from gradwatch import protocol
from gradwatch.delivery.run_events import HeldRunEvents


class Deferred:
    """A 0-dim (or 1-dim, for vectors) device tensor whose value is read later."""

    __slots__ = ("tensor", "event")

    def __init__(self, tensor, event=None):
        self.tensor = tensor
        self.event = event


def _torch():
    return sys.modules.get("torch")


def to_value(value: Any) -> float | Deferred:
    """Convert a logged scalar; raises TypeError/ValueError for things that are not scalars."""
    if type(value) is float or type(value) is int or isinstance(value, (bool, numbers.Real)):
        return float(value)
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"only single-value tensors can be logged, got shape {tuple(value.shape)}")
        if value.device.type == "cpu":
            return float(value.item())  # no detach needed: .item() keeps no graph (and detach costs ~20 us)
        value = value.detach()  # a device tensor is kept until the sender reads it: drop its graph
        return Deferred(value.reshape(()), _record_event(torch, value))
    # numpy scalars and anything else with __float__
    if hasattr(value, "__float__"):
        return float(value)
    raise TypeError(f"cannot log a value of type {type(value).__name__}")


def _record_event(torch, tensor):
    """Mark the point in the producing stream, so the reader waits for exactly that work."""
    if tensor.device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensor.device))
    return event


def defer_vector(tensor) -> Deferred:
    """Keep a 1-dim device tensor (e.g. per-layer norms) for a later batched read."""
    torch = _torch()
    tensor = tensor.detach()
    if tensor.device.type == "cpu":
        return Deferred(tensor, None)
    return Deferred(tensor, _record_event(torch, tensor))


def resolve(items: list[Deferred]) -> list[list[float]]:
    """Read many deferred tensors with one copy per device; returns each as a list of floats."""
    torch = _torch()
    out: list[list[float] | None] = [None] * len(items)
    by_device: dict = {}
    for i, item in enumerate(items):
        by_device.setdefault(item.tensor.device, []).append(i)
    for _device, indices in by_device.items():
        for i in indices:
            if items[i].event is not None:
                items[i].event.synchronize()
        flat = [items[i].tensor.reshape(-1).to(torch.float64) for i in indices]
        sizes = [t.numel() for t in flat]
        values = torch.cat(flat).cpu().tolist() if flat else []
        pos = 0
        for i, size in zip(indices, sizes):
            out[i] = values[pos : pos + size]
            pos += size
    return out  # type: ignore[return-value]


# -- encoding queued items into batches ---------------------------------------------------------
# Batches are split by encoded size as well as by count: the server refuses frames over its limit
# (16 MiB by default), and a small frame keeps one slow batch from holding the link.
MAX_BATCH_RECORDS = 20000
TARGET_BATCH_BYTES = 2 << 20  # estimated size at which a chunk is cut
MAX_FRAME_BYTES = 4 << 20  # encoded size above which a batch is split in halves
COLUMNS = getattr(protocol, "COLUMNS", "columns")
YIELD_EVERY = 64  # records prepared between GIL hand-backs (see Encoder.encode)


def item_bytes(item: tuple) -> int:
    """Rough in-memory/encoded size of one queued item, for byte budgets; cheap (no encoding)."""
    if item[0] == "media":
        return 512 + item[5]  # its estimated encoded size (gradwatch.media.outgoing)
    if item[0] != "rec":
        return 512
    size = 200 + 100 * len(item[3])  # ~ what the tuple, dict and floats take in memory
    for vector in item[4].values():
        size += 16 + 12 * vector[2]
    return size


class Encoder:
    """Turns queued items into numbered batch texts (records or columns form), each fitting a frame."""

    def __init__(self, inspect=None, media=None):
        self.inspect = inspect
        self.media = media  # a gradwatch.media.outgoing.Outbound: encodes ("media", ...) items
        self.layouts: dict[str, list[str]] = {}  # every vector layout seen (repeated in each hello)
        self.frame_limit = MAX_FRAME_BYTES  # lowered to fit a server that accepts less (its welcome says)
        self.held = HeldRunEvents()  # run events a server without "run_events" would refuse (delivery/run_events.py)

    def encode(self, items: list, next_seq: int, features: set, events: list = ()) -> list[tuple[int, bytes, int]]:
        """Batches for ``items`` numbered from ``next_seq``: [(seq, text, record count)]."""
        out: list = []
        chunks = list(_chunks(items))
        if events or self.held.ready(features):  # extra sender events (a data gap) ride with the first batch
            chunks = chunks or [[]]
            chunks[0] = [("event", e) for e in events] + chunks[0]
        seq = next_seq
        for chunk in chunks:
            plain, layouts, evs, media = self._prepare(chunk, features)
            seq = _emit(plain, layouts, evs, features, seq, out, self.frame_limit, media)
        return out

    def encode_each(self, items: list, next_seq: int, features: set, events: list, bad) -> list:
        """``encode``, item by item (after it failed for the lot): ``bad(item, why)`` gets each item that cannot be."""
        out = self.encode([], next_seq, features, events)
        for item in items:
            try:
                out += self.encode([item], next_seq + len(out), features)
            except Exception as exc:
                bad(item, f"could not be encoded ({type(exc).__name__}: {exc})"[:300])
                del exc  # no traceback (and the frames it holds) left behind
        return out

    def _prepare(self, chunk: list, features=()) -> tuple[list, dict, list, list]:
        """Records as (step, wall, {key: float}, {key: [float | None]}), device values read in one go; media entries."""
        plain, layouts, events, slow, media = [], {}, [], [], []
        for n, item in enumerate(chunk):
            if n % YIELD_EVERY == YIELD_EVERY - 1:
                time.sleep(0)  # hand the GIL back: the training thread may be waiting for it
            kind = item[0]
            if kind == "rec":
                # Host floats only (nearly every record of a scalar loop): already plain and already
                # checked for NaN by log(); the record goes out as it is.
                if not item[4] and all(type(v) is float for v in item[3].values()):
                    plain.append(item[1:])
                else:
                    slow.append(len(plain))
                    plain.append(item)
            elif kind == "event":
                events.append(item[1])
            elif kind == "media":
                media.append(item)
            else:
                layouts[item[1]] = self.layouts[item[1]] = list(item[2])
        if slow:
            deferred = [d for i in slow for d in _deferred_in(plain[i])]
            resolved = dict(zip(map(id, deferred), resolve(deferred))) if deferred else {}
            for i in slow:
                plain[i] = self._plain(plain[i], resolved)
        if media and self.media is not None:
            media, gaps = self.media.encode(media, features)
            events += gaps
        return plain, layouts, self.held.route(events, features), media

    def _plain(self, item: tuple, resolved: dict) -> tuple:
        _, step, wall, scalars, vectors = item
        values = {k: resolved[id(v)][0] if isinstance(v, Deferred) else v for k, v in scalars.items()}
        if self.inspect is not None:
            self.inspect(step, values)
        vecs = {}
        for key, (value, missing, size) in vectors.items():
            got = resolved[id(value)] if isinstance(value, Deferred) else list(value)
            if missing or len(got) != size:
                full: list = [None] * size
                it = iter(got)
                gone = set(missing)
                for i in range(size):
                    if i not in gone:
                        full[i] = next(it, None)
                got = full
            vecs[key] = got
        return step, wall, values, vecs


class RecordTooBig(ValueError):
    """One record alone is bigger than the server accepts in a frame."""


def _emit(
    plain: list,
    layouts: dict,
    events: list,
    features: set,
    seq: int,
    out: list,
    limit: int = MAX_FRAME_BYTES,
    media: list = (),
) -> int:
    """Append batch ``seq`` (or, when over the frame limit, its halves) to out; returns the next seq."""
    text = _batch_text(seq, plain, layouts, events, features, media).encode()
    if len(text) > limit and len(plain) + len(media) <= 1:
        raise RecordTooBig(f"a record of {len(text):,} bytes is over the server's frame limit ({limit:,})")
    if len(text) > limit:
        half, mid = len(plain) // 2, len(media) // 2  # layouts and events go with the first half, which comes first
        seq = _emit(plain[:half], layouts, events, features, seq, out, limit, media[:mid])
        return _emit(plain[half:], {}, [], features, seq, out, limit, media[mid:])
    out.append((seq, text, len(plain)))
    return seq + 1


def _chunks(items: list):
    """Consecutive runs of items, each under the record count and estimated byte targets."""
    chunk, size, records = [], 0, 0
    for item in items:
        cost = item_bytes(item)
        # A new layout starts a batch: the vectors before it and after it never share one (a layer frozen mid-run).
        new_layout = item[0] == "layout" and records
        if chunk and (records >= MAX_BATCH_RECORDS or size + cost > TARGET_BATCH_BYTES or new_layout):
            yield chunk
            chunk, size, records = [], 0, 0
        chunk.append(item)
        size += cost
        records += item[0] == "rec"
    if chunk:
        yield chunk


def _batch_text(seq: int, plain: list, layouts: dict, events: list, features: set, media: list = ()) -> str:
    if COLUMNS in features and plain and hasattr(protocol, "encode_columns"):
        try:
            msg: dict = {"type": "batch", "seq": seq, "columns": protocol.encode_columns(plain)}
        except (ValueError, OverflowError):  # a vector changed width inside the batch: records carry that
            pass
        else:
            if layouts:
                msg["layouts"] = layouts
            if events:
                msg["events"] = events
            if media:
                msg["media"] = list(media)
            return protocol.dumps(msg)
    binary = protocol.VECTOR_F64 in features
    texts = []
    for n, (step, wall, scalars, vectors) in enumerate(plain):
        if n % YIELD_EVERY == YIELD_EVERY - 1:
            time.sleep(0)
        record: dict = {"step": step, "t": wall, "scalars": {k: protocol.encode_float(v) for k, v in scalars.items()}}
        if vectors:
            record["vectors"] = {k: _vector(v, binary) for k, v in vectors.items()}
        texts.append(protocol.dumps(record))
    return protocol.batch_text(seq, texts, layouts, events, list(media))


def _vector(values: list, binary: bool) -> list | dict:
    if binary:  # base64 float64: NaN/inf exact, and ~8x less work than JSON numbers
        return protocol.encode_vector_f64(values)
    if None not in values and math.isfinite(sum(values)):
        return values  # all finite (a NaN/inf makes the sum non-finite): nothing to encode
    return [protocol.encode_float(v) for v in values]


def _deferred_in(item: tuple):
    _, _, _, scalars, vectors = item
    for value in scalars.values():
        if isinstance(value, Deferred):
            yield value
    for value, _, _ in vectors.values():
        if isinstance(value, Deferred):
            yield value
