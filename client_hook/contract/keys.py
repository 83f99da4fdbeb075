"""The metric-key vocabulary: every key and key family the hook writes, and how the pages group them.

The client writes these names, the server's rules read them, the pages get them from
``/contract.js`` (as ``KEYS``, ``FAMILIES`` and ``SECTIONS``). Spell a key here and nowhere else.
Standard library only: the client imports it.
"""

from __future__ import annotations

import functools

# -- gradients (gradwatch/watcher.py, the integrations) ------------------------------------------
GRAD_VECTOR = "grad"  # per-layer gradient norms, one slot per parameter
GRAD_PREFIX = "grad/"  # the family of per-layer and global gradient keys
GLOBAL_NORM = "grad/global_norm"  # the global gradient norm, as backward produced it (pre-clip)
GLOBAL_NORM_CLIPPED = "grad/global_norm_clipped"  # the norm that reached the optimizer, when clipping changed it
MISSING_COUNT = "grad/missing_count"  # parameters with no gradient at the step

# -- learning rate -------------------------------------------------------------------------------
LR = "lr"  # the learning rate of a one-group optimizer
LR_PREFIX = "lr/"  # lr/<group> for optimizers with several parameter groups

# -- memory --------------------------------------------------------------------------------------
MEMORY_PREFIX = "memory/"
CUDA_PREFIX = "memory/cuda_"
CUDA_ALLOCATED = "memory/cuda_allocated"
CUDA_RESERVED = "memory/cuda_reserved"
CUDA_PEAK = "memory/cuda_peak"
CUDA_TOTAL = "memory/cuda_total"
RSS = "memory/rss"
PARAMS_BYTES = "memory/params"
GRADS_BYTES = "memory/grads"
OPTIMIZER_STATE_BYTES = "memory/optimizer_state"

# -- mixed precision -----------------------------------------------------------------------------
AMP_PREFIX = "amp/"
AMP_SCALE = "amp/scale"

# -- step time (gradwatch/capture/step_timer.py) -------------------------------------------------
PERF_PREFIX = "perf/"
STEP_TIME = "perf/step_time"  # seconds between the ends of consecutive optimizer steps
DATA_WAIT = "perf/data_wait"  # seconds from the end of a step to the next forward
SAMPLES_PER_SEC = "perf/samples_per_sec"
LOADER_WAIT = "perf/loader_wait"  # seconds inside a torch DataLoader's next() (capture/loader_wait.py)

# -- per-layer signals (gradwatch/capture/layer_signals.py) --------------------------------------
SIGNALS_PREFIX = "signals/"
UPDATE_VECTOR = "update_ratio"  # per-parameter ||dw|| / ||w||, the grad layout's slots
ACT_VECTOR = "act_rms"  # per-module output RMS
UPDATE_RATIO_MAX = "signals/update_ratio_max"
UPDATE_RATIO_ARGMAX = "signals/update_ratio_argmax"  # index into the grad layout
ACT_RMS_MAX = "signals/act_rms_max"
ACT_RMS_ARGMAX = "signals/act_rms_argmax"  # grad-layout index of the largest output's module's first parameter

# -- the machine (gradwatch/capture/system_metrics.py) -------------------------------------------
SYSTEM_PREFIX = "system/"
CPU_PERCENT = "system/cpu_percent"
RAM_PERCENT = "system/ram_percent"
PROCESS_RSS = "system/process_rss"
DISK_READ_BPS = "system/disk_read_bps"
DISK_WRITE_BPS = "system/disk_write_bps"
NET_SENT_BPS = "system/net_sent_bps"
NET_RECV_BPS = "system/net_recv_bps"
# what tells other processes taking the CPU from the run's own slowdown (health/pace/)
LOAD_PER_CORE = "system/load_per_core"  # 1-minute load average / CPU count: > 1, more runnable tasks than cores
CPU_STEAL = "system/cpu_steal"  # percent of CPU time the hypervisor gave to other guests
PROCESS_CPU = "system/process_cpu"  # this process's CPU use, percent of the whole machine (as cpu_percent)
THROTTLE_SUFFIX = "throttle_reasons"  # gpu_key(i, ...): NVML clock throttle reasons, a bit mask


def gpu_key(index: int, name: str) -> str:
    """The key of one NVML counter of GPU ``index`` (``system/gpu0/util``)."""
    return f"{SYSTEM_PREFIX}gpu{index}/{name}"


def lr_key(group: str | int, groups: int) -> str:
    """The LR key of parameter group ``group`` of an optimizer with ``groups`` groups."""
    return LR if groups == 1 else f"{LR_PREFIX}{group}"


def is_lr_key(key: str) -> bool:
    """Whether ``key`` is a learning rate (``lr`` or ``lr/<group>``)."""
    return key == LR or key.startswith(LR_PREFIX)


def is_layer_key(key: str) -> bool:
    """Whether ``key`` is a per-layer gradient key (``grad/<parameter>``), not a scalar summary of the family."""
    # grad/global_norm/<model> (one of several watched models) is a scalar too, not a layer
    return key.startswith(GRAD_PREFIX) and key not in GRAD_SCALARS and not key.startswith(GLOBAL_NORM + "/")


GRAD_SCALARS = (GLOBAL_NORM, GLOBAL_NORM_CLIPPED, MISSING_COUNT)

# Families of keys the hook writes, by prefix, in the order the pages show their sections; the
# script's own metrics (no prefix here) come first.
FAMILIES = {
    "grad": GRAD_PREFIX,
    "lr": LR_PREFIX,
    "memory": MEMORY_PREFIX,
    "amp": AMP_PREFIX,
    "perf": PERF_PREFIX,
    "signals": SIGNALS_PREFIX,
    "system": SYSTEM_PREFIX,
}
# Every key the hook writes under its own name (families of per-layer or per-group keys aside).
KEYS = {name: value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)}
VECTORS = (GRAD_VECTOR, UPDATE_VECTOR, ACT_VECTOR)


def family(key: str) -> str | None:
    """The family a key belongs to (``"grad"``, ``"system"``, ...), or None for the script's own metrics."""
    if key == LR:
        return "lr"
    return next((name for name, prefix in FAMILIES.items() if key.startswith(prefix)), None)


def is_system_key(key: str) -> bool:
    """Whether ``key`` is written by the hook itself (any family), not by the script's own ``log()``."""
    return family(key) is not None


# -- appended by the client (issue #27: clipping, AMP skipped steps, several models per run) ------------
CLIP_THRESHOLD = "grad/clip_threshold"  # the max_norm clip_grad_norm_ was called with, when the client saw it
AMP_SKIPPED = "amp/skipped"  # 1.0 at a step GradScaler skipped (non-finite gradients); absent otherwise
MODEL_NORM_PREFIX = "grad/global_norm/"  # grad/global_norm/<model>: one model's norm, when a run watches several


def model_norm_key(model: str) -> str:
    """The global gradient norm of one of several models watched in one run (``grad/global_norm/D``)."""
    return MODEL_NORM_PREFIX + model


GRAD_SCALARS = (*GRAD_SCALARS, CLIP_THRESHOLD)
KEYS.update(CLIP_THRESHOLD=CLIP_THRESHOLD, AMP_SKIPPED=AMP_SKIPPED)


# -- losses ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)  # asked for every key of every step by the health rules
def is_loss_key(key: str) -> bool:
    """Keys whose last path part mentions 'loss' are the ones watched for NaN/inf and spikes."""
    return "loss" in key.rsplit("/", 1)[-1].lower()


# "The loss" of a run (runs list column, sparkline, last/best loss on compare): the key the run
# declared (``init(loss_key=...)``, set by the integrations), else the first of these it logged.
LOSS_KEYS = ("loss", "train_loss", "train/loss", "loss/train", "training_loss", "train_loss_step", "train_loss_epoch")


def main_loss_key(keys, declared: str | None = None) -> str | None:
    """The run's loss: ``declared`` when it logged it, else the first usual name it logged, else None."""
    keys = set(keys)
    if declared and declared in keys:
        return declared
    return next((k for k in LOSS_KEYS if k in keys), None)


# The JavaScript twins of is_loss_key, main_loss_key, is_lr_key, is_layer_key, family and is_system_key
# (tests/test_contract.py runs them under node against the Python).
JS = """
export const isLossKey = (key) => key.split("/").pop().toLowerCase().includes("loss");
export function mainLossKey(keys, declared) {
  const have = new Set(keys);
  if (declared && have.has(declared)) return declared;
  return LOSS_KEYS.find((k) => have.has(k)) ?? null;
}
export const isLrKey = (key) => key === KEYS.LR || key.startsWith(KEYS.LR_PREFIX);
export const isLayerKey = (key) =>
  key.startsWith(KEYS.GRAD_PREFIX) && !GRAD_SCALARS.includes(key) && !key.startsWith(KEYS.GLOBAL_NORM + "/");
export function family(key) {
  if (key === KEYS.LR) return "lr";
  for (const [name, prefix] of Object.entries(FAMILIES)) if (key.startsWith(prefix)) return name;
  return null;
}
export const isSystemKey = (key) => family(key) !== null;
"""


def shared() -> dict:
    """The vocabulary /contract.js carries, by JavaScript name."""
    return {
        "KEYS": dict(KEYS),
        "FAMILIES": dict(FAMILIES),
        "GRAD_SCALARS": list(GRAD_SCALARS),
        "VECTORS": list(VECTORS),
        "LOSS_KEYS": list(LOSS_KEYS),
    }
