"""Scripts written for W&B, unchanged but for ``import gradwatch as wandb``: the calls they make, mapped (docs/wandb.md)."""
