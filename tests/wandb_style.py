"""A training script written for W&B, every call tests/test_wandb.py checks, with only the import changed.

Run: python tests/wandb_style.py [steps]   (GRADWATCH_SERVER says where; GRADWATCH_MODE=disabled: no server)
"""

import argparse
import sys

import numpy as np
import torch
from torch import nn

import gradwatch as wandb

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

torch.manual_seed(0)
run = wandb.init(
    project="wandb-style",
    name="drop-in",
    entity="my-team",
    group="sweep-a",
    job_type="train",
    tags=["baseline"],
    notes="the W&B surface",
    config={"model": {"width": 16, "depth": 2}},
    reinit=True,
    settings={"_disable_stats": True},
    save_code=True,
    some_future_argument=1,
)
wandb.config.update(args)  # an argparse.Namespace, as W&B scripts do
wandb.config.batch = 32
wandb.config["optimizer"] = "sgd"
wandb.config.setdefaults({"batch": 64, "seed": 0})
model = nn.Sequential(nn.Linear(8, wandb.config.model["width"]), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=wandb.config.lr)
wandb.watch(model, log="all", log_freq=3)
wandb.define_metric("epoch")
wandb.define_metric("val/*", step_metric="epoch", summary="min")
table = wandb.Table(columns=["step", "prediction", "label"])
for step in range(args.steps):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    wandb.log({"train/loss": loss, "lr": opt.param_groups[0]["lr"]}, commit=False)
    wandb.log({"grads": wandb.Histogram(model[0].weight.grad), "extra": {"a": 1.0, "b": {"c": 2.0}}})
    table.add_data(step, loss.item(), "x")
    if step % 4 == 3:
        epoch = step // 4
        sample = (torch.rand(3, 12, 12) * (epoch + 1) / 4).clamp(0, 1)
        wandb.log(
            {
                "epoch": epoch,
                "val/loss": loss.item() * 1.1,
                "samples": [wandb.Image(sample, caption=f"epoch {epoch}"), wandb.Image(np.zeros((6, 6)))],
                "note": f"epoch {epoch} done",
                "weights_np": np.random.randn(100),
            }
        )
run.summary["best_val"] = 0.25
wandb.summary.update({"final_loss": loss.item()})
wandb.log({"predictions": table})
wandb.alert(title="done training", text=f"{args.steps} steps", level="INFO")
wandb.save("*.pt")
artifact = wandb.Artifact("model", type="model")
artifact.add_file(__file__)
run.log_artifact(artifact)
wandb.use_artifact("dataset:latest")
print("run", wandb.run.id if wandb.run else None, file=sys.stderr)
wandb.finish(exit_code=0)
