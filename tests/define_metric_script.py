"""A W&B-style script that defines metrics (tests/test_wandb_define_metric.py): x axes and summaries.

The values are fixed (not trained), so their min / max / mean / last are known.
"""

import gradwatch as wandb

VAL_LOSS = [0.9, 0.5, 0.7]
VAL_ACC = [0.2, 0.8, 0.6]
TRAIN_LOSS = [float(i + 1) for i in range(12)]  # mean 6.5

wandb.init(project="define-metric", name="defined")
wandb.define_metric("epoch")
wandb.define_metric("val/*", step_metric="epoch", summary="min")
wandb.define_metric("val/acc", step_metric="epoch", summary="max")  # its own name wins over the glob
wandb.define_metric("train/loss", summary="mean")
wandb.define_metric("train/both", summary="min,max")
wandb.define_metric("train/last", summary="last")
for step in range(12):
    wandb.log({"train/loss": TRAIN_LOSS[step], "train/both": float(step % 5), "train/last": 100.0 - step}, step=step)
    if step % 4 == 3:
        epoch = step // 4
        wandb.log({"epoch": float(epoch + 10), "val/loss": VAL_LOSS[epoch], "val/acc": VAL_ACC[epoch]}, step=step)
wandb.finish()
