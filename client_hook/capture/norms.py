"""Tensor reads every capture shares: fused per-tensor norms, the AMP loss scale, the end of a backward pass.

Each wraps a torch internal that has no public equivalent (see each docstring); nothing here copies a
value to the host, so none of them syncs the device.
"""

from __future__ import annotations


def fused_norms(torch, tensors: list):
    """One float32 norm per tensor as a single vector on the first tensor's device (sparse ones coalesced).

    One fused kernel launch per (device, dtype): ``torch.nn.utils.get_total_norm`` uses
    ``torch._foreach_norm`` internally but returns only the total; the per-tensor norms have no
    public multi-tensor entry point.
    """
    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype, t.is_sparse), []).append(i)
    if len(groups) == 1 and not tensors[0].is_sparse:  # the usual case: one launch, one stack
        return torch.stack(torch._foreach_norm(tensors)).to(torch.float32)
    out = [None] * len(tensors)
    for (_device, _dtype, sparse), idx in groups.items():
        chunk = [tensors[i] for i in idx]
        norms = [t.coalesce().values().norm() for t in chunk] if sparse else torch._foreach_norm(chunk)
        for i, n in zip(idx, norms):
            out[i] = n
    target = out[0].device
    return torch.stack([n.to(device=target, dtype=torch.float32) for n in out])


def loss_scale(scaler):
    """A GradScaler's current scale as a device tensor, or None (no scaler, disabled, or before its first step).

    ``GradScaler.get_scale()`` is the public way, but it copies the scale to the host: a device sync at
    every step. The tensor itself (and the enabled flag, read with it for the same reason) is only ``_scale``.
    """
    if scaler is None or not getattr(scaler, "_enabled", True):
        return None
    return getattr(scaler, "_scale", None)


def when_backward_ends(torch, fn) -> None:
    """Call ``fn`` once the whole backward pass is done (from inside a gradient hook).

    Autograd has no public "backward finished" hook; this is the engine callback that
    ``torch.nn.parallel.DistributedDataParallel`` relies on too.
    """
    torch.autograd.Variable._execution_engine.queue_callback(fn)
