"""A ``Watcher`` that frameworks drive: it captures when told, at the step they give it.

Lightning and the Hugging Face ``Trainer`` have a hook between "gradients are ready (unscaled)"
and "the optimizer steps": capturing there, instead of on ``optimizer.step`` or after backward,
sees unscaled gradients, skips accumulation micro-batches, and covers every optimizer at once.
"""

from __future__ import annotations

from gradwatch.values import defer_vector
from gradwatch.watcher import Watcher


class StepWatcher(Watcher):
    """Per-layer and global gradient norms, LRs of every optimizer, memory: on ``capture_at(step)``.

    Args:
        recorder: the run's ``Recorder`` (``run.recorder``).
        model, optimizers, scaler: what the framework trains with (optimizers may come later).
    """

    def __init__(self, recorder, model, optimizers=(), scaler=None):
        self.step: int | None = None
        self.optimizers: list = []
        super().__init__(recorder, model, None, scaler)
        self.set_optimizers(optimizers)

    def set_optimizers(self, optimizers) -> None:
        """The optimizers whose LRs and state are recorded (some frameworks create them late)."""
        self.optimizers = [getattr(o, "optimizer", o) for o in optimizers if o is not None]  # unwrap accelerate's
        if self.optimizers:
            self._report_orphans()

    def capture_at(self, step: int) -> None:
        """Record gradients, learning rates and memory for ``step``; never raises into training."""
        self.step = int(step)
        self.recorder.guarded(self.capture)

    def _step_now(self) -> int:
        """The framework's step (the run's next one before the first ``capture_at``)."""
        return self.step if self.step is not None else super()._step_now()

    def _hook_new_trainables(self) -> None:
        """No per-parameter hooks: the framework says when gradients are ready."""

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
