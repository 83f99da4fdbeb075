"""Memory counters of a watched model: device (or process) memory per step, and what parameters,
gradients and optimizer state hold. Host-side reads only: nothing here syncs the device."""

from __future__ import annotations

import os

from gradwatch.contract import keys

_STATM: dict = {}  # pid -> open fd: each step costs one pread, not an open() (pid: forks reopen)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss() -> int | None:
    """Resident set size of this process in bytes (Linux /proc; None elsewhere)."""
    try:
        pid = os.getpid()
        if pid not in _STATM:
            _STATM[pid] = os.open("/proc/self/statm", os.O_RDONLY)
        return int(os.pread(_STATM[pid], 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class MemoryCounters:
    """Device memory counters (the CUDA allocator's, else the process RSS); the device's capacity sent once."""

    def __init__(self, torch):
        self.torch = torch
        self.cuda_total: float | None = None

    def read(self, device) -> dict:
        """The counters of ``device``, read without syncing it."""
        torch = self.torch
        if device.type == "cuda":
            # These are host-side allocator counters: reading them does not sync the device.
            out = {
                keys.CUDA_ALLOCATED: float(torch.cuda.memory_allocated(device)),
                keys.CUDA_RESERVED: float(torch.cuda.memory_reserved(device)),
                keys.CUDA_PEAK: float(torch.cuda.max_memory_allocated(device)),
            }
            if self.cuda_total is None:
                # The device's capacity, once (init() does not touch CUDA, so the run's metadata may lack
                # it): the server's memory_pressure rule measures reserved memory against it.
                self.cuda_total = float(torch.cuda.get_device_properties(device).total_memory)
                out[keys.CUDA_TOTAL] = self.cuda_total
            return out
        rss = process_rss()
        return {keys.RSS: float(rss)} if rss is not None else {}


def breakdown(torch, model, optimizers) -> dict:
    """Bytes held by parameters, gradients and optimizer state (host-side arithmetic)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    state = 0
    for opt in optimizers:
        for per_param in opt.state.values():
            for value in per_param.values():
                if isinstance(value, torch.Tensor):
                    state += value.numel() * value.element_size()
    return {keys.PARAMS_BYTES: float(params), keys.GRADS_BYTES: float(grads), keys.OPTIMIZER_STATE_BYTES: float(state)}
