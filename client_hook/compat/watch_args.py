"""W&B's ``watch(models, criterion=None, log="gradients", log_freq=1000, idx=None, log_graph=False)`` read as
gradwatch's ``watch(model, optimizer, scaler, every, histograms=..., histograms_every=...)``."""

from __future__ import annotations

WANDB_LOG = ("gradients", "parameters", "all")
WANDB_ARGS = frozenset({"log", "log_freq", "criterion", "idx", "log_graph"})  # W&B's watch() keywords


def translate(optimizer, scaler, every, wandb: dict) -> tuple:
    """(optimizer, scaler, every, histograms or None, histograms_every) from whichever form a script used.

    W&B's positional ``criterion`` (a loss module) lands where gradwatch takes the optimizer and its ``log``
    where the scaler goes: both are recognised and moved. ``wandb`` holds the W&B keyword arguments given.
    """
    unknown = sorted(set(wandb) - WANDB_ARGS)
    if unknown:
        raise TypeError(f"watch() got unexpected keyword argument(s): {', '.join(unknown)}")
    log, log_freq = wandb.get("log", "unset"), wandb.get("log_freq")
    if isinstance(scaler, str) or scaler is None and log == "unset" and isinstance(every, str):
        log, scaler = scaler if isinstance(scaler, str) else every, None
    if optimizer is not None and not _optimizers(optimizer):  # a criterion (nn.Module), not an optimizer
        optimizer = None
    if not isinstance(every, int) or isinstance(every, bool):
        every = 1
    if log == "unset":
        log = "gradients" if ("log_freq" in wandb or "criterion" in wandb) else None
    histograms = log if log in WANDB_LOG else None
    return optimizer, scaler, every, histograms, int(log_freq) if log_freq else None


def _optimizers(value) -> bool:
    """Whether ``value`` is an optimizer or a list of them (``watch([netD, netG], [optD, optG])``)."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(o is None or hasattr(o, "param_groups") for o in value)
    return hasattr(value, "param_groups")
