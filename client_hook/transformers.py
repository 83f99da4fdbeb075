"""Hugging Face Transformers integration: ``Trainer(..., callbacks=[GradwatchCallback(project="p")])``.

This module is ``gradwatch.transformers``; ``import transformers`` below is the real library
(absolute imports). It is imported only when this module is (``import gradwatch`` stays light).
"""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

import gradwatch
from gradwatch import metadata

__all__ = ["GradwatchCallback"]
STOP_KEYS = ("loss", "grad_norm")  # a non-finite value here stops training with on_nan="stop"


class GradwatchCallback(TrainerCallback):
    """Streams a ``transformers.Trainer`` run to gradwatch.

    Records the ``TrainingArguments`` (secrets redacted) and the model config as the run's
    config, every ``logs`` dict the Trainer emits (``loss``, ``grad_norm``, ``learning_rate``,
    ``eval_*`` ...) at its global step, and per-layer and global gradient norms, LR and memory in
    ``on_pre_optimizer_step`` (after accelerate unscales and clips, before the step; the
    pre-clip global norm is the Trainer's own ``grad_norm``). Without an optimizer from the
    Trainer, ``lr`` is the logged ``learning_rate``.

    Args:
        project, name, config, **kwargs: passed to ``gradwatch.init`` (server, token, tags,
            alerts, all_ranks ...); ``name`` defaults to ``args.run_name``.
        on_nan: "warn", "raise" or "stop": stop sets ``control.should_training_stop`` when a
            logged ``loss`` or ``grad_norm`` is NaN/inf, so the Trainer ends through its own
            control flow (the Trainer's ``logging_nan_inf_filter`` hides NaN losses, not
            ``grad_norm``).
        watch_gradients: capture per-layer gradient norms (default True).
    """

    def __init__(
        self,
        project: str = "default",
        name: str | None = None,
        config: dict | None = None,
        *,
        on_nan: str = "warn",
        watch_gradients: bool = True,
        **kwargs,
    ):
        self.init_args = dict(project=project, on_nan=on_nan, **kwargs)
        self.name = name
        self.extra_config = dict(config or {})
        self.watch_gradients = watch_gradients
        self.run = None
        self._watcher = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        config = {"args": _redacted(args.to_dict()), **self.extra_config}
        model_config = getattr(model, "config", None)
        if model_config is not None and hasattr(model_config, "to_dict"):
            config.setdefault("model", model_config.to_dict())
        self.run = gradwatch.init(name=self.name or args.run_name, config=config, **self.init_args)
        if self.watch_gradients and model is not None and self.run.recorder is not None:  # None: a NoopRun
            from gradwatch.step_watcher import StepWatcher

            self._watcher = StepWatcher(self.run.recorder, model, [optimizer])

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self._watcher is not None:
            if not self._watcher.optimizers and optimizer is not None:  # not yet created at on_train_begin
                self._watcher.set_optimizers([optimizer])
            self._watcher.capture_at(state.global_step + 1)  # the step the Trainer will log this update as

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is None or not logs:
            return
        numbers = {k: float(v) for k, v in logs.items() if _is_number(v)}
        if "learning_rate" in numbers and (self._watcher is None or not self._watcher.optimizers):
            numbers["lr"] = numbers["learning_rate"]  # the run page's LR chart, when the Trainer hid its optimizer
        if numbers:
            self.run.log(numbers, step=state.global_step)
        nonfinite = [k for k in STOP_KEYS if k in numbers and not math.isfinite(numbers[k])]
        if getattr(self.run, "should_stop", False) or (nonfinite and self.init_args["on_nan"] == "stop"):
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        if self._watcher is not None:
            self._watcher.remove()
            self._watcher = None
        if self.run is not None:
            run, self.run = self.run, None
            run.finish("finished")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _redacted(values: dict) -> dict:
    """TrainingArguments as config, with secret-named fields (hub_token ...) as ***."""
    return {k: (metadata.REDACTED if metadata.is_secret_name(k) and v else v) for k, v in values.items()}
