"""``gradwatch demo``: a server plus real PyTorch training runs streaming into it.

Three runs start a few seconds apart so a newcomer sees charts appear and grow live: a healthy
Adam run with a cosine schedule, a healthy SGD run at a constant learning rate, and one whose
learning rate ramps up until the loss blows up by orders of magnitude (and gets flagged).
They log more than loss (train/ and val/ metrics, throughput) so the run page's per-prefix
metric charts have something to show. The demo writes to a database of its own.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import urllib.request
from pathlib import Path

from gradwatch_server.cli.serve import launch
from gradwatch_server.settings import add_arguments, default_db_url

RUNS = (  # name, optimizer, lr, schedule
    ("baseline adam lr=3e-3", "Adam", 3e-3, "cosine"),
    ("sgd constant lr=0.05", "SGD", 0.05, "constant"),
    ("lr ramp (diverges)", "SGD", 0.05, "ramp"),
)


def add_parser(sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="start a server and stream real demo training runs into it",
        description="Start a server and stream three real PyTorch training runs into it, a few seconds apart: "
        "two healthy ones and one whose learning rate ramps up until the loss diverges (and is "
        "flagged). Uses a database of its own (printed at start), not your default one; keeps "
        "serving after training until Ctrl-C.",
    )
    add_arguments(demo)
    demo.add_argument("--steps", type=int, default=6000, help="training steps per demo run [6000, ~5 minutes]")
    demo.add_argument("--delay", type=float, default=0.05, help="seconds to sleep per step, to watch it live [0.05]")
    demo.add_argument("--exit", action="store_true", help="exit when the demo runs end instead of serving on")


def run(args) -> int:
    return launch(
        args,
        lambda settings: run_demo(settings, steps=args.steps, delay=args.delay, keep_serving=not args.exit),
        lambda settings: settings.db_url if settings.db else f"sqlite:///{demo_db_path()}",
    )


def demo_db_path() -> Path:
    """Beside the default database, never the default database itself."""
    return Path(default_db_url()[len("sqlite:///") :]).parent / "demo.db"


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


def lr_factor(schedule: str, step: int, steps: int) -> float:
    """Multiplier on the base learning rate at ``step``. The ramp starts after a healthy stretch and
    grows ~1000x over min(350, steps/2) steps: the loss climbs orders of magnitude, visibly."""
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * step / steps))
    if schedule == "ramp":
        start = min(200, steps // 6)
        return 1000 ** (max(0, step - start) / max(30, min(350, steps // 2)))
    return 1.0


def _evaluate(model, x, y) -> tuple[float, float]:
    import torch
    from torch import nn

    with torch.no_grad():
        out = model(x)
        return nn.functional.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()


def train(
    server: str,
    name: str,
    optimizer: str,
    lr: float,
    schedule: str,
    steps: int,
    delay: float,
    model=None,
    stop: threading.Event | None = None,
    project: str = "demo-spirals",
    token: str = "",
) -> None:
    """One real training run on the spirals, watched by gradwatch, until ``steps`` or ``stop``."""
    import torch
    from torch import nn

    import gradwatch

    model = model if model is not None else make_model()
    g = torch.Generator().manual_seed(1)  # per run: demo threads must not share one RNG
    x, y = make_data()
    vx, vy = make_data(256, seed=1)
    opt = (
        torch.optim.Adam(model.parameters(), lr=lr)
        if optimizer == "Adam"
        else torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    )
    config = {"lr": lr, "optimizer": optimizer, "schedule": schedule, "hidden": 64, "batch": 128, "steps": steps}
    with gradwatch.init(
        project=project, name=name, config=config, server=server, tags=["demo"], token=token or None
    ) as run:
        run.watch(model, opt)
        started = time.perf_counter()
        for step in range(steps):
            if stop is not None and stop.is_set():
                break
            for group in opt.param_groups:
                group["lr"] = lr * lr_factor(schedule, step, steps)
            idx = torch.randint(0, len(x), (128,), generator=g)
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            metrics = {"loss": loss}
            if not math.isfinite(loss.item()) and _flagged(server, run.id, token, step):
                # Past here the ramp only overflows (torch raises on the next steps): stop, and say why.
                run.log(metrics)
                print(f"gradwatch demo: {name!r} went non-finite at step {step} and is flagged: stopped.", flush=True)
                break
            if step % 20 == 0:
                metrics["train/accuracy"] = _evaluate(model, x, y)[1]
                metrics["train/samples_per_s"] = 128 * (step + 1) / (time.perf_counter() - started)
            if step % 50 == 0:
                metrics["val/loss"], metrics["val/accuracy"] = _evaluate(model, vx, vy)
            run.log(metrics)
            time.sleep(delay)


_CHECKED: dict[int, int] = {}  # run id -> the step its alerts were last asked for


def _flagged(server: str, run_id: int, token: str, step: int) -> bool:
    """Whether the server has raised an alert on the run (asked at most every 10 steps)."""
    if step - _CHECKED.get(run_id, -100) < 10:
        return False
    _CHECKED[run_id] = step
    request = urllib.request.Request(f"{server}/api/runs/{run_id}/alerts")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return bool(json.load(resp))
    except OSError:
        return False  # the server is busy or gone: keep training, ask again later


def train_quietly(name: str, *args, **kwargs) -> None:
    """train(), with a failure as one line on the terminal instead of a thread's traceback."""
    try:
        train(*args, **kwargs)
    except Exception as exc:  # the demo's own runs: say what stopped one, keep the others going
        print(f"gradwatch demo: {name!r} stopped: {type(exc).__name__}: {exc}", flush=True)


def _database(settings):
    """The demo's own SQLite file (fresh each time) unless --db names one."""
    if settings.db:
        return settings
    path = demo_db_path()
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return dataclasses.replace(settings, db=f"sqlite:///{path}")


def run_demo(settings, steps: int = 6000, delay: float = 0.05, keep_serving: bool = True) -> None:
    """Start the server, stream the demo runs a few seconds apart, then keep serving until Ctrl-C."""
    from gradwatch_server.serve import BackgroundServer

    settings = _database(settings)
    server = BackgroundServer(settings).start()
    print(f"gradwatch demo: open {server.login_link() if settings.token else server.url} in your browser", flush=True)
    print(f"gradwatch demo: database {settings.db_url} (the demo's own; your runs are elsewhere)", flush=True)
    stop = threading.Event()
    stagger = min(4.0, steps * delay / 10)  # seconds between run starts: a newcomer sees runs appear
    # Models are built here, one after the other, because weight init draws from torch's global RNG;
    # building them inside the threads made the runs (and whether the bad one diverged) a race.
    # Daemon threads: Ctrl-C never waits on a training step or a slow flush to end the process.
    threads = [
        threading.Thread(
            target=train_quietly,
            args=(name, server.url, name, opt, lr, sched, steps, delay, make_model(), stop),
            kwargs={"token": settings.token},
            daemon=True,
        )
        for name, opt, lr, sched in RUNS
    ]
    try:
        for i, t in enumerate(threads):
            if i and stop.wait(stagger):
                break
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(0.2)
        print("gradwatch demo: training finished.", flush=True)
        if keep_serving:
            print(f"gradwatch demo: still serving {server.url} - Ctrl-C to stop.", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("\ngradwatch demo: stopping...", flush=True)
        stop.set()
        deadline = time.monotonic() + 3  # the runs get a moment to say they finished, not more
        try:
            for t in threads:
                if t.ident is not None:  # started (Ctrl-C may come before the last run starts)
                    t.join(timeout=max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop now
    finally:
        server.stop()
