"""Small real PyTorch training scripts shared by the tests (healthy runs and pathologies)."""

from __future__ import annotations

import torch
from torch import nn


def mlp(widths=(4, 16, 16, 1), act=nn.ReLU) -> nn.Sequential:
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), act()]
    return nn.Sequential(*layers[:-1])


def regression_data(n=256, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 1, generator=g)
    return x, x @ w + 0.1 * torch.randn(n, 1, generator=g)


def train(run, steps=50, lr=0.05, model=None, opt_cls=torch.optim.SGD, watch=True, loss_fn=None, seed=0):
    """A plain supervised loop that logs loss each step; returns the model."""
    torch.manual_seed(seed)
    model = model or mlp()
    x, y = regression_data(d=model[0].in_features)
    opt = opt_cls(model.parameters(), lr=lr)
    if watch:
        run.watch(model, opt)
    for _step in range(steps):
        idx = torch.randint(0, len(x), (32,))
        out = model(x[idx])
        loss = loss_fn(out, y[idx]) if loss_fn else ((out - y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    return model


def fit(run, model, opt, x, y, steps):
    """Full-batch MSE steps with watch on; returns the last loss tensor."""
    run.watch(model, opt)
    for _ in range(steps):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
    return loss


def train_slowly(server_url, steps, stop, name="live", nan_at=None, config=None, project="browser", nan_after=None):
    """A watched run at ~50 steps/s until ``stop`` is set, for pages watching it live; with ``nan_after``
    (an Event) the NaN of ``nan_at`` waits for it: the page is open and listening, however loaded the machine."""
    import time

    import gradwatch

    run = gradwatch.init(project=project, name=name, server=server_url, config=config or {}, flush_interval=0.05)
    for step, loss in slow_stream(run, steps):
        if stop.is_set():
            break
        if step == nan_at and nan_after is not None:
            nan_after.wait(timeout=120)
        run.log({"loss": float("nan") if step == nan_at else loss})
        time.sleep(0.02)
    run.finish()


def slow_stream(run, steps, seed=0):
    """(step, loss) of train_slowly's watched loop: batches of 8 random inputs from a seeded generator.

    Seeded because the loss of 8 random inputs is noisy enough that ~3 % of unseeded runs raise an early
    loss_divergence or loss_spike (simulated over 300 seeds), and a page test waiting for its NaN's alert
    then sees another kind first; seed 0 raises nothing in 1,200 steps (test_training_streams)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():  # the model's initial weights, without moving the test's global RNG
        torch.manual_seed(seed)
        model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run.watch(model, opt)
    for step in range(steps):
        loss = model(torch.randn(8, 4, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield step, loss


class Recorder:
    """Stands in for gradwatch.Run: keeps what log() and the real watch() hooks hand over, in order,
    and feeds it to the server's health rules (no server, no sockets), as the writer would."""

    def __init__(self):
        self.items: list = []
        self._step = 0
        self._watcher = None

    def watch(self, model, optimizer=None, scaler=None, every: int = 1) -> Recorder:
        from gradwatch.watcher import Watcher

        self._watcher = Watcher(self, model, optimizer, scaler, every)
        return self

    def log(self, data: dict) -> None:
        step, self._step = self._step, self._step + 1
        self.items.append(
            ("rec", step, {k: float(v.detach() if hasattr(v, "detach") else v) for k, v in data.items()}, {})
        )

    def finish(self) -> None:
        if self._watcher is not None:
            self._watcher.remove()

    # the five Recorder methods the watcher calls
    def current_step(self) -> int:
        return self._step

    def put_record(self, step, scalars, vectors) -> None:
        self.items.append(("rec", step, scalars, vectors))

    def put_layout(self, key, names) -> None:
        self.items.append(("layout", key, list(names)))

    def put_event(self, event) -> None:
        self.items.append(("event", event))

    def guarded(self, fn) -> None:
        fn()

    def records(self) -> list:
        """[("layout", key, names) | ("event", dict) | ("rec", step, scalars, {key: values with None})]"""
        from gradwatch.values import Deferred, resolve

        out = []
        for item in self.items:
            if item[0] != "rec":
                out.append(item)
                continue
            _, step, scalars, vectors = item
            plain = {k: resolve([v])[0][0] if isinstance(v, Deferred) else float(v) for k, v in scalars.items()}
            vecs = {}
            for key, (value, missing, size) in vectors.items():
                values = iter(resolve([value])[0] if isinstance(value, Deferred) else list(value))
                gone = set(missing)
                vecs[key] = [None if i in gone else next(values) for i in range(size)]
            out.append(("rec", step, plain, vecs))
        return out

    def alerts(self, batch: int = 32) -> list:
        """Every alert the server would raise for this run: records through Monitor.observe_batch in
        batches (cut where a layout changes), held alerts flushed at the end, client alert events."""
        import numpy as np

        from gradwatch_server.health import monitor as health

        monitor, layouts, alerts, chunk = health.Monitor(), {}, [], []

        def feed():
            if not chunk:
                return
            steps = np.array([r[0] for r in chunk], dtype=np.int64)
            scalars = {}
            for i, (_, sc, _) in enumerate(chunk):
                for k, v in sc.items():
                    if health.relevant(k):
                        rows, vals = scalars.setdefault(k, ([], []))
                        rows.append(i)
                        vals.append(v)
            scalars = {k: (np.array(r), np.array(v, dtype=np.float64)) for k, (r, v) in scalars.items()}
            rows = [i for i, r in enumerate(chunk) if "grad" in r[2]]
            vectors = {}
            if rows:
                vals = np.array([[np.nan if v is None else v for v in chunk[i][2]["grad"]] for i in rows])
                present = np.array([[v is not None for v in chunk[i][2]["grad"]] for i in rows], dtype=bool)
                vectors["grad"] = (
                    layouts["grad"],
                    np.array(rows),
                    vals.reshape(len(rows), -1),
                    present.reshape(len(rows), -1),
                )
            alerts.extend(monitor.observe_batch(steps, scalars, vectors))
            chunk.clear()

        for item in self.records():
            if item[0] == "layout":
                feed()
                layouts[item[1]] = item[2]
            elif item[0] == "event":
                ev = item[1]
                if ev.get("type") == "alert":
                    alerts.append(
                        health.Alert(
                            ev["kind"],
                            ev.get("step"),
                            ev.get("value"),
                            ev["severity"],
                            ev["message"],
                            layer=ev.get("layer"),
                            key=ev.get("key"),
                        )
                    )
            else:
                chunk.append(item[1:])
                if len(chunk) >= batch:
                    feed()
        feed()
        return alerts + monitor.flush()


def cnn() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(512, 2))


class SeqClassifier(nn.Module):
    """Embedding -> LSTM (or tanh RNN) -> linear head over the last state."""

    def __init__(self, vocab=30, hidden=16, out=2, cell=nn.LSTM):
        super().__init__()
        self.embed, self.rnn, self.head = (
            nn.Embedding(vocab, hidden),
            cell(hidden, hidden, batch_first=True),
            nn.Linear(hidden, out),
        )

    def forward(self, tokens):
        return self.head(self.rnn(self.embed(tokens))[0][:, -1])


class TinyTransformerLM(nn.Module):
    """A next-token model whose input embedding is registered last, as in pytorch/examples."""

    def __init__(self, vocab=40, d=32, layers=2):
        super().__init__()
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True), layers
        )
        self.decoder = nn.Linear(d, vocab)
        self.embed = nn.Embedding(vocab, d)

    def forward(self, tokens):
        return self.decoder(self.encoder(self.embed(tokens)))


def loop(run, model, opt, batch, steps, loss_fn, sched=None, clip=None, bf16=False, before=None, scaler=None):
    """A watched training loop: ``batch(step) -> (x, y)``; ``before(step)`` may change anything first."""
    run.watch(model, opt, scaler=scaler)
    for step in range(steps):
        if before is not None:
            before(step)
        x, y = batch(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        opt.zero_grad()
        (scaler.scale(loss) if scaler else loss).backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if sched is not None:
            sched.step()
        run.log({"loss": loss.float()})
    run.finish()
    return run


def demo_healthy_runs(server_url: str, timeout: float = 240.0, steps: int = 300) -> int:
    """The demo's healthy runs (all but its LR ramp), at once in threads as the demo trains them; how many."""
    import threading

    from gradwatch_server.cli import demo

    threads = [
        threading.Thread(target=demo.train, args=(server_url, name, opt, lr, sched, steps, 0.005, demo.make_model()))
        for name, opt, lr, sched in demo.RUNS
        if "ramp" not in sched
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return len(threads)
