"""Incidents through a real server and real PyTorch runs: one incident per problem, its root and cause, its
consequences in step order, alerts that follow their episodes, and acknowledge / snooze / resolve."""

from __future__ import annotations

import pytest
import torch
from conftest import wait_runs
from test_health_corpus import _gen, _set_lr
from torch import nn
from training import SeqClassifier, loop, mlp, regression_data

import gradwatch

F = nn.functional


def spirals_run(run, lr: float, steps: int = 60):
    """The README demo's model and data (Adam, cosine schedule) on a real gradwatch run."""
    from gradwatch_server.cli import demo

    torch.manual_seed(0)
    model, (x, y), g = demo.make_model(), demo.make_data(), _gen(1)
    o = torch.optim.Adam(model.parameters(), lr=lr)
    batch = lambda s: (lambda i: (x[i], y[i]))(torch.randint(0, len(x), (128,), generator=g))  # noqa: E731
    return loop(
        run, model, o, batch, steps, F.cross_entropy, sched=torch.optim.lr_scheduler.CosineAnnealingLR(o, steps)
    )


def lr_jump_run(run, at: int = 40, lr: float = 50.0, steps: int = 60):
    """An MLP learning fine at lr 0.01 until the LR jumps at step ``at``."""
    torch.manual_seed(7)
    model, (x, y), g = mlp(), regression_data(seed=7), _gen(7)
    o = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = lambda s: (lambda i: (x[i], y[i]))(torch.randint(0, len(x), (32,), generator=g))  # noqa: E731
    before = _set_lr(at, lr)
    return loop(run, model, o, batch, steps, F.mse_loss, before=lambda s: before(s, model, o))


@pytest.fixture(autouse=True)
def _pace_rule_off(api):
    """No test here is about a loop's pace, which a busy machine changes (an extra throughput_drop incident)."""
    for project in ("inc", "tail"):
        status, body = api.request("PUT", f"/api/projects/{project}/rules", {"disabled": ["throughput_drop"]})
        assert status == 200, body


def incidents_of(api, run_id=1):
    return api.get(f"/api/runs/{run_id}/incidents")


def test_a_divergence_is_one_incident_with_its_consequences_in_order(server, api):
    spirals_run(gradwatch.init(project="inc", name="lr3", server=server.url), 3.0)
    found = incidents_of(api)
    assert len(found) == 1, [(i["kind"], i["story"]) for i in found]
    inc = found[0]
    assert {"id", "root", "alerts", "first_step", "last_step", "status"} <= set(inc)
    assert inc["status"] == "open" and inc["first_step"] == 1 and inc["root"]["step"] == 1
    steps = [a["step"] for a in inc["alerts"]]
    assert steps == sorted(steps) and len(inc["alerts"]) == len(api.get("/api/runs/1/alerts"))
    assert inc["story"].startswith(("diverged at 1", "gradients exploded at 1")), inc["story"]
    # The dead ReLUs after the blow-up are saturation, not a cut graph.
    zero = next(a for a in inc["alerts"] if a["kind"] == "zero_gradients")
    assert "saturated after diverging" in zero["message"] and ".detach()" not in zero["message"]
    assert all(a["incident_id"] == inc["id"] for a in api.get("/api/runs/1/alerts"))  # old endpoint still works


def test_the_root_names_the_learning_rate_against_where_the_loss_was_falling(server, api):
    lr_jump_run(gradwatch.init(project="inc", name="jump", server=server.url))
    inc = incidents_of(api)[0]
    assert inc["root"]["step"] == 41 and inc["first_step"] == 41
    assert "learning rate 50 at onset" in inc["cause"] and "5000×" in inc["cause"], inc["cause"]
    assert "where the loss was still falling" in inc["cause"]


def test_an_alert_follows_its_episode(server, api):
    # pytorch/examples' word_language_model failure: a tanh RNN at lr 100 without clipping stays diverged.
    torch.manual_seed(0)
    tokens = torch.randint(0, 30, (256, 10), generator=_gen(0))
    labels = (tokens[:, 0] >= 15).long()
    g, model = _gen(1), SeqClassifier(cell=nn.RNN)
    run = gradwatch.init(project="inc", name="rnn", server=server.url)
    batch = lambda s: (lambda i: (tokens[i], labels[i]))(torch.randint(0, 256, (32,), generator=g))  # noqa: E731
    loop(run, model, torch.optim.SGD(model.parameters(), lr=100.0), batch, 40, F.cross_entropy)
    alerts = {a["kind"]: a for a in api.get("/api/runs/1/alerts")}
    div = alerts["loss_divergence"]
    assert div["step"] == 1 and div["count"] > 1 and div["last_step"] > 20, div
    loss = api.get("/api/runs/1/series?key=loss")
    diverged = [v for s, v in zip(loss["steps"], loss["values"]) if s >= 1 and isinstance(v, float)]
    assert float(div["value"]) == max(diverged)  # the worst value of the episode, not the first
    inc = incidents_of(api)[0]
    assert inc["last_step"] >= div["last_step"]


def test_acknowledge_snooze_resolve_and_the_inbox(server, api):
    spirals_run(gradwatch.init(project="inc", name="a", server=server.url), 3.0)
    lr_jump_run(gradwatch.init(project="inc", name="b", server=server.url))
    wait_runs(api, 2)
    first, second = incidents_of(api, 1)[0], incidents_of(api, 2)[0]
    status, body = api.request("POST", f"/api/incidents/{first['id']}/status", {"status": "acknowledged", "by": "ana"})
    assert status == 200 and body["status"] == "acknowledged"
    assert body["status_by"] == "anonymous"  # the token's name (no token here), never the "by" the caller sent
    inbox = api.get("/api/incidents")
    assert [i["id"] for i in inbox] == [second["id"], first["id"]]  # open first
    assert inbox[0]["run_name"] == "b" and inbox[0]["project"] == "inc"
    status, body = api.request("POST", f"/api/incidents/{second['id']}/status", {"status": "snoozed", "minutes": 30})
    assert status == 200 and body["status"] == "snoozed" and body["snoozed_until"] > 0
    assert api.get("/api/incidents?status=snoozed")[0]["id"] == second["id"]
    status, body = api.request("POST", "/api/runs/1/incidents/status", {"status": "resolved"})
    assert status == 200 and body["changed"] == 1
    assert incidents_of(api, 1)[0]["status"] == "resolved"
    assert api.request("POST", f"/api/incidents/{first['id']}/status", {"status": "gone"})[0] == 400
    assert api.request("POST", f"/api/incidents/{first['id']}/status", {"status": "snoozed", "minutes": -1})[0] == 400
    assert api.request("POST", "/api/incidents/999/status", {"status": "resolved"})[0] == 404
    assert api.request("GET", "/api/runs/999/incidents")[0] == 404
    assert api.request("GET", "/api/runs/999/contention")[0] == 404
    runs = {r["id"]: r for r in api.get("/api/runs")}
    assert runs[1]["open_incidents"] == 0 and runs[2]["open_incidents"] == 0  # acknowledged/resolved, snoozed
    assert runs[2]["last_alert"]["step"] == 41  # the banner headlines the root cause, not the last consequence


class _Unfinished:
    """The run, with ``finish`` left to the with-block (which records the exception)."""

    def __init__(self, run):
        self.run = run
        self.watch, self.log = run.watch, run.log

    def finish(self):
        pass


def test_a_crash_right_after_a_divergence_is_diagnosed_as_part_of_it(server, api):
    with pytest.raises(ValueError):
        with gradwatch.init(project="inc", name="crash", server=server.url) as run:
            lr_jump_run(_Unfinished(run), steps=45)  # diverges at 41
            raise ValueError("loss is not finite, stopping")
    detail = api.get("/api/runs/1")
    diagnosis = detail["error"]["diagnosis"]
    inc = incidents_of(api)[0]
    assert diagnosis["title"] == "Crashed after diverging" and diagnosis["incident_id"] == inc["id"]
    assert "diverged at step 41" in diagnosis["advice"] and "learning rate 50" in diagnosis["advice"]


def test_an_lr_ramp_that_went_too_far_is_named_as_the_cause(server, api):
    # The demo's failure: the LR grows every step; the loss falls while it is small, then blows up.
    torch.manual_seed(3)
    model, (x, y), g = mlp(), regression_data(seed=3), _gen(3)
    o = torch.optim.SGD(model.parameters(), lr=0.005)
    sched = torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.08**s)
    batch = lambda s: (lambda i: (x[i], y[i]))(torch.randint(0, len(x), (32,), generator=g))  # noqa: E731
    run = gradwatch.init(project="inc", name="ramp", server=server.url)
    loop(run, model, o, batch, 120, F.mse_loss, sched=sched)
    inc = incidents_of(api)[0]
    assert inc["cause"], [(i["kind"], i["first_step"], i["story"]) for i in incidents_of(api)]
    ratio = float(inc["cause"].split("×")[0].rsplit(", ", 1)[1])
    assert ratio >= 3 and "where the loss was still falling" in inc["cause"], inc["cause"]


# -- in the terminal: gradwatch incidents, runs ls, tail (real CLI processes against the real server) ---------
def _gradwatch(*args: str) -> str:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "gradwatch_server.cli", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _plateau_then_nan(server_url: str) -> int:
    """A run whose first incident is a warning (a loss that never fell) and whose worst is critical (NaN)."""
    with gradwatch.init(project="term", name="flat then nan", server=server_url, flush_interval=0.05) as run:
        for step in range(230):
            run.log({"loss": float("nan") if step == 215 else 1.0 + 0.001 * (step % 3)})
    return run.id


def test_incidents_and_runs_ls_in_the_terminal(server, api):
    import json

    from gradwatch_server.cli.health.incidents import FIELDS

    run_id = _plateau_then_nan(server.url)
    incs = json.loads(_gradwatch("incidents", str(run_id), "--server", server.url, "--json"))
    assert [i["kind"] for i in incs] == ["loss_plateau", "nan_loss"]
    assert all(list(i) == list(FIELDS) for i in incs)  # the documented fields, in order
    nan = incs[1]
    assert (nan["severity"], nan["status"], nan["first_step"], nan["run_name"]) == (
        "critical",
        "open",
        215,
        "flat then nan",
    )
    assert "loss NaN at 215" in nan["story"] and "is NaN at step 215" in nan["message"]
    text = _gradwatch("incidents", "flat then nan", "--server", server.url, "--open").splitlines()
    assert len(text) == 2 and "critical" in text[1] and "loss NaN at 215" in text[1]
    inbox = json.loads(_gradwatch("incidents", "--project", "term", "--server", server.url, "--json"))
    assert {i["id"] for i in inbox} == {i["id"] for i in incs} and inbox[0]["project"] == "term"
    assert json.loads(_gradwatch("incidents", "--project", "nobody", "--server", server.url, "--json")) == []
    # runs ls: the worst open incident, not the first alert
    (listed,) = json.loads(_gradwatch("runs", "ls", "--project", "term", "--server", server.url, "--json"))
    assert listed["worst_incident"]["kind"] == "nan_loss" and listed["worst_incident"]["severity"] == "critical"
    assert listed["open_incidents"] == 2
    table = _gradwatch("runs", "ls", "--project", "term", "--server", server.url).splitlines()
    assert "WORST OPEN" in table[0] and "critical nan_loss @215 (+1 open)" in table[1]


def _controlling_terminal():
    import fcntl
    import os
    import termios

    if os.getsid(0) != os.getpid():  # the suite's children start in a session of their own already
        os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_tail_follows_a_live_run_in_a_pty_and_leaves_on_ctrl_c(server, api):
    import os
    import pty
    import select
    import subprocess
    import sys
    import threading
    import time

    from training import train_slowly

    stop = threading.Event()
    trainer = threading.Thread(
        target=train_slowly,
        args=(server.url, 10_000, stop),
        kwargs={"name": "tailed", "nan_at": 120, "project": "tail"},
    )
    trainer.start()
    proc = None
    try:
        wait_runs(api)
        run_id = api.get("/api/runs?project=tail")[0]["id"]
        main, child = pty.openpty()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gradwatch_server.cli",
                "tail",
                str(run_id),
                "--server",
                server.url,
                "--interval",
                "0.2",
            ],
            stdin=child,
            stdout=child,
            stderr=child,
            close_fds=True,
            preexec_fn=_controlling_terminal,  # so Ctrl-C on the pty is SIGINT to it, as in a real terminal
        )
        os.close(child)
        seen, deadline = b"", time.monotonic() + 120
        while b"new incident" not in seen and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([main], [], [], 1.0)
            if ready:
                seen += os.read(main, 65536)
        text = seen.decode("utf-8", "replace")
        assert "run " in text and "'tailed'" in text and "grad norm" in text, text[-2000:]
        assert any(ch in text for ch in "▁▂▃▄▅▆▇█"), text[-2000:]  # the sparklines
        assert "new incident" in text and "loss NaN at 120" in text, text[-2000:]
        os.write(main, b"\x03")  # Ctrl-C
        assert proc.wait(timeout=30) == 0
        os.close(main)
    finally:
        stop.set()
        trainer.join(timeout=60)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_tail_sparkline_covers_the_whole_run_so_an_early_spike_shows(server, api):
    import subprocess
    import sys

    run = gradwatch.init(project="spark", name="spike", server=server.url)
    for step in range(3000):
        run.log({"loss": 50.0 if step == 200 else 1.0 + 0.1 * (step % 7)}, step=step)  # one spike, early on
    run.finish(timeout=30)
    run_id = api.get("/api/runs?project=spark")[0]["id"]
    cmd = [sys.executable, "-m", "gradwatch_server.cli", "tail", str(run_id), "--server", server.url, "--once"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = next(row for row in out.stdout.splitlines() if row.startswith("loss"))
    bars = line[13:].split("  ")[0]
    assert bars.count("█") == 1 and bars.index("█") < len(bars) // 4, line  # the spike (step 200 of 3000), early
