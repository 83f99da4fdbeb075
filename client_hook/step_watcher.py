"""A ``Watcher`` that frameworks drive: it captures when told, at the step they give it.

Lightning and the Hugging Face ``Trainer`` have a hook between "gradients are ready (unscaled)"
and "the optimizer steps": capturing there, instead of on ``optimizer.step`` or after backward,
sees unscaled gradients, skips accumulation micro-batches, and covers every optimizer at once.
"""

from __future__ import annotations

from .values import defer_vector
from .watcher import Watcher


class _AtStep:
    """The run as the watcher sees it, with the framework's step instead of the run's next step."""

    def __init__(self, run, watcher: StepWatcher):
        self._run, self._watcher = run, watcher

    def __getattr__(self, name):
        return getattr(self._run, name)

    def _current_step(self) -> int:
        return self._watcher.step if self._watcher.step is not None else self._run._current_step()


class StepWatcher(Watcher):
    """Per-layer and global gradient norms, LRs of every optimizer, memory: on ``capture_at(step)``."""

    def __init__(self, run, model, optimizers=(), scaler=None):
        self.step: int | None = None
        self.optimizers: list = []
        super().__init__(_AtStep(run, self), model, None, scaler)
        self.set_optimizers(optimizers)

    def set_optimizers(self, optimizers) -> None:
        """The optimizers whose LRs and state are recorded (some frameworks create them late)."""
        self.optimizers = [getattr(o, "optimizer", o) for o in optimizers if o is not None]  # unwrap accelerate's
        if self.optimizers:
            self._report_orphans()

    def capture_at(self, step: int) -> None:
        """Record gradients, learning rates and memory for ``step``; never raises into training."""
        self.step = int(step)
        self.run._guarded(self.capture)

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
