"""Hugging Face Transformers integration: ``Trainer(..., callbacks=[GradwatchCallback(project="p")])``.

This module is ``gradwatch.transformers`` (``gradwatch.integrations.transformers``); ``import transformers`` below is the real library
(absolute imports). It is imported only when this module is (``import gradwatch`` stays light).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

import gradwatch
from gradwatch import metadata

__all__ = ["GradwatchCallback"]
CHECKPOINT_FILE = "gradwatch.json"  # in each checkpoint folder: the run it belongs to
STOP_KEYS = ("loss", "grad_norm")  # a non-finite value here stops training with on_nan="stop"


class GradwatchCallback(TrainerCallback):
    """Streams a ``transformers.Trainer`` run to gradwatch.

    Records the ``TrainingArguments`` (secrets redacted) and the model config as the run's
    config; the training loss at every optimizer step, whatever ``logging_steps`` says (the
    model's own loss, read by a forward hook and summed over accumulation micro-batches as the
    Trainer sums them); every ``logs`` dict the Trainer emits (``grad_norm``,
    ``learning_rate``, ``eval_*`` ...; its windowed ``loss`` only when the model returns none)
    at its global step; and per-layer and global gradient norms read when each backward pass
    ends, BEFORE the Trainer clips (``grad/global_norm`` equals the Trainer's ``grad_norm``),
    with ``grad/global_norm_clipped`` beside it when ``max_grad_norm`` clips, plus LR and
    memory. Without an optimizer from the Trainer, ``lr`` is the logged ``learning_rate``.

    Args:
        project, name, config, **kwargs: passed to ``gradwatch.init`` (server, token, tags,
            alerts, all_ranks ...); ``name`` defaults to ``args.run_name``.
        on_nan: "warn", "raise" or "stop": stop sets ``control.should_training_stop`` when a
            logged ``loss`` or ``grad_norm`` is NaN/inf, so the Trainer ends through its own
            control flow (the Trainer's ``logging_nan_inf_filter`` hides NaN losses, not
            ``grad_norm``).
        watch_gradients: capture per-layer gradient norms (default True), and with them, from the Trainer's
            optimizer, update/weight ratios and output RMS (every ``signals_every``-th step, default 10), the
            step timer (``perf/step_time``, ``perf/data_wait``) and the machine (``system/*``), as ``Run.watch``.
        signals_every: sample the update ratios and output RMS every N-th step (1: every step).
    """

    def __init__(
        self,
        project: str = "default",
        name: str | None = None,
        config: dict | None = None,
        *,
        on_nan: str = "warn",
        watch_gradients: bool = True,
        signals_every: int | None = None,
        **kwargs,
    ):
        self.init_args = dict(project=project, on_nan=on_nan, **kwargs)
        self.name = name
        self.extra_config = dict(config or {})
        self.watch_gradients = watch_gradients
        self.signals_every = signals_every
        self.run = None
        self._watcher = None
        self._loss_hook = None
        self._losses: list = []  # this optimizer step's micro-batch losses
        self._summed = False
        self._streamed = False  # the loss went out every step: the Trainer's windowed one is not sent again

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        config = {"args": _redacted(args.to_dict()), **self.extra_config}
        model_config = getattr(model, "config", None)
        if model_config is not None and hasattr(model_config, "to_dict"):
            config.setdefault("model", model_config.to_dict())
        init_args = {"loss_key": "loss", **self.init_args}
        uid = _checkpoint_uid(args, state) if state.global_step and "id" not in init_args else None
        if uid:  # train(resume_from_checkpoint=...): continue the run that checkpoint belongs to
            init_args.update(id=uid, resume="allow")
        self.run = gradwatch.init(name=self.name or args.run_name, config=config, **init_args)
        if model is None or self.run.recorder is None:  # None: a NoopRun
            return
        self._loss_hook = model.register_forward_hook(self._on_forward, with_kwargs=True)
        if self.watch_gradients:
            from gradwatch.integrations.step_watcher import StepWatcher

            clipping = bool(args.max_grad_norm and args.max_grad_norm > 0)
            self._watcher = StepWatcher(
                self.run.recorder,
                model,
                [optimizer],
                pre_clip=True,
                clipping=clipping,
                signals_every=self.signals_every,
            )

    def _on_forward(self, module, args, kwargs, output) -> None:
        """A training forward pass: keep its loss (a device tensor, no sync) for this optimizer step."""
        if module.training and self.run is not None:
            self.run.recorder.guarded(lambda: self._keep_loss(kwargs, output))

    def _keep_loss(self, kwargs: dict, output) -> None:
        if isinstance(output, Mapping):
            loss = output.get("loss")
        else:
            loss = output[0] if isinstance(output, tuple) and output and "labels" in kwargs else None
        if loss is not None and hasattr(loss, "detach") and loss.numel() == 1:
            self._losses.append(loss.detach().reshape(()))
            # With num_items_in_batch the model divides by the whole step's token count: micro-batches add up.
            self._summed = "num_items_in_batch" in kwargs

    def on_step_end(self, args, state, control, **kwargs):
        losses, self._losses = self._losses, []
        if self.run is None or not losses:
            return
        import torch

        loss = torch.stack(losses).sum() if self._summed else torch.stack(losses).mean()
        self._streamed = True
        # "stop"/"raise" read the value now, so the NaN check is not a step late (as Lightning's does).
        self.run.log({"loss": float(loss) if self.init_args["on_nan"] != "warn" else loss}, step=state.global_step)
        if getattr(self.run, "should_stop", False):
            control.should_training_stop = True

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self._watcher is not None:
            if not self._watcher.optimizers and optimizer is not None:  # not yet created at on_train_begin
                self._watcher.set_optimizers([optimizer])
            self._watcher.capture_at(state.global_step + 1)  # the step the Trainer will log this update as

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is None or not logs:
            return
        numbers = {k: float(v) for k, v in logs.items() if _is_number(v) and not (k == "loss" and self._streamed)}
        if "learning_rate" in numbers and (self._watcher is None or not self._watcher.optimizers):
            numbers["lr"] = numbers["learning_rate"]  # the run page's LR chart, when the Trainer hid its optimizer
        if numbers:
            self.run.log(numbers, step=state.global_step)
        nonfinite = [k for k in STOP_KEYS if k in numbers and not math.isfinite(numbers[k])]
        if getattr(self.run, "should_stop", False) or (nonfinite and self.init_args["on_nan"] == "stop"):
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        """Leave the run's uid in the checkpoint just saved, for a later ``resume_from_checkpoint``."""
        uid = getattr(self.run, "uid", None)
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if uid and folder.is_dir():
            try:
                (folder / CHECKPOINT_FILE).write_text(json.dumps({"uid": uid}))
            except OSError:
                pass

    def on_train_end(self, args, state, control, **kwargs):
        if self._loss_hook is not None:
            self._loss_hook.remove()
            self._loss_hook = None
        if self._watcher is not None:
            self._watcher.remove()
            self._watcher = None
        if self.run is not None:
            run, self.run = self.run, None
            run.finish("finished")


def _checkpoint_uid(args, state) -> str | None:
    """The run uid kept in the checkpoint a resumed Trainer starts from (``<output_dir>/checkpoint-<step>``)."""
    try:
        return json.loads((Path(args.output_dir) / f"checkpoint-{state.global_step}" / CHECKPOINT_FILE).read_text())[
            "uid"
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# A field is a secret when its name ends in one of these words (hub_token, api_key), not when it
# merely contains one (include_num_input_tokens_seen, tokenizer_name); and only a string value is.
_SECRET_FIELD = re.compile(r"(?:^|_)(?:token|password|passwd|secret|api_key|apikey|credentials?)$", re.I)


def _redacted(values: dict) -> dict:
    """TrainingArguments as config, with the string values of secret fields (hub_token ...) as ***."""
    return {
        k: (metadata.REDACTED if isinstance(v, str) and v and _SECRET_FIELD.search(k) else v) for k, v in values.items()
    }
