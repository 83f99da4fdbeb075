"""Health rules on the machine: CUDA memory pressure and AMP loss-scale overflow."""

from __future__ import annotations

from collections import deque

from gradwatch_server.health.common import Alert, Observation, episode, fmt

TOTAL = "memory/cuda_total"


def check_memory_pressure(state: dict, obs: Observation, th: dict, total: float | None) -> list[Alert]:
    """CUDA memory reserved close to the device's capacity: an OOM is near."""
    if obs.scalars.get(TOTAL):  # the device's capacity, sent once by the client's watcher
        state["total"] = obs.scalars[TOTAL]
    total = state.get("total") or total
    reserved = obs.scalars.get("memory/cuda_reserved")
    if reserved is None or not total:
        return []
    frac = reserved / total
    if not episode(state, frac >= th["memory_pressure.fraction"], th["memory_pressure.cooldown"]):
        return []
    return [
        Alert(
            "memory_pressure",
            obs.step,
            reserved,
            "warning",
            key="memory/cuda_reserved",
            message=(
                f"CUDA memory at {frac:.0%} of the device ({reserved / 2**30:.1f} of {total / 2**30:.1f} GiB) at step "
                f"{obs.step}. To make room: smaller batch with gradient accumulation, mixed precision (torch.autocast), "
                "activation checkpointing, or free tensors kept across steps (e.g. accumulating losses with graph)."
            ),
        )
    ]


def amp_drops(state: dict, th: dict) -> deque:
    drops = state.get("drops")
    if drops is None:
        drops = state["drops"] = deque(maxlen=int(th["amp_overflow.window"]))
    return drops


def check_amp_overflow(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """GradScaler keeps skipping steps (loss scale keeps dropping): fp16 overflow every few steps."""
    scale = obs.scalars.get("amp/scale")
    if scale is None:
        return []
    drops = amp_drops(state, th)  # per scaler update: the step of a skipped one (the scale dropped), else None
    prev = state.get("prev")
    state["prev"] = scale
    drops.append(obs.step if prev is not None and scale < prev else None)
    skipped = len(drops) - drops.count(None)
    if skipped < th["amp_overflow.skips"]:
        if skipped == 0:
            state["open"] = False  # the episode ends once the window holds no skipped step at all
        return []
    if state.get("open"):
        return []
    state["open"] = True
    first = next(s for s in drops if s is not None)
    return [
        Alert(
            "amp_overflow",
            first,
            scale,
            "warning",
            key="amp/scale",
            confirmed_step=obs.step,
            message=(
                f"The AMP GradScaler skipped {skipped} of the last {len(drops)} steps (loss scale now {fmt(scale)}): "
                "gradients overflow fp16. Check for very large activations or losses, use bf16 if the GPU supports it, "
                "or lower the learning rate."
            ),
        )
    ]
