"""Turning logged values into floats without forcing a host-device sync per step.

Host values (Python numbers, CPU tensors) become floats at once. Device tensors are kept
as detached references and read off the device later, many at once, by ``resolve``
on the background thread: one copy per device per flush instead of one sync per value.
"""

from __future__ import annotations

import numbers
import sys
from typing import Any


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
    for device, indices in by_device.items():
        for i in indices:
            if items[i].event is not None:
                items[i].event.synchronize()
        flat = [items[i].tensor.reshape(-1).to(torch.float64) for i in indices]
        sizes = [t.numel() for t in flat]
        values = torch.cat(flat).cpu().tolist() if flat else []
        pos = 0
        for i, size in zip(indices, sizes):
            out[i] = values[pos:pos + size]
            pos += size
    return out  # type: ignore[return-value]
