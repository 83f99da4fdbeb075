"""A healthy training job as its own process, for the busy-machine tests (test_throughput.py).

Usage: python busy_worker.py SERVER PROJECT NAME SEED STEPS [plain | hogwild]
plain: a small MLP, Adam, 200-ish steps, watched with system counters on. hogwild: three processes
(fork) training one shared model, each its own watched run (NAME-0, NAME-1, NAME-2).
"""

import sys

import torch
from training import mlp, regression_data

import gradwatch

server, project, name, seed, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
mode = sys.argv[6] if len(sys.argv) > 6 else "plain"


def train(model, run_name: str, seed: int, start=None, data_seed=None) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    # hogwild workers train one model on one task (their own batches of it): with a task each, the
    # shared model is pulled three ways and a worker's loss rightly stops falling
    x, y = regression_data(seed=seed if data_seed is None else data_seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3 * (1 + seed % 3))
    with gradwatch.init(project=project, name=run_name, server=server, config={"seed": seed}) as run:
        run.watch(model, opt, system_every=0.5)
        if start is not None:
            # every worker starts on the untrained model: on a busy machine a late starter would
            # otherwise begin on a model the others had already trained, and its loss never falls
            start.wait(timeout=180)
        for _ in range(steps):
            idx = torch.randint(0, len(x), (32,))
            loss = ((model(x[idx]) - y[idx]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            run.log({"loss": loss})


if mode == "hogwild":
    import torch.multiprocessing as mp

    torch.manual_seed(seed)
    shared = mlp()
    shared.share_memory()
    ctx = mp.get_context("fork")
    start = ctx.Barrier(3)
    procs = [ctx.Process(target=train, args=(shared, f"{name}-{i}", seed + i, start, seed)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode for p in procs))
torch.manual_seed(seed)
train(mlp(), name, seed)
