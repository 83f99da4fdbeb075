"""Plain-language diagnosis of the classic PyTorch failures, from an exception's type and text."""

from __future__ import annotations

import json
import re

# (pattern on "Type: message", title, advice). First match wins; order from specific to generic.
# Every pattern is a plain alternation or has a bounded repeat, and the text is cut to MAX_TEXT
# characters first, so a hostile or huge exception message costs linear time at most.
MAX_TEXT = 4000
_RULES: list[tuple[str, str, str]] = [
    (
        r"out of memory|OutOfMemoryError",
        "CUDA ran out of memory",
        "Reduce the batch size (keep the effective batch with gradient accumulation), use mixed precision "
        "(torch.autocast + GradScaler, or bf16), enable activation checkpointing, and make sure you do not keep "
        "tensors with their graph across steps (log loss.item() or loss.detach(), not loss).",
    ),
    (
        r"Expected all tensors to be on the same device|on different devices|device-side|found at least two devices",
        "Tensors on different devices",
        "Move the model and every input, target and newly created tensor to one device: define "
        "device = torch.device(...) once and call .to(device) on the model and on each batch; create new "
        "tensors with device=x.device.",
    ),
    (
        r"grad can be implicitly created only for scalar outputs",
        "backward() called on a non-scalar",
        "backward() needs a single number: reduce the loss with .mean() or .sum() first (or pass a gradient "
        "tensor of the same shape to backward).",
    ),
    (
        r"element 0 of tensors does not require grad and does not have a grad_fn",
        "The loss is not connected to any parameter",
        "Something cut the graph between the parameters and the loss: .detach(), torch.no_grad(), .item(), "
        ".numpy() round-trips, or building the loss from Python numbers. Keep the computation in tensors and "
        "check that model parameters have requires_grad=True.",
    ),
    (
        r"mat1 and mat2 shapes cannot be multiplied|size mismatch|shape '[^'\n]{0,200}' is invalid|must match the size|"
        r"shapes cannot be multiplied|Sizes of tensors must match|doesn't match the broadcast shape|"
        r"Expected input batch_size",
        "Shape mismatch",
        "A layer received a tensor of the wrong shape. Print x.shape before each layer (or use a forward hook) "
        "and compare with the layer's in_features/in_channels; after conv layers, check the flatten size.",
    ),
    (
        r"expected scalar type|dtype|Found dtype",
        "Data type mismatch",
        "Inputs and parameters must share a dtype: convert data with .float() (float32) and targets for "
        "CrossEntropyLoss with .long().",
    ),
    (
        r"one of the variables needed for gradient computation has been modified by an inplace operation",
        "In-place operation broke backward",
        "A tensor needed for backward was modified in place (x += ..., relu_(), inplace=True). Use the "
        "out-of-place version; torch.autograd.set_detect_anomaly(True) points at the culprit.",
    ),
    (
        r"Trying to backward through the graph a second time",
        "backward() through the same graph twice",
        "Compute a fresh forward pass per backward, or detach state carried across steps (e.g. RNN hidden "
        "states: h = h.detach()). retain_graph=True is rarely the right fix.",
    ),
    (
        r"TrainingDiverged|\bnan\b|\bNaN\b|non-finite|inf\b",
        "The loss went NaN/inf",
        "Training diverged. Lower the learning rate or add warmup, clip gradients (clip_grad_norm_), add an "
        "epsilon to logs and divisions, and check the input data for NaN. The gradient-norm chart shows when "
        "it started.",
    ),
]


_COMPILED = [(re.compile(pattern), title, advice) for pattern, title, advice in _RULES]


def diagnose(exc_type: str, message: str, memory: dict | None = None) -> dict | None:
    """Return {"title", "advice"} for a known failure, else None."""
    text = f"{str(exc_type)[:200]}: {str(message)[:MAX_TEXT]}"
    for pattern, title, advice in _COMPILED:
        if pattern.search(text):
            if memory and title.startswith("CUDA ran out"):
                held = ", ".join(
                    f"{k.split('/')[-1]} {v / 2**20:.0f} MiB" for k, v in memory.items() if isinstance(v, (int, float))
                )
                advice = f"Memory at the failure: {held}. " + advice
            return {"title": title, "advice": advice}
    return None


def with_incident(error_json: str, incidents: list[dict]) -> str:
    """A stored error (JSON) with its diagnosis told in the light of the run's open divergence incident."""
    error = json.loads(error_json)
    error["diagnosis"] = in_incident(error.get("diagnosis"), incidents)
    return json.dumps(error)


def in_incident(diagnosis: dict | None, incidents: list[dict]) -> dict | None:
    """A crash while a divergence incident is open: the diagnosis names it, since the crash is most likely its
    consequence (NaN/inf reaching an op that refuses it, an assert on the loss, a scaler giving up)."""
    open_ = [i for i in incidents if i.get("family") == "divergence" and i.get("status") != "resolved"]
    if not open_:
        return diagnosis
    inc = open_[-1]
    cause = f"; {inc['cause']}" if inc.get("cause") else ""
    note = (
        f"This run diverged at step {inc['first_step']} ({inc['kind']}{cause}) before it crashed: the crash is most "
        "likely a consequence. Fix the divergence first: a lower learning rate, warmup, gradient clipping."
    )
    if diagnosis is None:
        return {"title": "Crashed after diverging", "advice": note, "incident_id": inc["id"]}
    return {**diagnosis, "advice": note + " " + diagnosis["advice"], "incident_id": inc["id"]}
