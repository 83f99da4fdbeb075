"""``watch(..., histograms=True)``: per-parameter gradient and weight histograms (TensorBoard's "Distributions",
W&B's ``watch(log="all")``), bounded in bytes per step.

They are captured when ``watch()`` reads its gradient norms (``capture/modes.py``), every ``every``-th time:
with an optimizer, when the step's gradients are final, before anything clips them (``clip_grad_norm_``,
else the optimizer's pre-step: after the last backward of an accumulation); without one, when a backward
pass ends (once a step: the first pass of a step counts). No hook per parameter is added with an
optimizer, and nothing runs on the steps that are not sampled but the clock's counter. A parameter
whose ``.grad`` is None then (not used in the step's backward) gets neither histogram.

A capture is one ``HistogramGroup``: CPU tensors copied into a matrix per sample shape and binned together
on the sender thread, device tensors stacked and binned on their device: no host-device sync either way
(a client without numpy sends a ``Histogram`` per tensor instead).
A parameter of more than ``SAMPLE`` values is binned from a sample of them (evenly spaced runs of
consecutive values, counts scaled back): the shape of the distribution for a small fixed cost; a lone
NaN may fall outside the sample, and the gradient norms (which read every value) raise the NaN alerts.
"""

from __future__ import annotations

import sys

from gradwatch import protocol
from gradwatch.capture.board import Part
from gradwatch.capture.modes import AfterBackward, AtOptimizerStep
from gradwatch.media import limits, route
from gradwatch.media.histogram import Histogram
from gradwatch.media.histogram_group import HistogramGroup
from gradwatch.step_clock import clock_of

GRAD_PREFIX = "gradients/"  # W&B's names: gradients/<parameter>, parameters/<parameter>
PARAM_PREFIX = "parameters/"
WHICH = {"gradients": ("grad",), "parameters": ("param",), "all": ("grad", "param")}
MAX_PARAMETERS = 256  # parameters histogrammed per model (the largest first past that): bounds bytes per step
SAMPLE = 4096  # values binned per parameter: a sample of bigger ones (the 5 % budget, #29)


class LayerHistograms:
    """Histograms of a model's gradients and/or weights every ``every``-th optimizer step (backward pass).

    It is driven by a capture mode as a ``Watcher`` is (``capture``, ``trainable``, ``params``,
    ``optimizers``, ``clock``, ``recorder``), with its own ``every``.

    Args:
        recorder: the run's ``Recorder`` (where the histograms go, at the clock's step).
        model: the ``torch.nn.Module``.
        log: "gradients", "parameters" or "all".
        every: every N-th optimizer step of ``optimizer`` (without one, every N-th backward pass; 1 = all).
        bins: bins per histogram.
        optimizer: the model's optimizer, or None.
    """

    def __init__(
        self, recorder, model, log: str = "gradients", every: int = 1, bins: int = limits.DEFAULT_BINS, optimizer=None
    ):
        import torch

        if log not in WHICH:
            raise ValueError(f"histograms must be one of {', '.join(WHICH)}, got {log!r}")
        self.torch, self.recorder, self.model, self.which, self.bins = torch, recorder, model, WHICH[log], bins
        self.clock = clock_of(recorder)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if len(named) > MAX_PARAMETERS:
            recorder.warn_once(
                "histograms:many",
                f"gradwatch: histograms of the {MAX_PARAMETERS} largest of {len(named)} parameters only (bytes per step)",
            )
            named = sorted(named, key=lambda item: -item[1].numel())[:MAX_PARAMETERS]
        self.params = [(n, p) for n, p in named if _valid(recorder, n)]
        self.keys = [(GRAD_PREFIX + n, PARAM_PREFIX + n) for n, _ in self.params]
        self.optimizers = [optimizer] if optimizer is not None else []
        self.taken: int | None = None  # the step captured last: once per step (a second backward of it is skipped)
        self.mode = AtOptimizerStep(every) if optimizer is not None else AfterBackward(every)
        self.mode.start(self)

    def trainable(self) -> list:
        """What the capture mode asks of a watcher; the norms are the watcher's."""
        return []

    def capture(self) -> Part:
        """Histograms of every hooked parameter that has a gradient now, at the clock's step."""
        step = self.clock.step
        if self.recorder.finished or (self.taken == step and not self.optimizers):
            return Part([], None, [])
        self.taken = step
        tensors = []
        grads, weights = "grad" in self.which, "param" in self.which
        for (grad_key, param_key), (_name, param) in zip(self.keys, self.params):
            grad = param.grad
            if grad is None:
                continue
            if grads:
                tensors.append((grad_key, grad))
            if weights:
                tensors.append((param_key, param))
        if tensors and sys.modules.get("numpy") is None:  # torch without numpy: one Histogram each, as before
            route.put(self.recorder, step, {k: Histogram(t, num_bins=self.bins, sample=SAMPLE) for k, t in tensors})
        elif tensors:
            route.put(self.recorder, step, {tensors[0][0]: HistogramGroup(tensors, self.bins, SAMPLE)})
        return Part([], None, [])

    def remove(self) -> None:
        """Stop capturing (unhook the backward hooks, if any)."""
        self.mode.stop()


def _valid(recorder, name: str) -> bool:
    """Whether a parameter's histogram keys can be sent (one warning line for one that cannot)."""
    try:
        protocol.check_key(GRAD_PREFIX + name)
        protocol.check_key(PARAM_PREFIX + name)
    except protocol.ProtocolError as exc:
        recorder.warn_once(f"key:{name}", f"gradwatch: no histograms of {name!r}: {exc}")
        return False
    return True
