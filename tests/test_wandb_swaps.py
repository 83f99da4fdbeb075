"""nanoGPT and pytorch/examples' DCGAN, written for W&B, with ``import gradwatch as wandb``: benchmarks/wandb_swaps.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_benchmark

NANOGPT, DCGAN = Path("/work/ext/nanoGPT"), Path("/work/ext/pytorch-examples/dcgan")


@pytest.mark.slow
@pytest.mark.skipif(
    not (NANOGPT / "train.py").exists() or not (DCGAN / "main.py").exists(),
    reason="no copy of nanoGPT / pytorch examples here",
)
def test_nanogpt_and_dcgan_run_with_the_one_line_swap():
    out = run_benchmark("wandb_swaps.py", "--nanogpt", str(NANOGPT), "--dcgan", str(DCGAN), timeout=900)
    assert "OK: both scripts ran" in out
