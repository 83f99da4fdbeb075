"""How the loss rules judge a run's first steps: healthy small-batch runs (whose first losses are noisy) against
runs that blow up from the start (a learning rate too high), real CPU PyTorch loops fed to the server's rules.

Healthy kinds: a model's squared output on 8 random inputs (the page tests' live stream), MSE regression at
batch 4 with raw targets (its per-batch losses span 100x), cross-entropy at batch 8, nanoGPT's loop in small
(tests/nanogpt_shaped.py) as configured to train. Blow-ups: MSE regression with SGD at lr 1-3, cross-entropy
with Adam at lr 1-5, the nanoGPT loop at lr 0.3-1 without clipping. A *false alarm* is any loss_divergence or
loss_spike in a healthy run; a run *blew up* when a loss is NaN or over 3x its first (a nanoGPT at lr 0.5 peaks
~4x: 4.8 -> 20.6), and is *caught* when loss_divergence is raised; *lead* is the blow-up's step minus the
alert's.

Seeds: ``--split tune`` (0-99) is where the rule is tried; ``--split held-out`` (1000-1099, the default) is
what docs/benchmarks.md reports; no test uses either.

    python benchmarks/early_divergence.py [--split held-out|tune] [--runs 100]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # nanogpt_shaped: nanoGPT's loop in small
import nanogpt_shaped  # noqa: E402

from gradwatch_server.health import monitor as health  # noqa: E402

SPLITS = {"tune": 0, "held-out": 1000}
STEPS = 40
LOSS_KINDS = {"loss_divergence", "loss_spike"}
BLOWUP = 3.0


def _mlp(out: int = 1) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, out))


def _losses(seed: int, task: str, opt, lr: float, batch: int) -> list[float]:
    """The first STEPS losses of one seeded loop."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = _mlp(3 if task == "ce" else 1)
    w = torch.randn(4, 1, generator=gen)
    optimizer = opt(model.parameters(), lr=lr)
    out = []
    for _ in range(STEPS):
        x = torch.randn(batch, 4, generator=gen)
        if task == "output":
            loss = model(x).pow(2).mean()
        elif task == "mse":
            loss = F.mse_loss(model(x), x @ w + 0.1 * torch.randn(batch, 1, generator=gen))
        else:
            loss = F.cross_entropy(model(x), (x[:, 0] > 0).long() + (x[:, 1] > 1).long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append(loss.item())
    return out


def _lr(seed: int, lo: float, hi: float) -> float:
    return lo * (hi / lo) ** ((seed * 0.6180339887) % 1.0)  # spread over [lo, hi] on a log scale, per seed


class _Losses:
    """A stand-in run for nanogpt_shaped.train: it only needs watch() and log()."""

    def watch(self, *args, **kwargs):
        return self

    def log(self, *args, **kwargs):
        return None


def _gpt(seed: int, lr: float, warmup: int, clip: float) -> list[float]:
    return nanogpt_shaped.train(
        _Losses(), lr=lr, warmup=warmup, clip=clip, steps=STEPS // 2, seed=seed, batch=8, block=32
    )


HEALTHY = {
    "squared output, batch 8, SGD 0.01": lambda s: _losses(s, "output", torch.optim.SGD, 0.01, 8),
    "MSE, batch 4, SGD 0.02": lambda s: _losses(s, "mse", torch.optim.SGD, 0.02, 4),
    "cross-entropy, batch 8, Adam 3e-3": lambda s: _losses(s, "ce", torch.optim.Adam, 3e-3, 8),
    "nanoGPT-shaped, AdamW 1e-3, warmup 5, clip 1": lambda s: _gpt(s, 1e-3, 5, 1.0),
}
BLOWUPS = {
    "MSE, batch 32, SGD lr 1-3": lambda s: _losses(s, "mse", torch.optim.SGD, _lr(s, 1.0, 3.0), 32),
    "cross-entropy, batch 32, Adam lr 1-5": lambda s: _losses(s, "ce", torch.optim.Adam, _lr(s, 1.0, 5.0), 32),
    "nanoGPT-shaped, AdamW lr 0.3-1, warmup 5, no clip": lambda s: _gpt(s, _lr(s, 0.3, 1.0), 5, 0.0),
}


def alerts(losses: list[float]) -> list:
    """The loss rules' alerts on one run's losses, record by record as the writer feeds them."""
    monitor, out = health.Monitor(), []
    for step, value in enumerate(losses):
        out += [a for a in monitor.observe(step, {"loss": value}, {}) if a.kind in LOSS_KINDS and a.message]
    return out


def blowup_step(losses: list[float]) -> int | None:
    """The first loss NaN or over BLOWUP x the first (a nanoGPT at lr 0.5 peaks ~4x: 4.8 -> 20.6)."""
    return next((i for i, v in enumerate(losses) if not math.isfinite(v) or v > BLOWUP * losses[0]), None)


def score(seeds: range) -> dict:
    """kind -> {"runs", "alarms"} for healthy kinds, {"runs", "blew", "caught", "lead"} for blow-ups."""
    torch.set_num_threads(1)
    table = {}
    for name, make in HEALTHY.items():
        table[name] = {"runs": len(seeds), "alarms": sum(bool(alerts(make(s))) for s in seeds)}
    for name, make in BLOWUPS.items():
        row = {"runs": len(seeds), "blew": 0, "caught": 0, "lead": []}
        for s in seeds:
            losses = make(s)
            at = blowup_step(losses)
            if at is None:
                continue
            row["blew"] += 1
            hit = [a.step for a in alerts(losses) if a.kind == "loss_divergence"]
            if hit:
                row["caught"] += 1
                row["lead"].append(at - hit[0])
        table[name] = row
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=sorted(SPLITS), default="held-out")
    parser.add_argument("--runs", type=int, default=100, help="runs of each kind [100]")
    args = parser.parse_args()
    seeds = range(SPLITS[args.split], SPLITS[args.split] + args.runs)
    table = score(seeds)
    print(f"{args.split} seeds {seeds.start}-{seeds.stop - 1}\n")
    print("| run | false alarms | blew up | caught | lead, steps p50 / min |")
    print("|---|---|---|---|---|")
    for name, row in table.items():
        if "alarms" in row:
            print(f"| {name} | {row['alarms']} / {row['runs']} | - | - | - |")
        else:
            lead = row["lead"]
            spread = f"{statistics.median(lead):.0f} / {min(lead)}" if lead else "-"
            print(f"| {name} | - | {row['blew']} / {row['runs']} | {row['caught']} | {spread} |")


if __name__ == "__main__":
    main()
