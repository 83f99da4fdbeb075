"""A ``Watcher`` that frameworks drive: it captures when told, at the step they give it.

Lightning and the Hugging Face ``Trainer`` have a hook between "gradients are ready (unscaled)"
and "the optimizer steps": capturing there, instead of on ``optimizer.step`` or after backward,
sees unscaled gradients, skips accumulation micro-batches, and covers every optimizer at once.

The Hugging Face ``Trainer`` clips before its hook, so there the watcher also reads the norms when
each backward pass ends (``pre_clip=True``) and reports those: the gradient the model produced,
with the clipped global norm beside it (``grad/global_norm_clipped``).
"""

from __future__ import annotations

from gradwatch.values import defer_vector
from gradwatch.watcher import Watcher

CLIPPED = "grad/global_norm_clipped"  # the global norm the optimizer got, beside the pre-clip grad/global_norm


class StepWatcher(Watcher):
    """Per-layer and global gradient norms, LRs of every optimizer, memory: on ``capture_at(step)``.

    Args:
        recorder: the run's ``Recorder`` (``run.recorder``).
        model, optimizers, scaler: what the framework trains with (optimizers may come later).
        pre_clip: the framework clips before its hook: read the norms when backward ends instead,
            and record the clipped global norm as ``grad/global_norm_clipped`` when ``clipping``.
        clipping: whether the framework clips (only then is the clipped norm recorded).
        signals, signals_every, system_every: as for ``Run.watch``; update ratios, output RMS and the
            step timer follow the first optimizer, from when it is known.
    """

    def __init__(
        self,
        recorder,
        model,
        optimizers=(),
        scaler=None,
        *,
        pre_clip=False,
        clipping=False,
        signals: bool = True,
        signals_every: int | None = None,
        system_every: float | None = 5.0,
    ):
        self.step: int | None = None
        self.optimizers: list = []
        self._wrapped: list = []
        self.pre_clip, self.clipping = pre_clip, clipping
        self._pre = None  # (ids of the gradients, their norms) when the last backward ended
        self._clipped = None  # the global norm at the hook, after the framework clipped
        super().__init__(
            recorder, model, None, scaler, signals=signals, signals_every=signals_every, system_every=system_every
        )
        self.set_optimizers(optimizers)

    def set_optimizers(self, optimizers) -> None:
        """The optimizers whose LRs and state are recorded (some frameworks create them late)."""
        self._wrapped = [o for o in optimizers if o is not None]
        self.optimizers = [getattr(o, "optimizer", o) for o in self._wrapped]  # unwrap accelerate's
        if self.optimizers:
            self._report_orphans()
            self.start_optimizer_signals(self.optimizers[0])

    def capture_at(self, step: int) -> None:
        """Record gradients, learning rates and memory for ``step``; never raises into training."""
        self.step = int(step)
        self.recorder.guarded(self.capture)
        clipped, self._clipped = self._clipped, None
        if clipped is not None and self.clipping:
            self.recorder.put_record(self.step, {CLIPPED: defer_vector(clipped)}, {})

    def _step_now(self) -> int:
        """The framework's step (the run's next one before the first ``capture_at``)."""
        return self.step if self.step is not None else super()._step_now()

    def record_clipped(self, step: int) -> None:
        """Record the global norm of the gradients as they are now (after the framework clipped them)."""

        def measure():
            grads = [p.grad for _, p in self._trainable() if p.grad is not None]
            if grads:
                norm = self.torch.linalg.vector_norm(super(StepWatcher, self)._norms(grads))
                self.recorder.put_record(int(step), {CLIPPED: defer_vector(norm)}, {})

        self.recorder.guarded(measure)

    def _hook_new_trainables(self) -> None:
        """Per-parameter hooks only for ``pre_clip``: otherwise the framework says when gradients are ready."""
        if self.pre_clip:
            super()._hook_new_trainables()

    def _after_backward(self) -> None:
        """A backward pass ended: note the norms before anyone clips them (recorded at ``capture_at``)."""
        self._pending_backward = False
        self.recorder.guarded(self._note_pre_clip)

    def _note_pre_clip(self) -> None:
        grads = [p.grad for _, p in self._trainable() if p.grad is not None]
        self._pre = (tuple(map(id, grads)), super()._norms(grads)) if grads else None

    def _norms(self, grads):
        """The norms noted when backward ended (the same gradients, before clipping), else the ones now."""
        pre, self._pre = self._pre, None
        if pre is None or pre[0] != tuple(map(id, grads)):
            return super()._norms(grads)
        self._clipped = self.torch.linalg.vector_norm(super()._norms(grads))
        scale = self._loss_scale()
        return pre[1] / scale if scale is not None else pre[1]  # backward ended before AMP unscaled them

    def _loss_scale(self) -> float | None:
        """The AMP loss scale the last backward ran under (accelerate's optimizer holds the scaler)."""
        scaler = self.scaler or next((s for o in self._wrapped if (s := getattr(o, "scaler", None))), None)
        if scaler is None or not scaler.is_enabled():
            return None
        return scaler.get_scale()  # a sync, like accelerate's own skipped-step check at every step

    def _unscaled(self, norms):
        return norms  # both frameworks unscale AMP gradients before their pre-step hook

    def _learning_rates(self) -> dict:
        rates = {}
        many = len(self.optimizers) > 1
        for i, opt in enumerate(self.optimizers):
            groups = opt.param_groups
            for g, group in enumerate(groups):
                lr = group.get("lr")
                if lr is None:
                    continue
                parts = ([str(i)] if many else []) + ([str(g)] if len(groups) > 1 else [])
                key = "lr/" + ".".join(parts) if parts else "lr"
                rates[key] = defer_vector(lr.detach().reshape(())) if hasattr(lr, "detach") else float(lr)
        return rates

    def memory_breakdown(self) -> dict:
        out = super().memory_breakdown()
        torch = self.torch
        state = 0
        for opt in self.optimizers:
            for per_param in opt.state.values():
                for value in per_param.values():
                    if isinstance(value, torch.Tensor):
                        state += value.numel() * value.element_size()
        out["memory/optimizer_state"] = float(state)
        return out

    def _report_orphans(self) -> None:
        """Trainable parameters that no optimizer holds (reported once, like ``run.watch``)."""

        class _Union:
            param_groups = [g for o in self.optimizers for g in o.param_groups]

        self.optimizer = _Union()
        try:
            self._report_unoptimized()
        finally:
            self.optimizer = None
