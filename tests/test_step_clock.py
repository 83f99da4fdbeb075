"""The run's step clock (gradwatch.step_clock): the client's one optimizer-hook site, its subscribers
called at the right step whatever order they subscribed in, every=n honoured; and Run.flush."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from conftest import wait_runs
from torch import nn

import gradwatch
from gradwatch.delivery import spool

CLIENT = Path(__file__).resolve().parent.parent / "client_hook"


def test_optimizer_step_hooks_are_registered_in_one_place():
    sites = {}
    for path in CLIENT.rglob("*.py"):
        for hook in re.findall(r"register_step_(?:pre|post)_hook\(", path.read_text()):
            sites.setdefault(hook, []).append(path.relative_to(CLIENT).as_posix())
    assert sites == {"register_step_pre_hook(": ["step_clock.py"], "register_step_post_hook(": ["step_clock.py"]}


def _train(run, model, opt, steps, log=True):
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if log:
            run.log({"loss": loss})


def test_subscribers_see_the_step_being_taken_whatever_order_they_subscribed_in(server, api):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    run = gradwatch.init(project="clock", name="order", server=server.url)
    clock = run.recorder.clock
    seen: dict = {"early_after": [], "late_after": [], "before": [], "every3": [], "grads": []}
    clock.on_after(lambda step: seen["early_after"].append(step))  # before watch() hooks anything
    run.watch(model, opt, system_every=None)
    clock.on_after(lambda step: seen["late_after"].append(step))  # after the watcher's own subscribers
    # Before the step the gradients are final and the weights not yet changed.
    clock.on_before(lambda step: seen["grads"].append(all(p.grad is not None for p in model.parameters())))
    clock.on_before(lambda step: seen["before"].append(step))
    clock.on_before(lambda step: seen["every3"].append(step), every=3)
    _train(run, model, opt, 10)
    assert run.flush(10)
    run.finish(timeout=10)
    wait_runs(api)
    assert seen["early_after"] == seen["late_after"] == seen["before"] == list(range(10))
    assert seen["every3"] == [0, 3, 6, 9] and all(seen["grads"])
    series = lambda key: api.get(f"/api/runs/1/series?key={key}")["steps"]  # noqa: E731
    assert series("loss") == series("grad/global_norm") == list(range(10))
    # The step timer needs two ends of steps for a time: steps 1..9, each beside the loss of its step.
    assert series("perf/step_time") == list(range(1, 10))


def test_a_framework_pins_the_step_and_the_clock_does_not_advance_the_run(server, api):
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = gradwatch.init(project="clock", name="pinned", server=server.url)
    clock = run.recorder.clock
    clock.attach(opt)
    clock.attach(opt)  # attached twice: still one hook pair
    got = []
    clock.on_after(lambda step: got.append(step))
    for step in (100, 101, 102):
        clock.pin(step)
        _train(run, model, opt, 1, log=False)
    assert got == [100, 101, 102] and clock.count == 3
    assert run.step == 0 and clock.latest() is None  # log() keeps its own steps: the framework logs with step=
    run.finish(timeout=10)


def test_flush_waits_for_the_server_and_spools_when_it_is_away(server, api, tmp_path):
    run = gradwatch.init(project="clock", name="flush", server=server.url)
    for step in range(30):
        run.log({"loss": 1.0 / (step + 1)})
    assert run.flush(timeout=10)
    assert api.get("/api/runs/1/series?key=loss")["steps"] == list(range(30))  # readable at once, no wait
    assert gradwatch.flush() is True  # nothing current: nothing to wait for
    run.finish(timeout=10)
    with socket_closed() as url:
        away = gradwatch.init(project="clock", name="away", server=url, spool_dir=str(tmp_path / "spool"))
        away.log({"loss": 1.0})
        assert gradwatch.flush(timeout=5)  # the module-level one flushes the current run: kept on disk
        assert spool.batch_files(tmp_path / "spool")  # what was logged is on disk, sent when the server is back
        away.finish(timeout=1)


class socket_closed:
    """The address of a port nothing listens on."""

    def __enter__(self) -> str:
        import socket

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        pass
