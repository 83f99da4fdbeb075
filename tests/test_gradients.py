"""The right gradients on the shapes real scripts have (issue #27), each on a real CPU training loop:
clipping (nanoGPT's loop), two models in one run (a GAN), closures (LBFGS), AMP skipped steps, update ratios
of zero-initialised parameters, worker processes, and where log() and run.step go."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import wait_runs
from torch import nn

import gradwatch


def series(api, key, rid=1):
    return api.get(f"/api/runs/{rid}/series?key={key}")


class TinyGPT(nn.Module):
    """nanoGPT's shape in miniature: token and position embeddings, one attention block, LayerNorm, tied head."""

    def __init__(self, vocab=32, n_embd=16, block=8):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
        self.ln_1, self.ln_f = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = x + self.mlp(x)
        logits = self.head(self.ln_f(x))
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def nanogpt_loop(run, iters=12, accum=2, clip=1.0):
    """nanoGPT's train.py loop: two AdamW groups (decay / no decay), micro-steps, unscale_, clip, scaler.step."""
    torch.manual_seed(0)
    model = TinyGPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], 1e-2)
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # nanoGPT: enabled only for float16
    run.watch(model, opt)  # the README's line
    data = torch.randint(0, 32, (64, 9))
    returned = []
    for it in range(iters):
        for micro in range(accum):
            batch = data[(it * accum + micro) % 8 * 8 :][:8]
            loss = model(batch[:, :-1], batch[:, 1:]) / accum
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        run.log({"loss": loss.item() * accum})  # the README's line
    return returned


def test_a_clipped_nanogpt_loop_stores_the_norm_clip_grad_norm_returned(server, api):
    run = gradwatch.init(project="g", name="nanogpt", server=server.url)
    returned = nanogpt_loop(run)
    assert run.step == 11  # after 12 steps the next log() without step= goes to step 11
    run.finish(timeout=10)
    wait_runs(api)
    norms = series(api, "grad/global_norm")
    assert norms["steps"] == list(range(12)) and norms["values"] == pytest.approx(returned, rel=1e-4)
    assert max(returned) > 1.0  # the clip did bite: the chart is not a flat line at 1.0
    clipped = series(api, "grad/global_norm_clipped")["values"]
    assert clipped == pytest.approx([n * min(1.0, 1.0 / (n + 1e-6)) for n in returned], rel=1e-4)
    assert set(series(api, "grad/clip_threshold")["values"]) == {1.0}
    # Per layer too: the layer norms are pre-clip, so they add up (in squares) to the pre-clip global norm.
    keys = api.get("/api/runs/1/keys")
    layers = [k for k in keys if k.startswith("grad/") and k.endswith(("weight", "bias"))]
    last = [series(api, k)["values"][-1] for k in layers]
    assert math.sqrt(sum(v * v for v in last)) == pytest.approx(returned[-1], rel=1e-4)
    # Two AdamW groups at one learning rate: one line.
    assert "lr" in keys and not any(k.startswith("lr/") for k in keys)
    run_row = api.get("/api/runs/1")
    assert run_row["last_step"] == 11  # the last step the script logged at (system counters included)


def test_two_models_in_one_run_keep_both_heatmaps_and_one_step_per_iteration(server, api):
    torch.manual_seed(0)
    net_d = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    net_g = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 4))
    opt_d = torch.optim.Adam(net_d.parameters(), lr=2e-3)
    opt_g = torch.optim.Adam(net_g.parameters(), lr=1e-3)
    run = gradwatch.init(project="g", name="gan", server=server.url)
    run.watch(net_d, opt_d, name="D")
    run.watch(net_g, opt_g, name="G")  # adds: the discriminator stays watched
    bce = nn.BCEWithLogitsLoss()
    for _ in range(10):  # pytorch/examples dcgan's iteration: D on real and fake, then G
        real, z = torch.randn(16, 4) + 2, torch.randn(16, 2)
        fake = net_g(z)
        opt_d.zero_grad()
        err_d = bce(net_d(real), torch.ones(16, 1)) + bce(net_d(fake.detach()), torch.zeros(16, 1))
        err_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        err_g = bce(net_d(fake), torch.ones(16, 1))
        err_g.backward()
        opt_g.step()
        run.log({"loss_D": err_d, "loss_G": err_g})
    run.finish(timeout=10)
    wait_runs(api)
    keys = set(api.get("/api/runs/1/keys"))
    assert {"grad/D.0.weight", "grad/D.2.bias", "grad/G.0.weight", "grad/G.2.bias"} <= keys  # both heatmaps
    for key in ("loss_D", "grad/global_norm", "grad/global_norm/D", "grad/global_norm/G", "grad/D.0.weight"):
        assert series(api, key)["steps"] == list(range(10)), key  # one step per iteration, not two
    g0 = series(api, "grad/G.0.weight")
    assert g0["steps"] == list(range(10)) and all(v is not None and v > 0 for v in g0["values"])
    run_norm = series(api, "grad/global_norm")["values"]
    d, g = series(api, "grad/global_norm/D")["values"], series(api, "grad/global_norm/G")["values"]
    assert run_norm == pytest.approx([math.hypot(a, b) for a, b in zip(d, g)], rel=1e-5)
    assert {"lr/D", "lr/G"} <= keys


def test_watch_takes_lists_of_models_and_optimizers(server, api):
    nets = [nn.Linear(3, 3), nn.Linear(3, 1)]
    opts = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
    run = gradwatch.init(project="g", name="lists", server=server.url)
    run.watch(nets, opts)
    for _ in range(4):
        for net, opt in zip(nets, opts):
            opt.zero_grad()
            net(torch.randn(8, 3)).pow(2).mean().backward()
            opt.step()
        run.log({"loss": 1.0})
    run.finish(timeout=10)
    wait_runs(api)
    keys = set(api.get("/api/runs/1/keys"))
    assert {"grad/0.weight", "grad/1.weight", "grad/global_norm/0", "grad/global_norm/1"} <= keys
    assert series(api, "grad/global_norm")["steps"] == series(api, "loss")["steps"] == list(range(4))


def test_lbfgs_closures_capture_the_closures_gradients_and_their_logs_belong_to_the_step(server, api):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))  # time_sequence_prediction's shape
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    run = gradwatch.init(project="g", name="lbfgs", server=server.url)
    run.watch(model, opt)
    x = torch.linspace(-2, 2, 64).unsqueeze(1)
    y = torch.sin(x)
    calls = []

    def closure():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        calls.append(run.step)
        run.log({"closure_loss": loss})  # inside the step: it belongs to the step being taken
        return loss

    for _ in range(3):
        opt.step(closure)
        run.log({"loss": nn.functional.mse_loss(model(x), y)})
    run.finish(timeout=10)
    wait_runs(api)
    assert sorted(set(calls)) == [0, 1, 2] and len(calls) > 3  # several closure calls per step
    inside = series(api, "closure_loss")["steps"]
    assert inside == sorted(calls) and series(api, "loss")["steps"] == [0, 1, 2]  # every closure log, at its step
    layers = [k for k in api.get("/api/runs/1/keys") if k.startswith("grad/") and k[5].isdigit()]
    assert len(layers) == 4
    for key in layers:  # step 0 has every gradient (the closure's), none missing
        got = series(api, key)
        assert got["steps"] == [0, 1, 2] and all(v is not None and v > 0 for v in got["values"])
    assert series(api, "grad/missing_count")["values"] == [0.0, 0.0, 0.0]


def test_a_step_gradscaler_skips_is_marked_and_the_steps_go_on(server, api):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    run = gradwatch.init(project="g", name="amp", server=server.url)
    run.watch(model, opt, scaler=scaler)
    for it in range(6):
        opt.zero_grad()
        loss = model(torch.randn(8, 4)).pow(2).mean() * (math.inf if it == 2 else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)  # skipped at it == 2: the gradients are inf
        scaler.update()
        run.log({"loss": loss})
    run.finish(timeout=10)
    wait_runs(api)
    assert series(api, "loss")["steps"] == list(range(6))  # the skipped step is a step: nothing lands twice
    skipped = series(api, "amp/skipped")
    assert skipped["steps"] == [2] and skipped["values"] == [1.0]
    assert 2 not in series(api, "grad/global_norm")["steps"]  # no zero drawn for the skipped step
    scale = series(api, "amp/scale")
    assert scale["steps"] == list(range(6)) and scale["values"][2] < scale["values"][1]  # the scale dropped there


def test_update_ratios_of_zero_initialised_parameters_are_finite(server, api):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    nn.init.zeros_(model[0].bias)  # BatchNorm's bias starts at 0 too
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run = gradwatch.init(project="g", name="bn", server=server.url)
    run.watch(model, opt, signals_every=1)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(32, 8)).pow(2).mean().backward()
        opt.step()
        run.log({"loss": 1.0})
    run.finish(timeout=10)
    wait_runs(api)
    ratios = [k for k in api.get("/api/runs/1/keys") if k.startswith("update_ratio/")]
    assert "update_ratio/1.bias" in ratios and "update_ratio/0.bias" in ratios
    for key in ratios:
        values = series(api, key)["values"]
        assert all(v is not None and math.isfinite(v) and v < 10 for v in values), (key, values)


WORKER_SCRIPT = """
import multiprocessing as mp, sys, gradwatch

def work(i):
    for step in range(3):
        gradwatch.log({{"worker_loss": 1.0}})  # what a Hogwild-style worker does

if __name__ == "__main__":
    run = gradwatch.init(project="procs", name="{method}", server=sys.argv[1])
    ctx = mp.get_context("{method}")
    workers = [ctx.Process(target=work, args=(i,)) for i in range(2)]
    for w in workers: w.start()
    for w in workers: w.join()
    run.log({{"loss": 1.0}})
    run.finish(timeout=10)
"""


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_log_in_a_worker_process_says_so_once(server, api, tmp_path, method):
    script = tmp_path / "workers.py"
    script.write_text(textwrap.dedent(WORKER_SCRIPT.format(method=method)))
    out = subprocess.run([sys.executable, str(script), server.url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    notice = "log() in a worker process"
    assert out.stderr.count(notice) == 2, out.stderr  # once per worker, not once per log()
    assert "gradwatch.init(" in out.stderr.split(notice, 1)[1]  # and what to do instead
    wait_runs(api)
    assert series(api, "loss")["values"] == [1.0]  # the parent's own log arrived


def test_a_run_does_not_pickle_into_a_worker(server):
    import pickle

    run = gradwatch.init(project="g", name="pickle", server=server.url)
    with pytest.raises(TypeError, match="cannot be sent to another process"):
        pickle.dumps(run)
    run.finish(timeout=10)
