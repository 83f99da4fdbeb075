"""Gradient, learning-rate, memory and AMP capture for ``Run.watch``.

Everything here runs on the training thread at each optimizer step (or after each
backward pass when there is no optimizer), so it only launches device work: fused
norms, a stack, and host-side counters. Nothing calls ``.item()``; the values are read
off the device later, in batches, by the sender thread. When a capture happens is the
capture mode's business (``capture/modes.py``); the step it is recorded at is the run's clock's.
"""

from __future__ import annotations

from gradwatch.capture import memory
from gradwatch.capture.board import Part, board_of
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
        name: the model's name in a run that watches several: its layers are ``<name>.<parameter>``.
        timer: time the optimizer's steps (``perf/*``; one watcher per run does).
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
        name: str | None = None,
        timer: bool = True,
    ):
        import torch

        self.torch, self.recorder, self.model, self.scaler = torch, recorder, model, scaler
        self.clock, self.board = clock_of(recorder), board_of(recorder)
        self.label, self.prefix = (str(name), f"{name}.") if name else ("", "")
        self.optimizers = [optimizer] if optimizer is not None else []
        self.wrapped: list = []  # the optimizers as a framework handed them (accelerate's wrappers hold the scaler)
        every = max(1, int(every))
        self.mode = mode or (AtOptimizerStep(every) if optimizer is not None else AfterBackward(every))
        # Every parameter, in registration order; which of them train is read at each capture, so a
        # layer frozen (or unfrozen) after watch() is simply not (or again) reported.
        self.params = list(model.named_parameters())
        self.names = [self.prefix + n for n, p in self.params if p.requires_grad]
        self.device = next((p.device for _, p in self.params), torch.device("cpu"))
        self.captures = 0
        self._last_breakdown_step = -(10**9)
        self._trainable_ids: tuple = ()
        self._forward_order: dict = {}
        self.counters = memory.MemoryCounters(torch)
        if scaler is not None:  # the loss scale after every GradScaler.update (a drop: a skipped step)
            self.clock.attach_scaler(scaler)
            self.clock.on_scale_update(self._record_scale)
        # Forward pre-hooks noting the order layers run in; removed at the first capture.
        self.order_handles = self._hook_forward_order(model)
        self.signals = self.timer = None
        self.signals_args = (signals, signals_every or max(every, DEFAULT_SIGNALS_EVERY), on_nan, batch_size, timer)
        self.board.join(self)
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
        signals, every, on_nan, batch_size, timer = self.signals_args
        if signals:  # capture/layer_signals.py
            self.signals = LayerSignals(
                self.recorder, self.model, optimizer, every, self.trainable, self.scaler, on_nan
            )
        # Step time, data-loader wait and throughput (capture/step_timer.py): host clocks, at each optimizer step.
        self.timer = StepTimer(self.recorder, self.model, batch_size, optimizer=optimizer) if timer else False

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
            self.names = [self.prefix + n for n, _ in trainable]  # the board sends the run's layout
            self.mode.new_trainables(self)
        return trainable

    def remove(self) -> None:
        """Detach every hook this watcher installed."""
        self.mode.stop()
        self.board.leave(self)
        for handle in self.order_handles:
            handle.remove()
        self.order_handles = []
        for part in (self.signals, self.timer):
            if part:
                part.remove()
        if self.system is not None:
            self.system.stop()
        if self._record_scale in self.clock.scale_updates:
            self.clock.scale_updates.remove(self._record_scale)

    # -- what is captured ----------------------------------------------------------------
    def capture(self) -> Part:
        """Capture gradient norms, learning rates and memory for the current step (handed to the run's board)."""
        self.captures += 1
        grads = [p.grad for _, p in self.trainable()]
        present = [g for g in grads if g is not None]
        part = Part(list(self.names), self.mode.norms(self, present) if present else None, [])
        part.missing = [i for i, g in enumerate(grads) if g is None]
        part.scalars[keys.MISSING_COUNT] = float(len(part.missing))
        part.scalars.update(self.learning_rates())
        part.scalars.update(self.memory())
        step = self.clock.step
        # Every 100 steps, and on the second capture too: optimizer state only exists after a step.
        if step - self._last_breakdown_step >= 100 or self.captures == 2:
            self._last_breakdown_step = step
            part.scalars.update(self.memory_breakdown())
        self.board.put(self, step, part, wait=self.mode.waits)
        return part

    def learning_rates(self) -> dict:
        """``lr``, or ``lr/<group>`` per group; groups that all share one host rate are one ``lr``.

        Several optimizers: ``lr/<optimizer>.<group>``; in a run of several models, ``lr/<model>...``.
        Rates held as tensors are read without a sync (so never merged)."""
        rates: dict = {}
        owner = [self.label] if self.label and len(self.board.watchers) > 1 else []
        many = len(self.optimizers) > 1
        for i, opt in enumerate(self.optimizers):
            groups = [(g, group.get("lr")) for g, group in enumerate(opt.param_groups) if group.get("lr") is not None]
            for label, lr in _distinct(groups):
                parts = owner + ([str(i)] if many else []) + ([label] if label else [])
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

    def _record_scale(self, step: int, scaler) -> None:
        """After a GradScaler.update: its new scale, at the step it concluded (one watcher per scaler records)."""
        first = next((w for w in self.board.watchers if w.scaler is scaler), self)
        scale = loss_scale(self.scaler)
        if scaler is self.scaler and first is self and scale is not None:
            scale = defer_vector(scale.detach().clone().reshape(()))
            self.recorder.put_record(step, {keys.AMP_SCALE: scale}, {})


def _distinct(groups: list) -> list:
    """[(key part, lr)]: "" for one group or groups that all share one host rate, else one per group."""
    if len(groups) <= 1:
        return [("", lr) for _, lr in groups]
    if all(not hasattr(lr, "detach") for _, lr in groups) and len({float(lr) for _, lr in groups}) == 1:
        return [("", groups[0][1])]
    return [(str(g), lr) for g, lr in groups]
