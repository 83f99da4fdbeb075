"""``watch(..., histograms=True)``: per-parameter gradient and weight histograms (TensorBoard's "Distributions",
W&B's ``watch(log="all")``), bounded in bytes per step.

Each parameter gets a post-accumulate-grad hook: when its gradient is complete (as backward produced
it, before any clipping) on a sampled backward pass, its gradient and/or weight is captured as a
``Histogram`` (a device tensor binned on its device, a CPU one copied and binned on the sender
thread): no host-device sync, and nothing but a counter on the passes that are not sampled. A
parameter of more than ``SAMPLE`` values is binned from a sample of them (evenly spaced runs of
consecutive values, counts scaled back): the shape of the distribution for a small fixed cost; a
lone NaN may fall outside the sample, and the gradient norms (which read every value) raise the NaN alerts.
"""

from __future__ import annotations

from gradwatch.media import limits, route
from gradwatch.media.histogram import Histogram

GRAD_PREFIX = "gradients/"  # W&B's names: gradients/<parameter>, parameters/<parameter>
PARAM_PREFIX = "parameters/"
WHICH = {"gradients": ("grad",), "parameters": ("param",), "all": ("grad", "param")}
MAX_PARAMETERS = 256  # parameters histogrammed per model (the largest first past that): bounds bytes per step
SAMPLE = 4096  # values binned per parameter: a sample of bigger ones (the 5 % budget, #29)


class LayerHistograms:
    """Histograms of a model's gradients and/or weights every ``every``-th backward pass.

    Args:
        recorder: the run's ``Recorder`` (where the histograms go, at its current step).
        model: the ``torch.nn.Module``.
        log: "gradients", "parameters" or "all".
        every: sample every N-th backward pass (1 = all).
        bins: bins per histogram.
    """

    def __init__(self, recorder, model, log: str = "gradients", every: int = 1, bins: int = limits.DEFAULT_BINS):
        if log not in WHICH:
            raise ValueError(f"histograms must be one of {', '.join(WHICH)}, got {log!r}")
        self.recorder, self.which, self.every, self.bins = recorder, WHICH[log], max(1, int(every)), bins
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if len(named) > MAX_PARAMETERS:
            recorder.warn_once(
                "histograms:many",
                f"gradwatch: histograms of the {MAX_PARAMETERS} largest of {len(named)} parameters only (bytes per step)",
            )
            named = sorted(named, key=lambda item: -item[1].numel())[:MAX_PARAMETERS]
        self.handles = []
        self.passes: dict[str, int] = {}
        self.taken: dict[str, int] = {}  # the step each parameter was last captured at: once per step
        for name, param in named:
            self.passes[name] = 0
            self.handles.append(param.register_post_accumulate_grad_hook(self._hook(name)))

    def _hook(self, name: str):
        grad_key, param_key = GRAD_PREFIX + name, PARAM_PREFIX + name

        def on_grad(param) -> None:
            seen = self.passes[name]
            self.passes[name] = seen + 1
            if seen % self.every:
                return
            step = self.recorder.current_step()
            if self.taken.get(name) == step:  # a second backward in the same step (accumulation): the first counts
                return
            self.taken[name] = step
            self.recorder.guarded(lambda: self._capture(param, grad_key, param_key, step))

        return on_grad

    def _capture(self, param, grad_key: str, param_key: str, step: int) -> None:
        if self.recorder.finished:
            return
        media = {}
        if "grad" in self.which and param.grad is not None:
            media[grad_key] = Histogram(param.grad, num_bins=self.bins, sample=SAMPLE)
        if "param" in self.which:
            media[param_key] = Histogram(param, num_bins=self.bins, sample=SAMPLE)
        route.put(self.recorder, step, media)

    def remove(self) -> None:
        """Unhook every parameter."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
