"""A training job as its own process, for tests that need real separate processes.

Usage: python worker_train.py SERVER NAME STEPS [hang]
Trains a small MLP, watched, logging STEPS steps; with "hang" it then sleeps forever
(so the test can kill it like an OOM-killer or a preempted node would).
"""

import sys
import time

import torch

import gradwatch
from training import mlp, regression_data

server, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
hang = len(sys.argv) > 4 and sys.argv[4] == "hang"
torch.manual_seed(0)
model = mlp()
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = regression_data()
run = gradwatch.init(project="procs", name=name, server=server, flush_interval=0.05)
run.watch(model, opt)
for step in range(steps):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    run.log({"loss": loss, "step_seen": float(step)})
if hang:
    run._sender.flush(30)
    print("logged", flush=True)
    while True:
        time.sleep(1)
run.finish()
