"""Per-layer signals that precede instability: update-to-weight ratios and module output RMS, plus NaN provenance.

Captured like the gradient norms: device work only on the training thread (fused norms, a stack),
read off the device later by the sender thread. On a sampled step (every ``every``-th optimizer step):

- ``act_rms``: forward hooks on the leaf modules keep a reference to each output (while autograd
  holds it anyway); at the optimizer step one fused ``_foreach_norm`` turns them into RMS values.
- ``update_ratio``: ‖Δw‖/max(‖w‖, floor) per parameter (the grad layout; the floor is the norm of weights of
  RMS ``FLOOR_RMS``, so a zero-initialised bias gets a finite ratio, not 1e9). The step pre-hook copies a fixed strided
  sample of each parameter (at most ``SAMPLE`` elements in ``BLOCKS`` runs: exact for small tensors, never a copy of
  the weights); the post-hook divides the norm of (sample after − sample before) by the sample's norm.
  It works for any optimizer, and costs O(SAMPLE) per parameter whatever its size.
- NaN provenance: from the same output norms, the first module (in this step's forward order) whose
  output was non-finite, whether weights or optimizer state already were (read on the same samples:
  a NaN confined to elements the sample skips can be missed), the AMP scale and the rank,
  sent once as a ``nan_provenance`` alert event. The probe is read without a host sync (CPU: at once;
  CUDA: a non-blocking copy polled at later steps).
"""

from __future__ import annotations

import math
import os
from collections import deque

from gradwatch.capture.norms import fused_norms, loss_scale
from gradwatch.contract import keys
from gradwatch.step_clock import clock_of
from gradwatch.values import defer_vector

UPDATE_VECTOR = keys.UPDATE_VECTOR
ACT_VECTOR = keys.ACT_VECTOR
SAMPLE = 4096  # elements per parameter copied to measure its update (exact below this size)
BLOCKS = 64  # ... in this many contiguous runs
FLOOR_RMS = 1e-3  # an update is measured against weights of at least this RMS (zero-initialised biases)


def sample(t):
    """A fixed view of at most SAMPLE elements of ``t`` (all of a small tensor): BLOCKS contiguous runs spread evenly.

    Runs, not single strided elements: a stride of one element per cache line would read the whole tensor.
    """
    flat = t.reshape(-1)
    n = flat.numel()
    if n <= SAMPLE:
        return flat
    step = n // BLOCKS
    return flat[: BLOCKS * step].view(BLOCKS, step)[:, : SAMPLE // BLOCKS]


def _first_tensor(output, torch):
    """The first floating-point tensor of a module's output (a tuple for attention or RNNs)."""
    if isinstance(output, torch.Tensor):
        return output if output.is_floating_point() else None
    if isinstance(output, (tuple, list)):
        for item in output:
            found = _first_tensor(item, torch)
            if found is not None:
                return found
    return None


class LayerSignals:
    """Update ratios, output RMS and the NaN probe for one model and optimizer (see the module docstring).

    Args:
        recorder: the run's ``Recorder``.
        model, optimizer: what ``Run.watch`` was given (an optimizer is required).
        every: sample every N-th optimizer step.
        trainable: returns the watcher's [(name, param)] in grad-layout order.
        scaler: a GradScaler, for the AMP scale in NaN provenance.
        on_nan: "skip" to skip the optimizer step whose gradients are non-finite (a host sync on that path).

    Samples are recorded at the step of the run's clock (``gradwatch.step_clock``), which calls this
    around every step of ``optimizer``.
    """

    def __init__(self, recorder, model, optimizer, every, trainable, scaler=None, on_nan=None):
        import torch

        self.torch, self.recorder, self.optimizer = torch, recorder, optimizer
        self.every, self.trainable, self.scaler, self.on_nan = max(1, int(every)), trainable, scaler, on_nan
        self.clock = clock_of(recorder)
        self.modules = [(n, m) for n, m in model.named_modules() if not any(True for _ in m.children())]
        self.layout: list[str] = []  # act_rms names, in the order of the first sampled forward
        self.slot: dict[str, int] = {}
        self.outputs: dict[str, object] = {}  # name -> output of this step (insertion = forward order)
        self.snapshot = None
        self.probes: deque = deque()
        self.reported = False
        self.sent: dict[str, list] = {}  # layouts sent, by vector key
        self.first_cache: dict = {}
        self.floor_key, self.floor = None, None
        self.handles = [m.register_forward_hook(self._make_hook(n)) for n, m in self.modules]
        self.clock.attach(optimizer)
        # Every step: read finished probes, and (on_nan="skip") drop non-finite gradients; the samples every N-th.
        self.subscription = self.clock.subscribe(before=self._pre, after=self._post, optimizer=optimizer)

    @property
    def armed(self) -> bool:
        """Whether the step being computed now is a sampled one."""
        return self.subscription.seen % self.every == 0

    def _make_hook(self, name):
        def hook(module, args, output):
            if self.armed and self.torch.is_grad_enabled():
                t = _first_tensor(output, self.torch)
                if t is not None:
                    self.outputs.pop(name, None)  # a module run twice counts at its last call
                    self.outputs[name] = t.detach()

        return hook

    def remove(self) -> None:
        """Detach every hook."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.subscription.remove()
        self.outputs.clear()

    # -- the optimizer step (called by the run's clock) -----------------------------------------
    def _pre(self, step: int) -> None:
        self.recorder.guarded(self._poll)
        if self.armed:
            self.recorder.guarded(lambda: self._before_step(step))
        if self.on_nan == "skip":
            self.recorder.guarded(self._maybe_skip)

    def _post(self, step: int) -> None:
        try:
            if self.snapshot is not None:
                self.recorder.guarded(lambda: self._after_step(step))
        finally:
            self.snapshot = None
            self.outputs = {}

    def _before_step(self, step: int) -> None:
        torch = self.torch
        closure = self.clock.closure  # step(closure): the gradients come inside the step; every parameter counts
        params = [(n, p) for n, p in self.trainable() if p.grad is not None or closure]
        acts = self._act_rms()
        if not params:
            self.snapshot = ([], None, None, acts)
            if acts is not None:
                self._probe(self.torch.zeros(1, device=acts[1].device), acts)
            return
        before = [sample(p.detach()).clone() for _, p in params]
        wnorm = fused_norms(torch, before)  # ‖w‖ of the same sample: the ratio is of like with like
        self.snapshot = (params, before, wnorm, acts)
        self._probe(wnorm, acts)

    def _after_step(self, step: int) -> None:
        torch = self.torch
        params, before, norms, acts = self.snapshot
        if acts is None and self.outputs:  # step(closure) (Lightning): the forward ran inside the step
            acts = self._act_rms()
        scalars, vectors = {}, {}
        if params:
            wnorm = norms
            diffs = [sample(p.detach()) - b for (_, p), b in zip(params, before)]  # at most SAMPLE elements each
            dnorm = fused_norms(torch, diffs)
            ratio = dnorm / torch.maximum(wnorm, self._floor(before, wnorm.device))
            names = [n for n, _ in self.trainable()]
            have = {id(p) for _, p in params}
            missing = [i for i, (_, p) in enumerate(self.trainable()) if id(p) not in have]
            self._layout(UPDATE_VECTOR, names)
            vectors[UPDATE_VECTOR] = (defer_vector(ratio), missing, len(names))
            if not missing:  # the index is into the grad layout: only exact when every parameter is there
                # The summary is over matrices: a zero-initialised bias or norm gain has a meaningless ratio.
                mats = torch.tensor([p.dim() >= 2 for _, p in params], device=ratio.device)
                top = torch.where(mats, torch.nan_to_num(ratio, nan=math.inf), torch.zeros_like(ratio))
                scalars[keys.UPDATE_RATIO_MAX] = defer_vector(top.max().reshape(()))
                scalars[keys.UPDATE_RATIO_ARGMAX] = defer_vector(top.argmax().to(torch.float32).reshape(()))
        if acts is not None:
            names, rms = acts
            if self._grow_layout(names):
                self._layout(ACT_VECTOR, self.layout)
            slots = [self.slot[n] for n in names]
            order = sorted(range(len(names)), key=slots.__getitem__)  # present values in layout order
            missing = sorted(set(range(len(self.layout))) - set(slots))
            present = rms[torch.tensor(order, device=rms.device)]
            vectors[ACT_VECTOR] = (defer_vector(present), missing, len(self.layout))
            # The summary names a module by its first parameter's place in the grad layout (what the server's
            # rules can name); modules without parameters (activations) are left out of it.
            first = self._first_param([names[i] for i in order])
            owned = [i for i, f in enumerate(first) if f >= 0]
            if owned:
                sel = present[torch.tensor(owned, device=rms.device)]
                top = torch.nan_to_num(sel, nan=math.inf)
                at = torch.tensor([float(first[i]) for i in owned], device=rms.device)
                scalars[keys.ACT_RMS_MAX] = defer_vector(top.max().reshape(()))
                scalars[keys.ACT_RMS_ARGMAX] = defer_vector(
                    at.index_select(0, top.argmax().reshape(1)).reshape(())
                )  # no .item()
        if scalars or vectors:
            self.recorder.put_record(step, scalars, vectors)

    def _floor(self, samples: list, device):
        """Per parameter, the norm a sample of RMS ``FLOOR_RMS`` has: a zero-initialised bias or gain is measured
        against it, so its ratio is a finite number, not ‖Δw‖/0 (kept on the device, built once per layout)."""
        sizes = tuple(t.numel() for t in samples)
        if self.floor_key != (sizes, device):
            self.floor_key = (sizes, device)
            numel = self.torch.tensor(sizes, dtype=self.torch.float32, device=device)
            self.floor = FLOOR_RMS * numel.clamp_min(1).sqrt()
        return self.floor

    def _layout(self, key: str, names: list) -> None:
        """Send a vector's layout when it is new or changed (before the record that uses it)."""
        if self.sent.get(key) != names:
            self.sent[key] = list(names)
            self.recorder.put_layout(key, list(names))

    def _first_param(self, modules: list) -> list:
        """For each module name, the grad-layout index of its first parameter, or -1."""
        names = [n for n, _ in self.trainable()]
        key = (tuple(modules), tuple(names))
        if key in self.first_cache:
            return self.first_cache[key]
        out = self.first_cache[key] = []
        for m in modules:
            prefix = m + "." if m else ""
            out.append(
                next((i for i, n in enumerate(names) if n.startswith(prefix) and "." not in n[len(prefix) :]), -1)
            )
        return out

    def _grow_layout(self, names: list) -> bool:
        """Add modules seen for the first time to the act_rms layout; True when it changed."""
        new = [n for n in names if n not in self.slot]
        for n in new:
            self.slot[n] = len(self.layout)
            self.layout.append(n)
        return bool(new)

    def _act_rms(self):
        """(names in this step's forward order, RMS vector) of the outputs held, or None."""
        if not self.outputs:
            return None
        names, outs = list(self.outputs), list(self.outputs.values())
        norms = fused_norms(self.torch, outs)
        sizes = self.torch.tensor([max(1, t.numel()) for t in outs], dtype=self.torch.float32, device=norms.device)
        return names, norms / sizes.sqrt()

    # -- NaN provenance ------------------------------------------------------------------------
    def _probe(self, wnorm, acts) -> None:
        """Queue [first non-finite output index or -1, weights bad, state bad, scale] for a read that never waits."""
        torch = self.torch
        dev = wnorm.device
        if acts is not None:
            bad = ~torch.isfinite(acts[1].to(dev))
            idx = torch.arange(len(bad), device=dev, dtype=torch.float32)
            first = torch.where(bad, idx, torch.full_like(idx, math.inf)).min()
            first = torch.where(torch.isfinite(first), first, torch.full_like(first, -1.0))
        else:
            first = torch.tensor(-1.0, device=dev)
        w_bad = (~torch.isfinite(wnorm.sum())).float()
        names = acts[0] if acts is not None else []
        step = self.clock.step
        if dev.type != "cuda":
            # On the CPU reading is free, so the optimizer state (still as before this step) is checked only
            # when something is already bad: nothing extra while healthy.
            if not self.reported and (float(first) >= 0 or bool(w_bad)):
                self.probes.append((step, names, [float(first), float(w_bad), self._state_bad(), self._scale()], None))
            self._poll()
            return
        # On a GPU the check is queued (asynchronous, on the state's samples) and read steps later.
        state_bad = self._state_bad_device(dev)
        state_bad = state_bad if isinstance(state_bad, torch.Tensor) else torch.zeros((), device=dev)
        probe = torch.stack([first, w_bad, state_bad, self._scale_t(dev)])
        host = torch.empty(probe.shape, dtype=probe.dtype, pin_memory=True)
        host.copy_(probe.detach(), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.probes.append((step, names, host, event))

    def _state_tensors(self) -> list:
        return [v for s in self.optimizer.state.values() for v in s.values() if _is_float_tensor(self.torch, v)]

    def _state_bad(self) -> float:
        """Whether any optimizer-state tensor holds a NaN/inf (exact; CPU only, where reading costs no sync)."""
        state = self._state_tensors()
        return float(bool(state) and not all(bool(self.torch.isfinite(v).all()) for v in state))

    def _state_bad_device(self, dev):
        state = [sample(v) for v in self._state_tensors()]
        if not state:
            return 0.0
        return (~self.torch.isfinite(fused_norms(self.torch, state).sum())).float().to(dev)

    def _scale_t(self, dev):
        scale = loss_scale(self.scaler)
        if scale is None:
            return self.torch.tensor(math.nan, device=dev)
        return scale.to(dev, self.torch.float32).reshape(())

    def _scale(self) -> float:
        return float(self._scale_t("cpu"))

    def _poll(self) -> None:
        """Read the probes whose device work is done (never waits); report the first bad one."""
        while self.probes and (self.probes[0][3] is None or self.probes[0][3].query()):
            step, names, values, _ = self.probes.popleft()
            first, w_bad, s_bad, scale = values if isinstance(values, list) else values.tolist()
            if not self.reported and (first >= 0 or w_bad or s_bad):
                self.reported = True
                self.recorder.put_event(provenance_event(step, names, int(first), bool(w_bad), bool(s_bad), scale))

    def _maybe_skip(self) -> None:
        """on_nan="skip": drop non-finite gradients so the optimizer skips the step, as GradScaler does.

        Optimizers skip parameters whose ``.grad`` is None. Deciding needs one flag read per step (a sync)."""
        params = [p for _, p in self.trainable() if p.grad is not None]
        if params and not bool(self.torch.isfinite(fused_norms(self.torch, [p.grad for p in params]).sum())):
            for p in params:
                p.grad = None
            warn = getattr(self.recorder, "warn_once", None)
            if warn is not None:
                warn("on_nan", "gradwatch: non-finite gradients: optimizer step skipped (on_nan='skip')")


def provenance_event(step, names, first, weights_bad, state_bad, scale) -> dict:
    """The ``nan_provenance`` alert event: where the first non-finite value was born, and what else was bad."""
    rank = os.environ.get("RANK")
    where = names[first] if 0 <= first < len(names) else None
    parts = []
    if where is not None:
        parts.append(f"the first module (in forward order) whose output was NaN/inf at step {step} is {where}")
    else:
        parts.append(f"every module output was finite at step {step}: the NaN/inf arose in the loss or the backward")
    parts.append("the weights were already non-finite" if weights_bad else "the weights were finite")
    parts.append("the optimizer state was already non-finite" if state_bad else "the optimizer state was finite")
    if not math.isnan(scale):
        parts.append(f"AMP loss scale {scale:g}")
    if rank is not None:
        parts.append(f"rank {rank}")
    advice = (
        " Look at that module's inputs and its arithmetic (a division by a zero norm, log/sqrt of 0 or negatives, "
        "fp16 overflow); with on_nan='skip' the step is skipped so one bad batch does not poison the weights."
        if where is not None and not weights_bad
        else " The weights went bad at an earlier step: lower the learning rate or clip gradients."
        if weights_bad
        else ""
    )
    return {
        "type": "alert",
        "kind": "nan_provenance",
        "severity": "critical",
        "step": step,
        "layer": where,
        "value": None,
        "message": "NaN provenance: " + "; ".join(parts) + "." + advice,
    }


def _is_float_tensor(torch, value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0
