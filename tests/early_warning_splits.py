"""Two splits of real CPU training runs for the early-warning rule: ``dev`` (the rule is tuned on it) and ``test``
(scored only: docs/alerts.md's table, benchmarks/early_warning_corpus.py). Different seeds, widths, optimizers and
schedule constants per split; the same shapes: an SGD LR ramp, Adam with a geometrically rising LR on a task it
fits almost perfectly, a warmup to a too-high peak held there (Adam on a small LM), a deep tanh MLP without
clipping, SGD with momentum under a ramp; and aggressive recipes that should stay quiet. A run's label is what it did: it blew up (NaN/inf or
10x its first loss) within its steps, or it did not."""

from __future__ import annotations

import torch
from early_warning_cases import Lm, _lm_batches, _lm_loss, _mse, _run
from training import mlp

SPLITS = {  # per split: seeds, MLP width, the optimizers and the schedule constants
    "dev": {"seed": 0, "width": 16, "adam": torch.optim.Adam, "rates": (1.03, 1.036, 1.042, 1.048, 1.054)},
    "test": {"seed": 100, "width": 24, "adam": torch.optim.AdamW, "rates": (1.033, 1.039, 1.045, 1.051, 1.057)},
}
STEPS = 300


def _fit_data(seed: int, d: int = 4, n: int = 256, noise: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = x @ torch.randn(d, 1, generator=g) + noise * torch.randn(n, 1, generator=g)
    return lambda step: (lambda i: (x[i], y[i]))(torch.randint(0, n, (32,), generator=g))


def cases(split: str) -> dict:
    """name -> a function training that run and returning its Recorder (45 runs, built lazily)."""
    p = SPLITS[split]
    s0, w, adam = p["seed"], p["width"], p["adam"]
    out = {}
    for i, r in enumerate(p["rates"]):
        seed = s0 + i
        out[f"sgd ramp x{r}/step"] = lambda seed=seed, r=r: _mlp_run(
            seed, w, torch.optim.SGD, 1e-3, lambda s: 1e-3 * r**s
        )
        out[f"adam rising x{r}/step on a near-perfect fit"] = lambda seed=seed, r=r: _mlp_run(
            seed, w, adam, 1e-3, lambda s: 1e-3 * r**s
        )
        peak = 0.1 + 0.05 * i + (0.02 if split == "test" else 0.0)
        out[f"warmup 10 to peak {peak:g} (LM)"] = lambda seed=seed, peak=peak: _lm_run(
            seed, adam, lambda s: peak * min(1.0, (s + 1) / 10)
        )
        out[f"deep tanh, momentum, lr ramp x{r}"] = lambda seed=seed, r=r: _deep_run(seed, w, r)
        out[f"sgd momentum ramp x{r}/step"] = lambda seed=seed, r=r: _mlp_run(
            seed + 50,
            w,
            lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9),
            1e-4,
            lambda s: 1e-4 * r**s,
            noise=0.1,
        )
        # the quiet ones: aggressive but sound
        out[f"sgd constant {0.05 + 0.01 * i:g}"] = lambda seed=seed, i=i: _mlp_run(
            seed, w, torch.optim.SGD, 0.05, lambda s: 0.05 + 0.01 * i, noise=0.1
        )
        out[f"adam warmup+cosine peak {3e-3 * (i + 1):g} (LM)"] = lambda seed=seed, i=i: _lm_run(
            seed,
            adam,
            lambda s: 3e-3 * (i + 1) * min((s + 1) / 30, 0.5 * (1 + __import__("math").cos(3.14159 * s / STEPS))),
        )
        out[f"adam converging to ~0, lr {1e-3 * (i + 1):g}"] = lambda seed=seed, i=i: _mlp_run(
            seed, w, adam, 1e-3 * (i + 1), lambda s: 1e-3 * (i + 1)
        )
        out[f"sgd ramp capped at {0.02 * (i + 1):g}"] = lambda seed=seed, r=r, i=i: _mlp_run(
            seed, w, torch.optim.SGD, 1e-3, lambda s: min(0.02 * (i + 1), 1e-3 * r**s), noise=0.1
        )
    return out


def _mlp_run(seed, width, opt_cls, lr, lr_at, noise=0.0):
    torch.manual_seed(seed)
    model = mlp((4, width, width, 1))
    return _run(model, opt_cls(model.parameters(), lr=lr), _fit_data(seed, noise=noise), STEPS, _mse, lr_at=lr_at)


def _lm_run(seed, opt_cls, lr_at):
    torch.manual_seed(seed)
    model = Lm()
    return _run(model, opt_cls(model.parameters(), lr=0.0), _lm_batches(seed), STEPS, _lm_loss, lr_at=lr_at)


def _deep_run(seed, width, r):
    torch.manual_seed(seed)
    model = mlp((4, *([width] * 8), 1), act=torch.nn.Tanh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return _run(model, opt, _fit_data(seed, noise=0.1), STEPS, _mse, lr_at=lambda s: 1e-3 * r**s)
