"""What ``log()`` does with values that are not numbers: nested dicts flattened with "/", strings kept as
text, arrays and multi-value tensors as histograms (W&B's rule), media values set apart for the sender."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from gradwatch import protocol
from gradwatch.media.base import MediaValue
from gradwatch.media.histogram import Histogram
from gradwatch.media.table import Text

MAX_DEPTH = 8  # nested dicts deeper than this are logged as their text


def split(data: Mapping) -> tuple[dict, dict]:
    """(numbers and single-value tensors, media values by key) of one ``log()`` call; cheap when all are numbers."""
    plain, media = {}, {}
    for key, value in data.items():
        if type(value) is float or type(value) is int:
            plain[key] = value
        else:
            _place(plain, media, key, value, 0)
    return plain, media


def _place(plain: dict, media: dict, key, value, depth: int) -> None:
    if isinstance(value, MediaValue):
        media[key] = value
    elif isinstance(value, list) and value and all(isinstance(v, MediaValue) for v in value):
        media[key] = list(value)
    elif isinstance(value, Mapping) and depth < MAX_DEPTH:
        for sub, inner in value.items():
            _place(plain, media, f"{key}/{sub}", inner, depth + 1)
    elif isinstance(value, (str, Mapping)):
        media[key] = Text(value)
    elif _is_many(value):
        media[key] = Histogram(value)
    else:
        plain[key] = value  # a number, a 1-value tensor, or something log() will refuse with its reason


def _is_many(value) -> bool:
    """A tensor or array of more than one value (W&B logs those as histograms)."""
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.numel() > 1
    return np is not None and isinstance(value, np.ndarray) and value.size > 1


def put(recorder, step: int, media: dict, wall: float | None = None) -> None:
    """Hand each media value to the run's sender at ``step`` (stamped ``wall``, default now); never raises."""
    outbound = recorder.sender.encoder.media
    for key, value in media.items():
        try:
            protocol.check_key(key)
        except protocol.ProtocolError as exc:
            recorder.warn_once(f"key:{key}", f"gradwatch: not logging {key!r}: {exc}")
            continue
        recorder.sender.put(outbound.item(step, key, value, wall))
