"""Media values on their way out: queued from the training thread (bounded), encoded on the sender thread.

``Outbound.put`` (training thread) hands a value to the sender as ``("media", step, wall, key, value,
estimated bytes)``, or a refusal when the run's media queue, the step's budget or the run's budget is
spent. ``Outbound.encode`` (sender thread) reads every histogram off its device in one go, encodes
images and tables, and turns each value it cannot send into a counted ``data_gap`` alert and one line
on stderr per reason.
"""

from __future__ import annotations

import sys
import time

from gradwatch import protocol, values
from gradwatch.media import histogram, limits
from gradwatch.media.base import MediaValue
from gradwatch.media.histogram_group import HistogramGroup
from gradwatch.media.limits import MediaRefused

MEDIA = "media"  # the wire feature (gradwatch.protocol.MEDIA) a server announces when it stores these
MAX_QUEUED_BYTES = 64 << 20  # media handed to the sender and not yet encoded


class Refused(MediaValue):
    """A value refused on the training thread; travels to the sender only to be counted there."""

    kind = "refused"

    def __init__(self, why: str, count: int = 1):
        self.refused, self.count = why, count  # count: the values it stands for (a whole watch() capture)

    def estimated_bytes(self) -> int:
        return 0


class Outbound:
    """One run's media budget and its refusals; ``put`` runs on the training thread, the rest on the sender's."""

    def __init__(self):
        self.put_bytes = 0  # written by the training thread only
        self.put_count = 0  # values handed over (refusals included; a watch() capture counts its histograms)
        self.taken_bytes = 0  # written by the sender thread only
        self.sent_bytes = 0
        self._step = None
        self._step_bytes = 0
        self.refusals: dict[str, int] = {}  # reason -> count, for tests and the closing note
        self._told: set[str] = set()

    def item(self, step: int, key: str, value, wall: float | None = None) -> tuple:
        """The sender item for ``value`` (a MediaValue or a list of Images) at ``step``, or a refusal.

        ``wall``: its time (default now; an import keeps the original)."""
        parts = value if isinstance(value, list) else [value]
        size = sum(p.estimated_bytes() for p in parts)
        count = value.count if isinstance(value, MediaValue) else 1
        if step != self._step:
            self._step, self._step_bytes = step, 0
        if len(parts) > limits.MAX_IMAGES_PER_VALUE:
            value, size = (
                Refused(f"{len(parts)} images under one key is over the limit of {limits.MAX_IMAGES_PER_VALUE}"),
                0,
            )
        elif self._step_bytes + size > limits.MAX_STEP_BYTES:
            value, size = Refused(f"step {step} already holds {limits.MAX_STEP_BYTES:,} bytes of media", count), 0
        elif self.put_bytes - self.taken_bytes + size > MAX_QUEUED_BYTES:
            value, size = Refused("the sender fell behind with media values (queue over its memory bound)", count), 0
        self._step_bytes += size
        self.put_bytes += size
        self.put_count += count
        return ("media", step, time.time() if wall is None else wall, key, value, size)

    # -- sender thread ------------------------------------------------------------------------
    def encode(self, items: list, features) -> tuple[list, list]:
        """Wire entries for ``items`` and the data_gap events for what could not be sent."""
        for item in items:
            self.taken_bytes += item[5]
        deferred = [d for item in items for part in _parts(item[4]) for d in _deferred(part)]
        resolved = dict(zip(map(id, deferred), values.resolve(deferred))) if deferred else {}
        entries, gaps, grouped = [], {}, set()
        for members, heads, counts in _bin_small_cpu(items):
            if features and protocol.MEDIA in features and protocol.HISTOGRAM_PACKED in features:
                grouped.update(self._grouped(members, heads, counts, entries))
            resolved.update(
                (id(m[4]), h + c) for m, h, c in zip(members, heads, counts.tolist()) if id(m) not in grouped
            )
        for item in items:
            if id(item) in grouped:
                continue
            _kind, step, wall, key, value, _size = item
            whole = isinstance(value, HistogramGroup)
            count = value.count if isinstance(value, MediaValue) else 1
            try:
                if whole:
                    entries += self._group_entries(step, wall, value, features, resolved)
                else:
                    entries.append(self._entry(step, wall, key, value, resolved, features))
            except MediaRefused as exc:
                self._refuse(gaps, step, key, str(exc), count)
            except Exception as exc:  # an encoder failure on odd data: counted, never raised
                why = f"could not be encoded ({type(exc).__name__}: {exc})"[:300]
                self._refuse(gaps, step, key, why, count)
        return entries, [_gap_event(*g) for g in gaps.values()]

    def _group_entries(self, step, wall, group: HistogramGroup, features, resolved: dict) -> list[dict]:
        """A watch() capture's wire entries: one packed group (wire feature ``histogram_packed``), else one each."""
        if group.refused:
            raise MediaRefused(group.refused)
        if features and MEDIA not in features:
            raise MediaRefused("the server does not store histograms, images or tables (an older gradwatch server)")
        size = 256 * len(group.keys)
        if self.sent_bytes + size > limits.MAX_RUN_BYTES:
            raise MediaRefused(f"the run already sent {limits.MAX_RUN_BYTES:,} bytes of media")
        if not group.keys:
            return []
        heads, counts = group.binned(resolved)
        self.sent_bytes += size
        if features and protocol.HISTOGRAM_PACKED in features:
            return [_packed(step, wall, group.keys, group.scale, heads, counts)]
        return [
            {"step": step, "t": wall, "key": key, "kind": "histogram", "value": histogram.wire_one(h, c, k, False)}
            for key, h, c, k in zip(group.keys, heads, counts.tolist(), group.scale)
        ]

    def _entry(self, step, wall, key, value, resolved, features) -> dict:
        if features and MEDIA not in features:  # connected to a server that does not take them (before: spooled as is)
            raise MediaRefused("the server does not store histograms, images or tables (an older gradwatch server)")
        parts = _parts(value)
        for part in parts:
            if part.refused:
                raise MediaRefused(part.refused)
        kinds = {p.kind for p in parts}
        if len(kinds) != 1 or (len(parts) > 1 and kinds != {"image"}):
            raise MediaRefused("a list logged under one key must hold images only")
        if kinds == {"image"}:
            body = {"images": [p.to_wire(resolved) for p in parts]}
        elif kinds == {"histogram"}:
            body = parts[0].to_wire(resolved, packed=bool(features) and protocol.HISTOGRAM_PACKED in features)
        else:
            body = parts[0].to_wire(resolved)
        size = sum(len(p.get("png", "")) for p in body.get("images", ())) or 256
        if self.sent_bytes + size > limits.MAX_RUN_BYTES:
            raise MediaRefused(f"the run already sent {limits.MAX_RUN_BYTES:,} bytes of media")
        self.sent_bytes += size
        return {"step": step, "t": wall, "key": key, "kind": parts[0].kind, "value": body}

    def _grouped(self, members: list, heads: list, counts, entries: list) -> set:
        """One entry per step for the binned watch() histograms ``members`` (items), appended to ``entries``;
        the ids of the items it took (the rest, and all of a group over the run's budget, go one by one)."""
        by_step: dict = {}
        for i, item in enumerate(members):
            by_step.setdefault(item[1], []).append(i)
        taken = set()
        for step, picks in by_step.items():
            size = 256 * len(picks)
            if len(picks) < 2 or self.sent_bytes + size > limits.MAX_RUN_BYTES:
                continue
            self.sent_bytes += size
            group = [members[i] for i in picks]
            keys, scales = [m[3] for m in group], [m[4].scale for m in group]
            entries.append(_packed(step, group[0][2], keys, scales, [heads[i] for i in picks], counts[picks]))
            taken.update(id(m) for m in group)
        return taken

    def _refuse(self, gaps: dict, step: int, key: str, why: str, count: int = 1) -> None:
        self.refusals[why] = self.refusals.get(why, 0) + count
        tag = why.split(" ")[0] + why[-24:]
        if tag not in self._told:
            self._told.add(tag)
            print(f"gradwatch: {key!r} at step {step} not kept: {why} (counted as a data gap)", file=sys.stderr)
        first = gaps.setdefault(why, [0, step, step, why])
        first[0] += count
        first[2] = step


def _bin_small_cpu(items: list) -> list[tuple]:
    """(items, heads, counts) per bin count for the small CPU histograms of these items, binned together
    (one set of ops for a watch() capture's hundreds of parameters instead of one per parameter)."""
    groups: dict = {}
    for item in items:
        part = item[4]
        tensor = histogram.host_tensor(part)  # a list of parts (images) is never one
        if tensor is not None:
            groups.setdefault(part.num_bins, []).append((item, tensor))
    torch = sys.modules.get("torch")
    if sys.modules.get("numpy") is None:
        return []
    out = []
    for bins, members in groups.items():
        if len(members) > 1:
            heads, counts = histogram.bin_matrix(torch, [t for _i, t in members], bins)
            out.append(([i for i, _t in members], heads, counts))
    return out


def _parts(value) -> list:
    return value if isinstance(value, list) else [value]


def _deferred(part) -> list:
    return part.deferred() if hasattr(part, "deferred") and not part.refused else []


def _gap_event(count: int, first: int, last: int, why: str) -> dict:
    where = f" (steps {first}-{last})" if first != last else f" (step {first})"
    return {
        "type": "alert",
        "kind": "data_gap",
        "severity": "warning",
        "step": first,
        "value": float(count),
        "message": f"gradwatch dropped {count} media value(s){where} in the training process: {why}"[:1000],
    }


def _packed(step: int, wall: float, keys: list, scales: list, heads: list, counts) -> dict:
    """One wire entry for histograms of one step under ``keys`` (the wire feature ``histogram_packed``)."""
    value = histogram.wire_group(scales, heads, counts)
    value["keys"] = keys
    return {"step": step, "t": wall, "key": keys[0], "kind": "histogram", "value": value}
