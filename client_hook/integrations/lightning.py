"""PyTorch Lightning integration: ``Trainer(callbacks=[GradwatchCallback(project="p")])``.

Imports Lightning only when this module is imported (``import gradwatch`` stays light).
"""

from __future__ import annotations

try:
    import lightning.pytorch as pl
except ImportError:  # the older standalone package name
    import pytorch_lightning as pl

import gradwatch
from gradwatch import protocol

__all__ = ["GradwatchCallback"]


class GradwatchCallback(pl.Callback):
    """Streams one gradwatch run per ``Trainer.fit``.

    Records the LightningModule's hyperparameters as the config, every metric logged with
    ``self.log`` at its step (step values at each optimizer step, epoch values at epoch end),
    gradient norms per layer and global, the LR of every optimizer and memory, captured in
    ``on_before_optimizer_step`` (after AMP unscaling, BEFORE Lightning clips with
    ``gradient_clip_val``; the clipped global norm goes beside it as ``grad/global_norm_clipped``).
    The run's loss key defaults to ``train_loss`` (pass ``loss_key=`` for another name). The run
    ends finished, or failed with the exception. Checkpoints keep the run's uid: ``fit(ckpt_path=...)``
    on the same machine continues the same run.

    Args:
        project, name, config, **kwargs: passed to ``gradwatch.init`` (server, alerts, tags,
            token, all_ranks, ...); ``config`` is merged over the hyperparameters.
        on_nan: "warn", "raise" or "stop" (sets ``trainer.should_stop`` so the Trainer ends the
            fit cleanly at the step a loss went NaN/inf). With "stop" and "raise", loss metrics
            are read off the device at once so the check is not a step late.
        watch_gradients: capture gradient norms, LRs and memory (default True), and with them, from the first
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
        super().__init__()
        self.init_args = dict(project=project, name=name, on_nan=on_nan, **{"loss_key": "train_loss", **kwargs})
        self.extra_config = dict(config or {})
        self.watch_gradients = watch_gradients
        self.signals_every = signals_every
        self.run = None
        self._watcher = None
        self._seen: dict = {}
        self._batch_step = 0
        self._steps: int | None = None  # training steps: batches that stepped an optimizer (docs/gradients.md)
        self._global_at_start = 0
        self._resume_uid: str | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module) -> None:
        self._seen = {}
        args = dict(self.init_args)
        if self._resume_uid and "id" not in args:  # fit(ckpt_path=...): continue the run the checkpoint came from
            args.update(id=self._resume_uid, resume="allow")
        self.run = gradwatch.init(config=self._config(trainer, pl_module), **args)
        self._resume_uid = getattr(self.run, "uid", None)  # None: a NoopRun (another rank)

    def state_dict(self) -> dict:
        """Saved in every checkpoint: the run's uid (a fit resumed from it continues the same run) and its step."""
        return {"uid": self._resume_uid, "steps": self._steps} if self._resume_uid else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._resume_uid = state_dict.get("uid")
        self._steps = state_dict.get("steps")

    def on_train_start(self, trainer, pl_module) -> None:
        if self._steps is None:
            self._steps = trainer.global_step
        if self.run is None or not self.watch_gradients or self.run.recorder is None:  # None: a NoopRun
            return
        from gradwatch.integrations.step_watcher import StepWatcher

        scaler = getattr(trainer.precision_plugin, "scaler", None)
        self._watcher = StepWatcher(
            self.run.recorder, pl_module, trainer.optimizers, scaler=scaler, signals_every=self.signals_every
        )

    def on_fit_end(self, trainer, pl_module) -> None:
        self._end("finished")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.run is not None and not isinstance(exception, (KeyboardInterrupt, gradwatch.TrainingDiverged)):
            self.run.record_exception(exception)
        self._end("failed")

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            self._end("finished")  # no-op when on_fit_end or on_exception already ended it

    def _end(self, status: str) -> None:
        if self._watcher is not None:
            self._watcher.remove()
            self._watcher = None
        if self.run is not None:
            run, self.run = self.run, None
            run.finish(status)

    # -- gradients --------------------------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # The training step this batch contributes to: with several optimizers stepped in one batch (manual
        # optimization) it is one step, not one per optimizer (Lightning's global_step counts each).
        self._batch_step, self._global_at_start = self._steps or 0, trainer.global_step

    def _several(self, trainer, pl_module) -> bool:
        return not pl_module.automatic_optimization and len(trainer.optimizers) > 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self._watcher is not None and not self._several(trainer, pl_module):
            self._watcher.capture_at(self._batch_step)

    # -- metrics ----------------------------------------------------------------------------
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        stepped = trainer.global_step != self._global_at_start
        if stepped:
            self._steps = self._batch_step + 1
        # Like Lightning's own loggers: step metrics go out on the batch that stepped the optimizer.
        if self.run is None or not stepped and pl_module.automatic_optimization:
            return
        if self._watcher is not None and self._several(trainer, pl_module):
            self._watcher.capture_at(self._batch_step)  # every optimizer stepped: each net's fresh gradients
        if self._watcher is not None and trainer.gradient_clip_val:  # the gradients the optimizer just used
            self._watcher.record_clipped(self._batch_step)
        self._log(_fresh_metrics(trainer, True, self._seen), self._batch_step)
        if getattr(self.run, "should_stop", False):
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if self.run is not None:
            metrics = _fresh_metrics(trainer, False, self._seen)
            metrics["epoch"] = float(trainer.current_epoch)
            self._log(metrics, max((self._steps or 0) - 1, 0))

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.run is not None and not trainer.sanity_checking:
            self._log(_fresh_metrics(trainer, False, self._seen), self._steps or 0)
            if getattr(self.run, "should_stop", False):
                trainer.should_stop = True

    def _log(self, metrics: dict, step: int) -> None:
        if not metrics:
            return
        if self.init_args["on_nan"] != "warn":  # the NaN check must see the value now, not a step later
            metrics = {k: float(v) if protocol.is_loss_key(k) and hasattr(v, "item") else v for k, v in metrics.items()}
        self.run.log(metrics, step=step)

    def _config(self, trainer, pl_module) -> dict:
        config = {str(k): v for k, v in dict(getattr(pl_module, "hparams", {}) or {}).items()}
        config.setdefault(
            "trainer",
            {
                "max_epochs": trainer.max_epochs,
                "max_steps": trainer.max_steps,
                "accumulate_grad_batches": trainer.accumulate_grad_batches,
                "gradient_clip_val": trainer.gradient_clip_val,
                "precision": str(trainer.precision),
                "world_size": trainer.world_size,
                "model": type(pl_module).__name__,
            },
        )
        config.update(self.extra_config)
        return config


def _fresh_metrics(trainer, on_step: bool, seen: dict) -> dict:
    """The ``self.log`` values logged since the last call, by the name Lightning's loggers use.

    Lightning keeps a step value until it is logged again; a value already sent (the same
    tensor) is skipped, so a metric logged every other step is streamed every other step.
    The one place that reads Lightning internals (``trainer._results`` and its items): its public
    ``logged_metrics`` keeps each name's last value without saying whether it is new, so it is
    only the fallback when those internals move.
    """
    results = getattr(trainer, "_results", None)
    if results is None:
        return {}
    try:
        out = {}
        for _, item in results.valid_items():
            if not item.meta.logger or not (item.meta.on_step if on_step else item.meta.on_epoch):
                continue
            value = item._forward_cache if on_step else results._get_cache(item, False)
            marker = item._forward_cache if on_step else item._computed  # the same object until logged again
            _, name = results._forked_name(item, on_step)
            if value is None or seen.get(name) is marker:
                continue
            seen[name] = marker
            out[name] = value.detach()
        return out
    except AttributeError:  # a Lightning whose internals moved: what its loggers last got
        return dict(trainer.logged_metrics)
