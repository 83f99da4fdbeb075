"""Seeing ``clip_grad_norm_``: the gradients just before it clips them, and by how much it did.

While a watcher listens, ``torch.nn.utils.clip_grad_norm_`` is wrapped (the name scripts, Lightning and
accelerate call it by): listeners hear ``before(params, max_norm)`` with the gradients as backward
produced them (after ``GradScaler.unscale_``), then ``after(params, max_norm, total)`` with the total
norm it returned. Clipping multiplies every gradient it clips by the same factor,
``min(1, max_norm / (total + 1e-6))``, so the norms after it follow from the norms before it: no second
pass over the gradients, and no host-device sync (the factor stays a device tensor).

A script that bound the function before ``watch()`` (``from torch.nn.utils import clip_grad_norm_`` at
import time) calls the original: then the capture happens at ``optimizer.step()``, after its clipping
(docs/gradients.md says so).
"""

from __future__ import annotations

_listeners: list = []
_originals: dict = {}  # (module, name) -> the function it held before the wrap


def listen(listener) -> None:
    """Add a listener (``before(params, max_norm)``, ``after(params, max_norm, total)``); wraps on the first."""
    import torch

    if not _originals:
        for module in (torch.nn.utils, torch.nn.utils.clip_grad):
            original = module.clip_grad_norm_
            _originals[(module, "clip_grad_norm_")] = original
            module.clip_grad_norm_ = _wrap(original)
    _listeners.append(listener)


def unlisten(listener) -> None:
    """Remove a listener; the last one out puts the original function back."""
    if listener in _listeners:
        _listeners.remove(listener)
    if not _listeners:
        for (module, name), original in _originals.items():
            setattr(module, name, original)
        _originals.clear()


def _wrap(original):
    def clip_grad_norm_(parameters, max_norm, *args, **kwargs):
        import torch

        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        listeners = list(_listeners)
        for listener in listeners:
            listener.before(params, max_norm)
        total = original(params, max_norm, *args, **kwargs)
        for listener in listeners:
            listener.after(params, max_norm, total)
        return total

    clip_grad_norm_.__wrapped__ = original
    clip_grad_norm_.__doc__ = original.__doc__
    return clip_grad_norm_


def clip_factor(torch, max_norm, total):
    """The factor ``clip_grad_norm_`` multiplied the gradients by, as a device tensor (its own formula)."""
    total = torch.as_tensor(total, dtype=torch.float32)
    return torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
