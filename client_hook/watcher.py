"""Gradient, learning-rate, memory and AMP capture for ``Run.watch``.

Everything here runs on the training thread at each optimizer step (or after each
backward pass when there is no optimizer), so it only launches device work: fused
norms, a stack, and host-side counters. Nothing calls ``.item()``; the values are read
off the device later, in batches, by the sender thread.
"""

from __future__ import annotations

import os
from typing import Any

from gradwatch.capture.layer_signals import LayerSignals
from gradwatch.capture.step_timer import StepTimer
from gradwatch.capture.system_metrics import SystemMetrics
from gradwatch.values import defer_vector

GRAD_VECTOR = "grad"
# Update ratios and output RMS every 10th step: every step costs up to ~25 % on small layers (docs/alerts.md).
DEFAULT_SIGNALS_EVERY = 10


class Watcher:
    """Hooks one model (and optionally its optimizer and GradScaler) into a run.

    Args:
        recorder: the run's ``Recorder`` (``run.recorder``): what captures are handed to.
        model, optimizer, scaler, every: see ``Run.watch``.
    """

    def __init__(
        self,
        recorder,
        model,
        optimizer=None,
        scaler=None,
        every: int = 1,
        signals: bool = True,
        signals_every: int | None = None,
        on_nan: str | None = None,
        batch_size: int | None = None,
        system_every: float | None = None,
    ):
        import torch

        self.every = max(1, int(every))
        self._calls = 0
        self.torch = torch
        self.recorder = recorder
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        # Every parameter, in registration order; which of them train is read at each capture, so a
        # layer frozen (or unfrozen) after watch() is simply not (or again) reported.
        self.params = list(model.named_parameters())
        self.names = [n for n, p in self.params if p.requires_grad]
        self.device = next((p.device for _, p in self.params), torch.device("cpu"))
        self.handles: list = []
        self._pending_backward = False
        self._last_breakdown_step = -(10**9)
        self._trainable_ids: tuple = ()
        self._hooked: set = set()
        self._forward_order: dict = {}
        self._cuda_total: float | None = None
        # Forward pre-hooks noting the order layers run in; removed at the first capture.
        self.order_handles = self._hook_forward_order(model)
        if optimizer is not None:
            self.handles.append(optimizer.register_step_pre_hook(self._on_optimizer_step))
            self._report_unoptimized()
        else:
            self._hook_new_trainables()
        if scaler is not None:
            self._wrap_scaler_update(scaler)
        self.signals = self.timer = None
        self.signals_args = (signals, signals_every or max(every, DEFAULT_SIGNALS_EVERY), on_nan, batch_size)
        if optimizer is not None:
            self.start_optimizer_signals(optimizer)
        # CPU, RAM, disk, network and GPU counters on a thread of their own (capture/system_metrics.py).
        self.system = SystemMetrics(recorder, system_every) if system_every else None

    def start_optimizer_signals(self, optimizer) -> None:
        """Update ratios, output RMS, NaN provenance and the step timer: they need an optimizer's step (once)."""
        if self.timer is not None:
            return
        signals, every, on_nan, batch_size = self.signals_args
        if signals:  # capture/layer_signals.py
            trainable = lambda: [(n, p) for n, p in self.params if p.requires_grad]  # noqa: E731
            self.signals = LayerSignals(
                self.recorder, self.model, optimizer, every, trainable, self.scaler, on_nan, self._step_now
            )
        # Step time, data-loader wait and throughput (capture/step_timer.py): host clocks, at each optimizer step.
        self.timer = StepTimer(self.recorder, self.model, optimizer, batch_size, step_now=self._step_now)

    def _hook_new_trainables(self) -> None:
        """Without an optimizer, capture when gradients are ready: hook every trainable parameter once."""
        for _, p in self.params:
            if p.requires_grad and id(p) not in self._hooked:
                self._hooked.add(id(p))
                self.handles.append(p.register_post_accumulate_grad_hook(self._on_grad_ready))

    # -- layer order ----------------------------------------------------------------------
    def _hook_forward_order(self, model) -> list:
        """Note the order modules first run in (until the first capture), for an input-to-output layout."""
        handles = []
        for path, module in model.named_modules():
            if path == "" or next(module.parameters(recurse=False), None) is not None:

                def seen(mod, args, path=path):
                    self._forward_order.setdefault(path, len(self._forward_order))

                handles.append(module.register_forward_pre_hook(seen))
        return handles

    def _execution_order(self) -> list:
        """Parameters in the order their modules ran in the first forward pass; registration order for
        ties and as the fallback. A module that never ran itself (its parent used its weights, like
        MultiheadAttention's out_proj) sits with its nearest ancestor that ran; unused ones go last."""
        order = self._forward_order
        if not order:
            return self.params
        last = len(self.params) + len(order)

        def rank(item):
            index, (name, _) = item
            parts = name.split(".")[:-1]
            for cut in range(len(parts), 0, -1):
                path = ".".join(parts[:cut])
                if path in order:
                    return (order[path], index)
            return (order.get("", last) if not parts else last, index)

        return [p for _, p in sorted(enumerate(self.params), key=rank)]

    def _trainable(self) -> list:
        """The parameters that require grad right now, input side first; a new layout is sent when it changes."""
        if self.order_handles:
            for handle in self.order_handles:
                handle.remove()
            self.order_handles = []
            self.params = self._execution_order()
        trainable = [(n, p) for n, p in self.params if p.requires_grad]
        ids = tuple(id(p) for _, p in trainable)
        if ids != self._trainable_ids:
            self._trainable_ids = ids
            self.names = [n for n, _ in trainable]
            self.recorder.put_layout(GRAD_VECTOR, self.names)  # before the first record that uses it
            if self.optimizer is None:
                self._hook_new_trainables()
        return trainable

    def remove(self) -> None:
        """Detach every hook this watcher installed."""
        for handle in self.handles + self.order_handles:
            handle.remove()
        self.handles.clear()
        self.order_handles = []
        if self.signals is not None:
            self.signals.remove()
        if self.timer is not None:
            self.timer.remove()
        if self.system is not None:
            self.system.stop()
        if self.scaler is not None and "update" in vars(self.scaler):
            del self.scaler.update

    # -- hook entry points ---------------------------------------------------------------
    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.recorder.guarded(self.capture)

    def _on_grad_ready(self, param) -> None:
        # Several parameters fire per backward; capture once, when the whole pass is done.
        if not self._pending_backward:
            self._pending_backward = True
            _when_backward_ends(self.torch, self._after_backward)

    def _after_backward(self) -> None:
        self._pending_backward = False
        self.recorder.guarded(self.capture)

    # -- what is captured ----------------------------------------------------------------
    def capture(self) -> None:
        """Record gradient norms, learning rates and memory for the current step."""
        self._calls += 1
        if (self._calls - 1) % self.every:
            return
        scalars: dict[str, Any] = {}
        vectors = {}
        grads = [p.grad for _, p in self._trainable()]
        missing = [i for i, g in enumerate(grads) if g is None]
        present = [g for g in grads if g is not None]
        if present:
            norms = self._unscaled(self._norms(present))
            scalars["grad/global_norm"] = defer_vector(self.torch.linalg.vector_norm(norms))
            vectors[GRAD_VECTOR] = (defer_vector(norms), missing, len(grads))
        elif grads:
            vectors[GRAD_VECTOR] = ([], missing, len(grads))
        scalars["grad/missing_count"] = float(len(missing))
        scalars.update(self._learning_rates())
        scalars.update(self.memory())
        step = self._step_now()
        # Every 100 steps, and on the second capture too: optimizer state only exists after a step.
        if step - self._last_breakdown_step >= 100 or self._calls == 2:
            self._last_breakdown_step = step
            scalars.update(self.memory_breakdown())
        self.recorder.put_record(step, scalars, vectors)

    def _step_now(self) -> int:
        """The step a capture is recorded at: the run's next one."""
        return self.recorder.current_step()

    def _norms(self, grads):
        """One fused norm per gradient, as a single float32 vector on the first device."""
        torch = self.torch
        groups: dict = {}
        for i, g in enumerate(grads):
            groups.setdefault((g.device, g.dtype, g.is_sparse), []).append(i)
        out = [None] * len(grads)
        for (_device, _dtype, sparse), idx in groups.items():
            tensors = [grads[i] for i in idx]
            if sparse:
                norms = [t.coalesce().values().norm() for t in tensors]
            else:
                norms = _fused_norms(torch, tensors)
            for i, n in zip(idx, norms):
                out[i] = n
        target = out[0].device
        return torch.stack([n.to(device=target, dtype=torch.float32) for n in out])

    def _unscaled(self, norms):
        """Without an optimizer, hooks see AMP-scaled gradients: divide the loss scale back out.

        (With an optimizer the step pre-hook runs after GradScaler.step has unscaled them.)
        """
        scale = _loss_scale(self.scaler) if self.optimizer is None else None
        if scale is None:
            return norms
        return norms / scale.to(device=norms.device, dtype=norms.dtype)  # device op: no sync

    def _learning_rates(self) -> dict:
        if self.optimizer is None:
            return {}
        groups = self.optimizer.param_groups
        rates = {}
        for i, group in enumerate(groups):
            lr = group.get("lr")
            if lr is None:
                continue
            key = "lr" if len(groups) == 1 else f"lr/{i}"
            rates[key] = defer_vector(lr.detach().reshape(())) if hasattr(lr, "detach") else float(lr)
        return rates

    def memory(self) -> dict:
        """Device (or process) memory counters, read without syncing the device."""
        torch = self.torch
        if self.device.type == "cuda":
            # These are host-side allocator counters: reading them does not sync the device.
            out = {
                "memory/cuda_allocated": float(torch.cuda.memory_allocated(self.device)),
                "memory/cuda_reserved": float(torch.cuda.memory_reserved(self.device)),
                "memory/cuda_peak": float(torch.cuda.max_memory_allocated(self.device)),
            }
            if self._cuda_total is None:
                # The device's capacity, once (init() does not touch CUDA, so the run's metadata may lack
                # it): the server's memory_pressure rule measures reserved memory against it.
                self._cuda_total = float(torch.cuda.get_device_properties(self.device).total_memory)
                out["memory/cuda_total"] = self._cuda_total
            return out
        rss = process_rss()
        return {"memory/rss": float(rss)} if rss is not None else {}

    def memory_breakdown(self) -> dict:
        """Bytes held by parameters, gradients and optimizer state (host-side arithmetic)."""
        torch = self.torch
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        grads = sum(p.grad.numel() * p.grad.element_size() for p in self.model.parameters() if p.grad is not None)
        state = 0
        if self.optimizer is not None:
            for per_param in self.optimizer.state.values():
                for value in per_param.values():
                    if isinstance(value, torch.Tensor):
                        state += value.numel() * value.element_size()
        return {"memory/params": float(params), "memory/grads": float(grads), "memory/optimizer_state": float(state)}

    def _report_unoptimized(self) -> None:
        """Parameters that require grad but that the optimizer does not hold never train."""
        held = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        orphans = [n for n, p in self.params if p.requires_grad and id(p) not in held]
        if orphans:
            self.recorder.put_event(
                {
                    "type": "alert",
                    "kind": "missing_gradients",
                    "severity": "warning",
                    "step": None,
                    "layer": orphans[0],
                    "value": float(len(orphans)),
                    "message": f"{len(orphans)} parameter(s) require grad but are not in the optimizer, so they "
                    f"never update: {', '.join(orphans[:8])}. Pass model.parameters() to the optimizer "
                    "or set requires_grad=False on purpose-frozen layers.",
                }
            )

    def _wrap_scaler_update(self, scaler) -> None:
        """Record the loss scale after every GradScaler.update (a drop means a skipped step)."""
        original = scaler.update

        def update(*args, **kwargs):
            result = original(*args, **kwargs)
            self.recorder.guarded(self._record_scale)
            return result

        scaler.update = update

    def _record_scale(self) -> None:
        scale = _loss_scale(self.scaler)
        if scale is None:
            return
        self.recorder.put_record(self._step_now(), {"amp/scale": defer_vector(scale.detach().clone().reshape(()))}, {})


# -- torch internals, each behind one helper: there is no public API for what they do ----------------
def _fused_norms(torch, tensors: list) -> list:
    """One norm per tensor in a single fused kernel launch per device and dtype.

    ``torch.nn.utils.get_total_norm`` uses this internally but returns only the total; the
    per-tensor norms have no public multi-tensor entry point.
    """
    return torch._foreach_norm(tensors)


def _when_backward_ends(torch, fn) -> None:
    """Call ``fn`` once the whole backward pass is done (from inside a gradient hook).

    Autograd has no public "backward finished" hook; this is the engine callback that
    ``torch.nn.parallel.DistributedDataParallel`` relies on too.
    """
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def _loss_scale(scaler):
    """A GradScaler's current scale as a device tensor, or None (no scaler, disabled, or before its first step).

    ``GradScaler.get_scale()`` is the public way, but it copies the scale to the host: a device sync at
    every step. The tensor itself (and the enabled flag, read with it for the same reason) is only ``_scale``.
    """
    if scaler is None or not getattr(scaler, "_enabled", True):
        return None
    return getattr(scaler, "_scale", None)


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
