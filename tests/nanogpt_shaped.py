"""A nanoGPT-shaped training loop written here (char-level GPT, AdamW, linear warmup, optional clipping), for
the early blow-up tests when karpathy/nanoGPT itself is not checked out (benchmarks/nanogpt_alert.py runs that)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

CHAR_TEXT = Path(__file__).resolve().parent / "data" / "char_text.txt"  # what char_data trains on


def char_data(limit: int = 200_000) -> tuple[torch.Tensor, int]:
    """A fixed text (a snapshot of this repo's docs; a local stand-in for tiny Shakespeare) and its vocabulary size.

    A file of its own, not docs/ as they are: editing the docs must not change the trajectory the tests train.
    """
    text = CHAR_TEXT.read_text()[:limit]
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), len(chars)


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int = 64, layers: int = 2, heads: int = 2, block: int = 64):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as nanoGPT
        for m in self.modules():  # nanoGPT's init: N(0, 0.02), zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def train(run, lr: float, warmup: int, clip: float, steps: int, seed: int = 1337, batch: int = 12, block: int = 64):
    """nanoGPT's loop in small: get_lr's linear warmup then cosine decay, AdamW (0.9, 0.99), clip if ``clip``."""
    torch.manual_seed(seed)
    data, vocab = char_data()
    model = TinyGPT(vocab, block=block)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
    run.watch(model, opt)
    losses = []
    for it in range(steps):
        if it < warmup:
            now = lr * (it + 1) / (warmup + 1)
        else:
            now = 0.1 * lr + 0.5 * (1 + math.cos(math.pi * (it - warmup) / max(1, steps - warmup))) * 0.9 * lr
        for group in opt.param_groups:
            group["lr"] = now
        ix = torch.randint(len(data) - block - 1, (batch,))
        x = torch.stack([data[i : i + block] for i in ix.tolist()])
        y = torch.stack([data[i + 1 : i + 1 + block] for i in ix.tolist()])
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        run.log({"loss": loss})
        losses.append(float(loss.detach()))
    return losses
