"""A ``Watcher`` that frameworks drive: it captures when told, at the step they give it.

Lightning and the Hugging Face ``Trainer`` have a hook between "gradients are ready (unscaled)"
and "the optimizer steps": capturing there, instead of on ``optimizer.step`` or after backward,
sees unscaled gradients, skips accumulation micro-batches, and covers every optimizer at once.

The Hugging Face ``Trainer`` clips before its hook, so there the watcher also reads the norms when
each backward pass ends (``pre_clip=True``) and reports those: the gradient the model produced,
with the clipped global norm beside it (``grad/global_norm_clipped``).
"""

from __future__ import annotations

from gradwatch.capture.modes import Driven
from gradwatch.capture.norms import fused_norms
from gradwatch.contract import keys
from gradwatch.values import defer_vector
from gradwatch.watcher import Watcher

CLIPPED = keys.GLOBAL_NORM_CLIPPED  # the global norm the optimizer got, beside the pre-clip grad/global_norm


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
        self.clipping = clipping
        super().__init__(
            recorder,
            model,
            None,
            scaler,
            signals=signals,
            signals_every=signals_every,
            system_every=system_every,
            mode=Driven(pre_clip),
        )
        self.set_optimizers(optimizers)

    def set_optimizers(self, optimizers) -> None:
        """The optimizers whose LRs and state are recorded (some frameworks create them late)."""
        self.wrapped = [o for o in optimizers if o is not None]
        self.optimizers = [getattr(o, "optimizer", o) for o in self.wrapped]  # unwrap accelerate's
        if self.optimizers:
            self.report_unoptimized()
            self.start_optimizer_signals(self.optimizers[0])

    def capture_at(self, step: int) -> None:
        """Record gradients, learning rates and memory for ``step``; never raises into training."""
        self.clock.pin(step)
        self.recorder.guarded(self.capture)
        clipped = self.mode.take_clipped()
        if clipped is not None and self.clipping:
            self.recorder.put_record(int(step), {CLIPPED: defer_vector(clipped)}, {})

    def record_clipped(self, step: int) -> None:
        """Record the global norm of the gradients as they are now (after the framework clipped them)."""

        def measure():
            grads = [p.grad for _, p in self.trainable() if p.grad is not None]
            if grads:
                norm = self.torch.linalg.vector_norm(fused_norms(self.torch, grads))
                self.recorder.put_record(int(step), {CLIPPED: defer_vector(norm)}, {})

        self.recorder.guarded(measure)
