"""When a ``Watcher`` captures: one small object per way of knowing that the gradients are ready.

- ``AtOptimizerStep``: ``watch(model, optimizer)``: before each optimizer step, from the run's step clock.
- ``AfterBackward``: ``watch(model)``: when each backward pass ends (hooks on the parameters); the
  gradients are still AMP-scaled there, so the loss scale is divided back out (a device op, no sync).
- ``Driven``: a framework calls ``capture_at(step)``; with ``pre_clip`` the norms are read when each
  backward ends, before the framework clips, and the clipped global norm is kept beside them.
"""

from __future__ import annotations

from gradwatch.capture.norms import fused_norms, loss_scale, when_backward_ends


class AtOptimizerStep:
    """Capture at the run clock's pre-step of the optimizers, every ``every``-th step."""

    def __init__(self, every: int = 1):
        self.every, self.subscription = every, None

    def start(self, watcher) -> None:
        for opt in watcher.optimizers:
            watcher.clock.attach(opt)
        self.subscription = watcher.clock.on_before(lambda step: watcher.capture(), every=self.every)

    def new_trainables(self, watcher) -> None:
        """Nothing to hook: the optimizer step says when."""

    def norms(self, watcher, grads):
        """The step pre-hook runs after GradScaler.step has unscaled the gradients: read them as they are."""
        return fused_norms(watcher.torch, grads)

    def stop(self) -> None:
        if self.subscription is not None:
            self.subscription.remove()


class _BackwardHooks:
    """Post-accumulate-grad hooks on every trainable parameter, calling ``ended()`` once per backward pass."""

    def __init__(self):
        self.hooked: set = set()
        self.handles: list = []
        self.pending = False

    def hook(self, watcher, ended) -> None:
        for _, p in watcher.params:
            if p.requires_grad and id(p) not in self.hooked:
                self.hooked.add(id(p))
                self.handles.append(p.register_post_accumulate_grad_hook(lambda p: self._ready(watcher, ended)))

    def _ready(self, watcher, ended) -> None:
        # Several parameters fire per backward; act once, when the whole pass is done.
        if not self.pending:
            self.pending = True
            when_backward_ends(watcher.torch, lambda: self._end(watcher, ended))

    def _end(self, watcher, ended) -> None:
        self.pending = False
        watcher.recorder.guarded(ended)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.hooked.clear()


class AfterBackward(_BackwardHooks):
    """Capture when each backward pass ends, every ``every``-th pass."""

    def __init__(self, every: int = 1):
        super().__init__()
        self.every, self.calls, self.watcher = every, 0, None

    def start(self, watcher) -> None:
        self.watcher = watcher
        self.new_trainables(watcher)

    def new_trainables(self, watcher) -> None:
        self.hook(watcher, self._ended)

    def _ended(self) -> None:
        self.calls += 1
        if (self.calls - 1) % self.every == 0:
            self.watcher.capture()

    def norms(self, watcher, grads):
        """Hooks see AMP-scaled gradients: divide the loss scale back out (a device op: no sync)."""
        norms = fused_norms(watcher.torch, grads)
        scale = loss_scale(watcher.scaler)
        return norms if scale is None else norms / scale.to(device=norms.device, dtype=norms.dtype)

    def stop(self) -> None:
        self.remove()


class Driven(_BackwardHooks):
    """A framework says when (``Watcher.capture``); with ``pre_clip`` the norms come from the last backward's end.

    Args:
        pre_clip: the framework clips before its hook: note the norms when each backward ends.
    """

    def __init__(self, pre_clip: bool = False):
        super().__init__()
        self.pre_clip = pre_clip
        self.noted = None  # (ids of the gradients, their norms) when the last backward ended
        self.clipped = None  # the global norm at the capture, after the framework clipped

    def start(self, watcher) -> None:
        self.new_trainables(watcher)

    def new_trainables(self, watcher) -> None:
        if self.pre_clip:
            self.hook(watcher, lambda: self._note(watcher))

    def _note(self, watcher) -> None:
        grads = [p.grad for _, p in watcher.trainable() if p.grad is not None]
        self.noted = (tuple(map(id, grads)), fused_norms(watcher.torch, grads)) if grads else None

    def norms(self, watcher, grads):
        """The norms noted when backward ended (the same gradients, before clipping), else the ones now."""
        noted, self.noted = self.noted, None
        now = fused_norms(watcher.torch, grads)
        if noted is None or noted[0] != tuple(map(id, grads)):
            return now
        self.clipped = watcher.torch.linalg.vector_norm(now)
        scale = loss_scale(watcher.scaler or watcher.wrapped_scaler())
        # Backward ended before AMP unscaled them; frameworks unscale before their hook (``now`` is unscaled).
        return noted[1] if scale is None else noted[1] / scale.to(device=noted[1].device, dtype=noted[1].dtype)

    def take_clipped(self):
        """The clipped global norm of the last capture, once."""
        clipped, self.clipped = self.clipped, None
        return clipped

    def stop(self) -> None:
        self.remove()
