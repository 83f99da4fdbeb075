"""Health rules on the machine: CUDA memory pressure and AMP loss-scale overflow (and out-of-memory crashes).

Each rule has its per-record check and its numpy bulk check (see rule.py) here, declared in ``RULES``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from gradwatch.contract import keys
from gradwatch_server.health.common import Alert, Observation, episode, fmt, healthy_run
from gradwatch_server.health.rule import Columns, Rule

TOTAL, RESERVED, SCALE = keys.CUDA_TOTAL, keys.CUDA_RESERVED, keys.AMP_SCALE


def memory_start(meta: Mapping) -> dict:
    """The device's capacity from the run's hello, until the watcher sends it as a scalar."""
    return {"total": meta.get("cuda_total_memory")}


def check_memory_pressure(state: dict, obs: Observation, th: dict) -> list[Alert]:
    """CUDA memory reserved close to the device's capacity: an OOM is near."""
    if obs.scalars.get(TOTAL):  # the device's capacity, sent once by the client's watcher
        state["total"] = obs.scalars[TOTAL]
    total = state.get("total")
    reserved = obs.scalars.get(RESERVED)
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
            key=RESERVED,
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
    scale = obs.scalars.get(SCALE)
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
            key=SCALE,
            confirmed_step=obs.step,
            message=(
                f"The AMP GradScaler skipped {skipped} of the last {len(drops)} steps (loss scale now {fmt(scale)}): "
                "gradients overflow fp16. Check for very large activations or losses, use bf16 if the GPU supports it, "
                "or lower the learning rate."
            ),
        )
    ]


def out_of_memory(error: dict) -> Alert | None:
    """A critical memory_pressure alert with the memory state when the run's exception is an OOM, else None."""
    text = f"{error.get('exc_type')}: {error.get('message')}"[:10000]
    if "out of memory" not in text.lower() and "OutOfMemoryError" not in text:
        return None
    memory = error.get("memory") or {}
    detail = ", ".join(
        f"{k.split('/')[-1]}={v / 2**20:.0f} MiB" for k, v in memory.items() if isinstance(v, (int, float))
    )
    return Alert(
        "memory_pressure",
        error.get("step"),
        memory.get(RESERVED),
        "critical",
        key=RESERVED,
        message=(
            "The training process ran out of memory"
            + (f" ({detail})" if detail else "")
            + ". Try a smaller batch with gradient accumulation, mixed precision, activation "
            "checkpointing, or torch.cuda.empty_cache() between phases."
        ),
    )


# -- the same rules over a whole batch (numpy) -------------------------------------------------------------
def bulk_memory_pressure(state: dict, cols: Columns) -> bool:
    """No reserved memory of the batch reaches the fraction (a batch with the capacity: record by record)."""
    if TOTAL in cols.scalars:
        return False
    reserved, total = cols.scalars.get(RESERVED), state.get("total")
    if reserved is None or not total:
        return True
    frac = reserved[1] / total
    if (frac >= cols.th["memory_pressure.fraction"]).any():
        return False
    healthy_run(state, len(frac), cols.th["memory_pressure.cooldown"])
    return True


def bulk_amp_overflow(state: dict, cols: Columns) -> bool:
    """A batch without a loss scale leaves the rule as it was; one with a scale goes record by record."""
    return SCALE not in cols.scalars


RULES = (
    Rule(
        "memory",
        "memory_pressure",
        check_memory_pressure,
        bulk_memory_pressure,
        reads=frozenset({RESERVED, TOTAL}),
        start=memory_start,
    ),
    Rule("amp", "amp_overflow", check_amp_overflow, bulk_amp_overflow, reads=frozenset({SCALE})),
)
