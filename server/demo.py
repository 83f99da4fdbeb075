"""``gradwatch demo``: a server plus real PyTorch training runs streaming into it."""

from __future__ import annotations

import math
import threading
import time

from .serve import BackgroundServer


def make_data(n: int = 1024, seed: int = 0):
    """Two interleaved spirals: a small, genuinely non-linear classification problem."""
    import torch

    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * 3 * math.pi
    label = torch.randint(0, 2, (n,), generator=g)
    sign = label.float() * 2 - 1
    x = torch.stack([t * torch.cos(t) * sign, t * torch.sin(t) * sign], 1) / 10
    return x + 0.05 * torch.randn(x.shape, generator=g), label


def make_model():
    """The demo MLP, initialised from a fixed seed (call it from one thread: the seed is global)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def train(server: str, name: str, lr: float, steps: int, delay: float, model=None,
          project: str = "demo-spirals") -> None:
    """One real training run: an MLP trained with Adam on the spirals, watched by gradwatch."""
    import torch
    from torch import nn

    import gradwatch

    model = model if model is not None else make_model()
    g = torch.Generator().manual_seed(1)  # per run: two demo threads must not share one RNG
    x, y = make_data()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    with gradwatch.init(project=project, name=name, config={"lr": lr, "optimizer": "Adam", "hidden": 64,
                                                             "steps": steps}, server=server) as run:
        run.watch(model, opt)
        for step in range(steps):
            idx = torch.randint(0, len(x), (128,), generator=g)
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            acc = (model(x).argmax(1) == y).float().mean() if step % 20 == 0 else None
            run.log({"loss": loss, **({"accuracy": acc} if acc is not None else {})})
            time.sleep(delay)


def run_demo(settings, steps: int = 600, delay: float = 0.05, keep_serving: bool = True) -> None:
    """Start the server, stream a healthy and a diverging run, then keep serving."""
    server = BackgroundServer(settings).start()
    print(f"gradwatch demo: open {server.url} in your browser (database: {settings.db_url})", flush=True)
    runs = [("baseline lr=3e-3", 3e-3), ("too-high lr=3", 3.0)]
    # Models are built here, one after the other, because weight init draws from torch's global RNG;
    # building them inside the threads made the runs (and whether the bad one diverged) a race.
    threads = [threading.Thread(target=train, args=(server.url, name, lr, steps, delay, make_model()))
               for name, lr in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("gradwatch demo: training finished.", flush=True)
    if keep_serving:
        print(f"gradwatch demo: still serving {server.url} - Ctrl-C to stop.", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    server.stop()
