"""What a run tells the server about itself in its hello: config, thresholds and tags, checked at ``init()``.

Checked once, when the script calls ``init()``, so a bad argument is a clear error at once instead of a
hello the server refuses at every connection attempt.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from gradwatch import protocol, thresholds
from gradwatch.contract.rules import GOAL_PREFIX


def jsonable(value: Any) -> Any:
    """Config values as JSON-friendly data (unknown objects become their repr)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    value = plain(value)  # numpy scalars are numbers, not their repr
    if isinstance(value, float):
        return protocol.encode_float(float(value))
    if value is None or isinstance(value, (bool, int, str)):
        return (
            value
            if type(value) in (bool, int, str, type(None))
            else (str(value) if isinstance(value, str) else int(value))
        )
    return repr(value)


def plain(value: Any) -> Any:
    """numpy scalars (and other number types) as Python numbers; anything else unchanged."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def check_alerts(alerts: Mapping | None) -> dict:
    """Thresholds as {str: number}; a clear error now instead of a refused hello at every connection."""
    if alerts is None:
        return {}
    if not isinstance(alerts, Mapping):
        raise TypeError(f"alerts must be a dict of rule.threshold -> number, got {type(alerts).__name__}")
    out = {}
    for key, value in alerts.items():
        value = plain(value)
        if isinstance(key, str) and key.startswith(GOAL_PREFIX):  # a loss's goal: "fall" / "none"
            out[key] = value
            continue
        if (
            not isinstance(key, str)
            or isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ValueError(f"alerts[{key!r}] must be a finite number, got {value!r}")
        out[key] = value
    thresholds.validate(out)
    return out


def check_tags(tags) -> list[str]:
    """Tags as a list of strings; TypeError for a bare string or anything not a list of scalars."""
    if tags is None:
        return []
    if isinstance(tags, str) or not isinstance(tags, (list, tuple, set)):
        raise TypeError(f"tags must be a list of strings, got {tags!r}")
    out = []
    for tag in tags:
        tag = plain(tag)
        if not isinstance(tag, (str, int, float)) or isinstance(tag, bool):
            raise TypeError(f"tags must be strings, got {tag!r}")
        out.append(str(tag))
    return out
