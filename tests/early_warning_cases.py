"""Real CPU training runs for the early-warning corpus: runs that diverge after a long healthy stretch, and sound
aggressive recipes that must stay quiet. Each case returns the ``training.Recorder`` it trained through."""

from __future__ import annotations

import math

import torch
from torch import nn
from training import Recorder, mlp, regression_data

F = nn.functional


def _run(model, opt, batch, steps, loss_fn, lr_at=None, sched=None, clip=None, stop_at=1e6):
    """A watched loop; ``lr_at(step)`` sets the LR; it stops early once the loss passes ``stop_at`` x its start."""
    rec = Recorder().watch(model, opt)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only contend (20x slower on a loaded 2-core machine)
    try:
        _loop(rec, model, opt, batch, steps, loss_fn, lr_at, sched, clip, stop_at)
    finally:
        torch.set_num_threads(threads)
        rec.finish()
    return rec


def _loop(rec, model, opt, batch, steps, loss_fn, lr_at, sched, clip, stop_at):
    first = None
    for step in range(steps):
        if lr_at is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
        x, y = batch(step)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        rec.log({"loss": loss.detach()})
        value = float(loss.detach())
        first = value if first is None else first
        if not math.isfinite(value) or value > stop_at * first:
            break


def _regression_batches(seed=0, d=4, bs=32):
    x, y = regression_data(seed=seed, d=d)
    g = torch.Generator().manual_seed(seed)
    return lambda step: (lambda i: (x[i], y[i]))(torch.randint(0, len(x), (bs,), generator=g))


def _mse(out, y):
    return ((out - y) ** 2).mean()


class Lm(nn.Module):
    """A small decoder LM with hand-written attention, so q and k projections are modules of their own."""

    def __init__(self, vocab=16, d=16, layers=2, heads=2):
        super().__init__()
        self.embed, self.heads = nn.Embedding(vocab, d), heads
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln1": nn.LayerNorm(d),
                    "q": nn.Linear(d, d),
                    "k": nn.Linear(d, d),
                    "v": nn.Linear(d, d),
                    "o": nn.Linear(d, d),
                    "ln2": nn.LayerNorm(d),
                    "up": nn.Linear(d, 4 * d),
                    "down": nn.Linear(4 * d, d),
                }
            )
            for _ in range(layers)
        )
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        h = self.embed(tokens)
        n, t, d = h.shape
        mask = torch.triu(torch.full((t, t), -math.inf), 1)
        for b in self.blocks:
            x = b["ln1"](h)
            q, k, v = (b[name](x).view(n, t, self.heads, -1).transpose(1, 2) for name in ("q", "k", "v"))
            att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + mask
            h = h + b["o"]((att.softmax(-1) @ v).transpose(1, 2).reshape(n, t, d))
            h = h + b["down"](F.gelu(b["up"](b["ln2"](h))))
        return self.head(h)


def _lm_batches(seed=0, vocab=16, t=8, bs=8):
    g = torch.Generator().manual_seed(seed)

    # A learnable sequence task: each token is the previous one plus a per-sequence stride.
    def batch(step):
        start = torch.randint(0, vocab, (bs, 1), generator=g)
        stride = torch.randint(1, 4, (bs, 1), generator=g)
        seq = (start + stride * torch.arange(t + 1)) % vocab
        return seq[:, :-1], seq[:, 1:]

    return batch


def _lm_loss(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


# -- runs that diverge after a long healthy stretch -----------------------------------------------------------
def lr_ramp():
    """MLP, SGD, LR raised 3 % a step from 1e-4 (a schedule bug, or a range test left on)."""
    torch.manual_seed(0)
    model = mlp((4, 32, 32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    return _run(model, opt, _regression_batches(), 400, _mse, lr_at=lambda s: 1e-4 * 1.03**s)


def lm_warmup_too_high():
    """Small Transformer LM, AdamW, linear warmup over 300 steps to a peak LR of 0.3 (far too high)."""
    torch.manual_seed(0)
    model = Lm()
    opt = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.0)
    return _run(model, opt, _lm_batches(), 300, _lm_loss, lr_at=lambda s: 0.3 * min(1.0, (s + 1) / 300))


def deep_no_clip():
    """A 12-layer tanh MLP, SGD with momentum and no clipping, LR warmed up over 300 steps to too high a peak."""
    torch.manual_seed(0)
    model = mlp((4,) + (64,) * 12 + (1,), act=nn.Tanh)
    opt = torch.optim.SGD(model.parameters(), lr=0.0, momentum=0.9)
    return _run(model, opt, _regression_batches(), 300, _mse, lr_at=lambda s: 0.2 * min(1.0, (s + 1) / 300))


def attention_logit_growth():
    """Small Transformer LM, Adam at a constant high LR without qk-norm: attention logits grow until it breaks."""
    torch.manual_seed(0)
    model = Lm()
    opt = torch.optim.Adam(model.parameters(), lr=0.0)
    return _run(model, opt, _lm_batches(), 300, _lm_loss, lr_at=lambda s: 0.02 * 1.01**s)


# -- sound aggressive recipes -----------------------------------------------------------------------------------
def high_stable_sgd():
    """MLP, plain SGD at a high but stable LR (0.1) for 300 steps."""
    torch.manual_seed(0)
    model = mlp((4, 32, 32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return _run(model, opt, _regression_batches(), 300, _mse)


def warmup_cosine_wd():
    """Transformer LM, AdamW with weight decay 0.1, warmup then cosine decay: gradient norms rise late, soundly."""
    torch.manual_seed(0)
    model = Lm()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    steps, warm = 300, 30

    def lr_at(s):
        if s < warm:
            return 3e-3 * (s + 1) / warm
        return 3e-3 * 0.5 * (1 + math.cos(math.pi * (s - warm) / (steps - warm)))

    return _run(model, opt, _lm_batches(), steps, _lm_loss, lr_at=lr_at)


def converge_to_zero():
    """An over-parameterised MLP fitting 32 noiseless points with Adam: the loss goes to ~0."""
    torch.manual_seed(0)
    model = mlp((4, 64, 64, 1))
    x = torch.randn(32, 4)
    y = x @ torch.randn(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return _run(model, opt, lambda s: (x, y), 400, _mse)


DIVERGING = {
    "LR ramp 3 %/step (MLP, SGD)": lr_ramp,
    "warmup to a too-high peak (Transformer, AdamW)": lm_warmup_too_high,
    "deep tanh MLP, no clipping, momentum": deep_no_clip,
    "attention-logit growth (Transformer, Adam)": attention_logit_growth,
}
SOUND = {
    "high stable SGD (lr 0.1)": high_stable_sgd,
    "warmup + cosine + weight decay (Transformer)": warmup_cosine_wd,
    "converging to ~0 loss (MLP, Adam)": converge_to_zero,
}
