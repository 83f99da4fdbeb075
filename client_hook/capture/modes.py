"""When a ``Watcher`` captures: one small object per way of knowing that the gradients are ready.

- ``AtOptimizerStep``: ``watch(model, optimizer)``: when the step's gradients are final, before the script
  clips them (at ``clip_grad_norm_``, else the optimizer's pre-step; the post-step for ``step(closure)``).
- ``AfterBackward``: ``watch(model)``: when each backward pass ends (hooks on the parameters); the
  gradients are still AMP-scaled there, so the loss scale is divided back out (a device op, no sync).
- ``Driven``: a framework calls ``capture_at(step)``; with ``pre_clip`` the norms are read when each
  backward ends, before the framework clips, and the clipped global norm is kept beside them.

A mode drives anything with a ``Watcher``'s surface (``capture()``, ``trainable()``, ``params``, ``optimizers``,
``clock``, ``recorder``, ``torch``): ``media/layer_histograms.py`` is driven by one too, with its own ``every``.
"""

from __future__ import annotations

from gradwatch.capture import clipping
from gradwatch.capture.norms import fused_norms, loss_scale, when_backward_ends


class AtOptimizerStep:
    """Capture when the step's gradients are final, before anything clips them, every ``every``-th step.

    That is the first of: ``clip_grad_norm_`` being called on the model's gradients (``capture/clipping.py``:
    then the clipped norms follow from its factor), the optimizer's pre-step hook, or, for
    ``optimizer.step(closure)``, its post-step hook (the gradients of the closure's last backward).
    """

    waits = True  # the part is recorded when the training step ends (with the other models' parts)

    def __init__(self, every: int = 1):
        self.every, self.subscription, self.watcher = every, None, None
        self.part = None  # this training step's capture
        self.ids: list = []  # ids of the parameters whose norms the part holds, in its order

    def start(self, watcher) -> None:
        self.watcher = watcher
        opt = watcher.optimizers[0]
        watcher.clock.attach(opt)
        self.subscription = watcher.clock.subscribe(
            before=self._before_step, after=self._after_step, every=self.every, optimizer=opt
        )
        self.end = watcher.clock.on_step_end(self._step_ended)
        clipping.listen(self)

    def _capture(self) -> None:
        self.part = self.watcher.capture()
        self.ids = [id(p) for _, p in self.watcher.trainable() if p.grad is not None]

    def _before_step(self, step: int) -> None:
        if self.part is None and not self.watcher.clock.closure:
            self._capture()

    def _after_step(self, step: int) -> None:
        if self.part is None:  # step(closure): the closure's last backward made this step's gradients
            self._capture()

    def _step_ended(self, step: int, skipped: bool) -> None:
        self.part = None

    # -- clip_grad_norm_ (capture/clipping.py) -----------------------------------------------------
    def before(self, params, max_norm) -> None:
        """The script is about to clip: if these are this model's gradients, capture them as they are."""
        if not self.subscription.due or not self._mine(params):
            return
        self.watcher.clock.about_to_step(self.watcher.optimizers[0])
        if self.part is None or self.watcher.clock.closure:  # in a closure the last backward's gradients count
            self.watcher.recorder.guarded(self._capture)

    def after(self, params, max_norm, total) -> None:
        """It clipped: the norms that reach the optimizer are the captured ones times its factor."""
        part = self.part
        if part is None or part.norms is None or not self._mine(params):
            return

        def derive():
            torch = self.watcher.torch
            factor = clipping.clip_factor(torch, max_norm, total).to(part.norms.device)
            clipped = set(map(id, params))
            hit = [i in clipped for i in self.ids]
            before = part.clipped if part.clipped is not None else part.norms
            if all(hit):
                part.clipped = before * factor
            else:
                mask = torch.tensor(hit, device=before.device)
                part.clipped = torch.where(mask, before * factor, before)
            part.threshold = float(max_norm)

        self.watcher.recorder.guarded(derive)

    def _mine(self, params) -> bool:
        ids = {id(p) for _, p in self.watcher.params}
        return any(id(p) in ids for p in params)

    def new_trainables(self, watcher) -> None:
        """Nothing to hook: the optimizer step (or the clip) says when."""

    def norms(self, watcher, grads):
        """GradScaler unscales before clipping and before the optimizer steps: read them as they are."""
        return fused_norms(watcher.torch, grads)

    def stop(self) -> None:
        clipping.unlisten(self)
        if self.subscription is not None:
            self.subscription.remove()
            if self.end in self.watcher.clock.ends:
                self.watcher.clock.ends.remove(self.end)


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

    waits = False

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

    waits = False

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
