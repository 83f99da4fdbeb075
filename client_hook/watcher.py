"""Gradient, learning-rate, memory and AMP capture for ``Run.watch``.

Everything here runs on the training thread at each optimizer step (or after each
backward pass when there is no optimizer), so it only launches device work: fused
norms, a stack, and host-side counters. Nothing calls ``.item()``; the values are read
off the device later, in batches, by the sender thread. When a capture happens is the
capture mode's business (``capture/modes.py``); the step it is recorded at is the run's clock's.
"""

from __future__ import annotations

from typing import Any

from gradwatch.capture import memory
from gradwatch.capture.layer_signals import LayerSignals
from gradwatch.capture.modes import AfterBackward, AtOptimizerStep
from gradwatch.capture.norms import loss_scale
from gradwatch.capture.step_timer import StepTimer
from gradwatch.capture.system_metrics import SystemMetrics
from gradwatch.contract import keys
from gradwatch.step_clock import clock_of
from gradwatch.values import defer_vector

GRAD_VECTOR = keys.GRAD_VECTOR
# Update ratios and output RMS every 10th step: every step costs up to ~25 % on small layers (docs/alerts.md).
DEFAULT_SIGNALS_EVERY = 10


class Watcher:
    """Hooks one model (and optionally its optimizer and GradScaler) into a run.

    Args:
        recorder: the run's ``Recorder`` (``run.recorder``): what captures are handed to.
        model, optimizer, scaler, every, signals, signals_every, on_nan, batch_size, system_every: see ``Run.watch``.
        mode: when to capture (``capture/modes.py``); default: at the optimizer step, or after backward without one.
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
        *,
        mode=None,
    ):
        import torch

        self.torch, self.recorder, self.model, self.scaler = torch, recorder, model, scaler
        self.clock = clock_of(recorder)
        self.optimizers = [optimizer] if optimizer is not None else []
        self.wrapped: list = []  # the optimizers as a framework handed them (accelerate's wrappers hold the scaler)
        every = max(1, int(every))
        self.mode = mode or (AtOptimizerStep(every) if optimizer is not None else AfterBackward(every))
        # Every parameter, in registration order; which of them train is read at each capture, so a
        # layer frozen (or unfrozen) after watch() is simply not (or again) reported.
        self.params = list(model.named_parameters())
        self.names = [n for n, p in self.params if p.requires_grad]
        self.device = next((p.device for _, p in self.params), torch.device("cpu"))
        self.captures = 0
        self._last_breakdown_step = -(10**9)
        self._trainable_ids: tuple = ()
        self._forward_order: dict = {}
        self.counters = memory.MemoryCounters(torch)
        self.scale_handle = self._wrap_scaler_update(scaler) if scaler is not None else None
        # Forward pre-hooks noting the order layers run in; removed at the first capture.
        self.order_handles = self._hook_forward_order(model)
        self.signals = self.timer = None
        self.signals_args = (signals, signals_every or max(every, DEFAULT_SIGNALS_EVERY), on_nan, batch_size)
        self.mode.start(self)
        if self.optimizers:
            self.report_unoptimized()
            self.start_optimizer_signals(optimizer)
        # CPU, RAM, disk, network and GPU counters on a thread of their own (capture/system_metrics.py).
        self.system = SystemMetrics(recorder, system_every) if system_every else None

    def start_optimizer_signals(self, optimizer) -> None:
        """Update ratios, output RMS, NaN provenance and the step timer: they need an optimizer's step (once)."""
        if self.timer is not None:
            return
        self.clock.attach(optimizer)
        signals, every, on_nan, batch_size = self.signals_args
        if signals:  # capture/layer_signals.py
            self.signals = LayerSignals(
                self.recorder, self.model, optimizer, every, self.trainable, self.scaler, on_nan
            )
        # Step time, data-loader wait and throughput (capture/step_timer.py): host clocks, at each optimizer step.
        self.timer = StepTimer(self.recorder, self.model, batch_size, optimizer=optimizer)

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

    def trainable(self) -> list:
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
            self.mode.new_trainables(self)
        return trainable

    def remove(self) -> None:
        """Detach every hook this watcher installed."""
        self.mode.stop()
        for handle in self.order_handles:
            handle.remove()
        self.order_handles = []
        for part in (self.signals, self.timer):
            if part is not None:
                part.remove()
        if self.system is not None:
            self.system.stop()
        if self.scaler is not None and "update" in vars(self.scaler):
            del self.scaler.update

    # -- what is captured ----------------------------------------------------------------
    def capture(self) -> None:
        """Record gradient norms, learning rates and memory for the current step."""
        self.captures += 1
        scalars: dict[str, Any] = {}
        vectors = {}
        grads = [p.grad for _, p in self.trainable()]
        missing = [i for i, g in enumerate(grads) if g is None]
        present = [g for g in grads if g is not None]
        if present:
            norms = self.mode.norms(self, present)
            scalars[keys.GLOBAL_NORM] = defer_vector(self.torch.linalg.vector_norm(norms))
            vectors[GRAD_VECTOR] = (defer_vector(norms), missing, len(grads))
        elif grads:
            vectors[GRAD_VECTOR] = ([], missing, len(grads))
        scalars[keys.MISSING_COUNT] = float(len(missing))
        scalars.update(self.learning_rates())
        scalars.update(self.memory())
        step = self.clock.step
        # Every 100 steps, and on the second capture too: optimizer state only exists after a step.
        if step - self._last_breakdown_step >= 100 or self.captures == 2:
            self._last_breakdown_step = step
            scalars.update(self.memory_breakdown())
        self.recorder.put_record(step, scalars, vectors)

    def learning_rates(self) -> dict:
        """``lr`` (``lr/<group>``; ``lr/<optimizer>.<group>`` with several optimizers), read without a sync."""
        rates = {}
        many = len(self.optimizers) > 1
        for i, opt in enumerate(self.optimizers):
            groups = opt.param_groups
            for g, group in enumerate(groups):
                lr = group.get("lr")
                if lr is None:
                    continue
                parts = ([str(i)] if many else []) + ([str(g)] if len(groups) > 1 else [])
                key = keys.LR_PREFIX + ".".join(parts) if parts else keys.LR
                rates[key] = defer_vector(lr.detach().reshape(())) if hasattr(lr, "detach") else float(lr)
        return rates

    def memory(self) -> dict:
        """Device (or process) memory counters, read without syncing the device."""
        return self.counters.read(self.device)

    def memory_breakdown(self) -> dict:
        """Bytes held by parameters, gradients and optimizer state (host-side arithmetic)."""
        return memory.breakdown(self.torch, self.model, self.optimizers)

    def wrapped_scaler(self):
        """The GradScaler an optimizer wrapper holds (accelerate's), when ``watch`` was given none."""
        return next((s for o in self.wrapped if (s := getattr(o, "scaler", None))), None)

    def report_unoptimized(self) -> None:
        """Parameters that require grad but that no optimizer holds never train (reported once)."""
        held = {id(p) for opt in self.optimizers for group in opt.param_groups for p in group["params"]}
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

    def _wrap_scaler_update(self, scaler):
        """Record the loss scale after every GradScaler.update (a drop means a skipped step)."""
        original = scaler.update

        def update(*args, **kwargs):
            result = original(*args, **kwargs)
            self.recorder.guarded(self._record_scale)
            return result

        scaler.update = update
        return update

    def _record_scale(self) -> None:
        scale = loss_scale(self.scaler)
        if scale is not None:
            scale = defer_vector(scale.detach().clone().reshape(()))
            self.recorder.put_record(self.clock.step, {keys.AMP_SCALE: scale}, {})
