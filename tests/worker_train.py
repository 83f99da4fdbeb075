"""A training job as its own process, for tests that need real separate processes.

Usage: python worker_train.py SERVER NAME STEPS [hang | wait | fork]
Trains a small MLP, watched, logging STEPS steps. Then:
- hang: waits until the server has everything, prints "logged" and sleeps forever (to be killed
  like an OOM-killer or a preempted node would);
- wait: prints "logged" at once (nothing flushed) and sleeps forever (to get SIGTERM / SIGINT);
- fork: forks a child that logs, finishes and exits on its own, then finishes normally.
"""

import os
import sys
import time

import torch
from training import mlp, regression_data

import gradwatch

server, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else ""
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
if mode in ("hang", "wait"):
    if mode == "hang":
        run.recorder.flush(30)
    print("logged", flush=True)
    while True:
        time.sleep(1)
if mode == "fork":
    pid = os.fork()
    if pid == 0:  # like a DataLoader worker: logs (ignored), finishes, exits through atexit
        run.log({"loss": 123.0}, step=10**6)
        gradwatch.log({"loss": 456.0})
        run.finish()
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
run.finish()
