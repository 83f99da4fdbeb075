"""Step time, DataLoader wait and throughput (capture/step_timer.py, capture/loader_wait.py) and the
``throughput_drop`` rule, which names a cause in the run or raises nothing (health/cause.py)."""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from training import Recorder, demo_healthy_runs, mlp

from gradwatch.contract import keys
from gradwatch.watcher import Watcher
from gradwatch_server.health import monitor as health
from gradwatch_server.health.batch import SMALL_BATCH

STEP_TIME, DATA_WAIT, SAMPLES, LOADER = keys.STEP_TIME, keys.DATA_WAIT, keys.SAMPLES_PER_SEC, keys.LOADER_WAIT
CPU, SHARE, LOAD = keys.CPU_PERCENT, keys.PROCESS_CPU, keys.LOAD_PER_CORE
HERE = Path(__file__).parent


class Slow(Dataset):
    """Items that take ``waits[i // batch]`` seconds to load: a DataLoader that gets slow."""

    def __init__(self, waits, batch):
        self.waits, self.batch = waits, batch

    def __len__(self):
        return len(self.waits) * self.batch

    def __getitem__(self, i):
        if i % self.batch == 0:
            time.sleep(self.waits[i // self.batch])
        return torch.randn(4), torch.randn(1)


def loop(waits, batch_size=32, loader=False, system_every=None, work=0.0):
    """A real CPU loop whose batch takes ``waits[i]`` seconds: from a DataLoader, or the script's own sleep;
    ``work``: seconds of each step spent beside the loader (a sleep standing in for the model's compute)."""
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder()
    watcher = Watcher(rec, model, opt, batch_size=batch_size, system_every=system_every)
    x, y = torch.randn(batch_size, 4), torch.randn(batch_size, 1)
    batches = iter(DataLoader(Slow(waits, batch_size), batch_size=batch_size)) if loader else None
    for wait in waits:
        if batches is not None:
            x, y = next(batches)
            time.sleep(work)
        else:
            time.sleep(wait)  # the script's own pause: not a data loader
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rec.log({"loss": loss.detach()})
    watcher.remove()
    return rec


def perf(rec):
    return {r[1]: r[2] for r in rec.records() if r[0] == "rec" and STEP_TIME in r[2]}


def drops(alerts):
    return [a for a in alerts if a.kind == "throughput_drop"]


def test_step_time_data_wait_and_samples_per_second_are_recorded():
    rec = loop([0.03] * 6)
    got = perf(rec)
    assert sorted(got) == [1, 2, 3, 4, 5]  # from the second step: a step time needs the previous step's end
    for values in got.values():
        assert 0.03 <= values[DATA_WAIT] <= values[STEP_TIME]
        assert values[SAMPLES] == pytest.approx(32 / values[STEP_TIME], rel=1e-3)
        # gradwatch's own timers at their resolution (1 us, 4 digits): short decimals, cheap to store
        assert values[STEP_TIME] == round(values[STEP_TIME], 6) and values[SAMPLES] == float(f"{values[SAMPLES]:.4g}")


def test_a_slow_dataloader_is_a_throughput_drop_naming_the_loader():
    # The step does work beside its fetch, as a model does: a loop that is almost all fetch has no room to tell its
    # loader from the CPU it shares (cause._loader), and on a loaded machine it was called contention.
    rec = loop([0.01] * 90 + [0.08] * 40, loader=True, system_every=0.2, work=0.03)
    fetches = [r[2][LOADER] for r in rec.records() if r[0] == "rec" and LOADER in r[2]]
    assert len(fetches) >= 130 and max(fetches) >= 0.08  # every fetch timed, the slow ones too
    (drop,) = drops(rec.alerts())
    assert 90 <= drop.step <= 90 + 25 and "DataLoader is the difference" in drop.message, drop.message
    assert drop.key == STEP_TIME


def test_the_scripts_own_pause_is_never_called_a_data_loader():
    rec = loop([0.01] * 90 + [0.06] * 40)  # no DataLoader, no system counters: nothing says why
    assert not drops(rec.alerts())
    assert not any(LOADER in r[2] for r in rec.records() if r[0] == "rec")


def test_a_steady_loop_stays_quiet():
    rec = loop([0.02] * 130, loader=True, system_every=0.2)
    assert not drops(rec.alerts())


def stream(system, slow_from=120, steps=200, **extra):
    """The rule on a stream: step times 0.1 s, then 0.2 s; the system counters ``system(step)`` every 10 steps."""
    m, alerts = health.Monitor(), []
    for step in range(steps):
        if step % 10 == 0:
            alerts += m.observe(step, system(step, step >= slow_from), {})
        alerts += m.observe(step, {STEP_TIME: 0.1 if step < slow_from else 0.2, **extra}, {})
    return m, drops(alerts)


def test_contention_from_other_processes_is_a_note_not_an_alert():
    busy = lambda step, slow: {CPU: 100.0 if slow else 50.0, SHARE: 25.0 if slow else 48.0, LOAD: 1.5}  # noqa: E731
    m, found = stream(busy)
    assert not found
    (note,) = m.states["throughput"]["notes"]
    assert note["cause"] == "contention" and 120 <= note["first_step"] <= 140 and note["last_step"] == 199
    assert "Other processes are taking the CPU" in note["message"] and note["evidence"][CPU] == 100.0


def test_a_run_that_slowed_on_an_idle_machine_is_raised_with_its_evidence():
    idle = lambda step, slow: {CPU: 30.0 if slow else 50.0, SHARE: 28.0 if slow else 49.0, LOAD: 0.4}  # noqa: E731
    _, (drop,) = stream(idle)
    # The median of the last 20 steps turns at the 10th slow one (129); the machine is judged once two samples
    # are tagged at or after the slowdown's first step (120 and 130: cause.FRESH), the second wholly inside it.
    assert drop.step == 130
    assert "fell 50%" in drop.message and "CPU share fell from 49% to 28%" in drop.message
    assert "DataLoader is" not in drop.message and "thermal" not in drop.message
    same = lambda step, slow: {CPU: 50.0, SHARE: 49.0, LOAD: 0.4}  # noqa: E731
    _, (drop,) = stream(same)
    assert "each step needs more work" in drop.message


def test_a_busy_machine_is_judged_on_counters_sampled_after_the_slowdown_began():
    """psutil's counters average the time since their last sample: the sample taken 5 steps into the slowdown is
    mostly the idle machine before it. Judged on it, other processes' load looked like the run's own work."""
    m, alerts = health.Monitor(), []
    for step in range(200):
        if step and step % 25 == 0:  # every 25 steps, the average over the 25 before (the share of them slowed)
            busy = sum(s >= 120 for s in range(step - 25, step)) / 25
            alerts += m.observe(step, {CPU: 50.0 + 50.0 * busy, SHARE: 48.0 - 23.0 * busy, LOAD: 0.4}, {})
        alerts += m.observe(step, {STEP_TIME: 0.1 if step < 120 else 0.2}, {})
    assert not drops(alerts)
    (note,) = m.states["throughput"]["notes"]
    assert note["cause"] == "contention" and note["first_step"] == 120, note  # the stretch from its first slow step


def _idle_then_waiting(step, slow):
    return {CPU: 30.0 if slow else 50.0, SHARE: 28.0 if slow else 49.0, LOAD: 0.4}


def test_system_counters_in_bulk_batches_are_judged_as_record_by_record():
    """A sample whose counters come as five records of one batch (no step times: the bulk path) is judged as the
    same records fed one by one: the same alert at the same step."""
    one, bulk, alerts = health.Monitor(), health.Monitor(), {"one": [], "bulk": []}
    for step in range(200):
        if step % 10 == 0:
            sample = {**_idle_then_waiting(step, step >= 120), keys.RAM_PERCENT: 40.0, keys.CPU_STEAL: 0.0}
            assert len(sample) > SMALL_BATCH  # records enough for the bulk path
            for key, value in sample.items():
                alerts["one"] += one.observe(step, {key: value}, {})
            scalars = {key: ([row], [value]) for row, (key, value) in enumerate(sample.items())}
            alerts["bulk"] += bulk.observe_batch([step] * len(sample), scalars, {})
        record = {STEP_TIME: 0.1 if step < 120 else 0.2}
        alerts["one"] += one.observe(step, record, {})
        alerts["bulk"] += bulk.observe(step, record, {})
    got = {name: [(a.step, a.message) for a in drops(found)] for name, found in alerts.items()}
    assert got["one"] and "CPU share fell" in got["one"][0][1], got
    assert got["bulk"] == got["one"]


def test_counters_that_stop_coming_leave_a_slowdown_unexplained_not_waiting_for_ever():
    m, alerts = health.Monitor(), []
    for step in range(400):
        if step % 10 == 0 and step <= 100:  # the sampler stops at step 100, every 1 s before it
            alerts += m.observe(step, _idle_then_waiting(step, False), {})
        alerts += m.observe(step, {STEP_TIME: 0.1 if step < 120 else 0.2}, {})
    assert not drops(alerts)
    (note,) = m.states["throughput"]["notes"]
    assert note["cause"] == "unmeasured" and "stopped coming (the last at step 100)" in note["message"], note
    assert note["first_step"] == 120 and note["last_step"] == 399


def test_a_run_resumed_at_an_earlier_step_waits_for_counters_sampled_after_the_resume():
    """Steps go back (a resume from a checkpoint): samples from before it say nothing about the slowdown after it."""
    m, alerts = health.Monitor(), []
    stream = [(s, 0.1) for s in range(300)] + [(s, 0.1 if s < 220 else 0.2) for s in range(150, 400)]
    for i, (step, t) in enumerate(stream):
        if i % 10 == 0:
            busy = i >= 380  # the first sample wholly inside the slowdown (at step 230) shows the busy machine
            alerts += m.observe(step, {CPU: 100.0 if busy else 50.0, SHARE: 25.0 if busy else 48.0, LOAD: 0.4}, {})
        alerts += m.observe(step, {STEP_TIME: t}, {})
    assert not drops(alerts)
    assert [n["cause"] for n in m.states["throughput"]["notes"]] == ["contention"]
    # resumed where no counters come at all (no psutil there): nothing measured says why, whatever came before
    m, alerts = health.Monitor(), []
    for i, (step, t) in enumerate(stream):
        if i % 10 == 0 and i < 300:
            alerts += m.observe(step, _idle_then_waiting(step, False), {})
        alerts += m.observe(step, {STEP_TIME: t}, {})
    assert not drops(alerts)
    assert [n["cause"] for n in m.states["throughput"]["notes"]] == ["unmeasured"]


def test_a_long_step_before_a_slowdown_does_not_make_counters_look_stopped():
    """An evaluation or a checkpoint inside one step time (30 s) just before the slowdown: the counters still come
    every 5 s, and the slowdown is judged on them."""
    m, alerts, clock, sampled = health.Monitor(), [], 0.0, 0.0
    for step in range(1400):
        t = 30.0 if step == 995 else (0.1 if step < 1000 else 0.2)
        clock += t
        if clock - sampled >= 5.0:
            sampled = clock
            alerts += m.observe(step, _idle_then_waiting(step, step > 1000), {})
        alerts += m.observe(step, {STEP_TIME: t}, {})
    (drop,) = drops(alerts)
    assert "CPU share fell" in drop.message and not m.states["throughput"].get("notes"), drop.message


def test_a_slowdown_that_hovers_at_the_line_is_raised_not_absorbed():
    """Steps from 0.1 s to anywhere in 0.1-0.2 s: the median of 20 sits at the 30 % line, in and out. While the rule
    waits for fresh counters, the slow steps must not become the baseline, nor a dip restart the wait."""
    r, m, alerts = random.Random(0), health.Monitor(), []
    for step in range(2000):
        if step % 50 == 0:  # every 5 s or so, tagged after the slowdown's start only once it began
            alerts += m.observe(step, _idle_then_waiting(step, step > 500), {})
        alerts += m.observe(step, {STEP_TIME: r.uniform(0.09, 0.11) if step < 500 else r.uniform(0.1, 0.2)}, {})
    found = drops(alerts)
    assert found and all("CPU share fell" in drop.message for drop in found), [d.message for d in found]


def test_counters_sampled_as_psutil_does_never_make_a_busy_machine_the_runs_fault():
    """benchmarks/pace_causes.py's runs (its tuning seeds): interval-averaged counters every 1-10 s."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pace_causes", HERE.parent / "benchmarks" / "pace_causes.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    seeds = range(30)
    busy, waits = script.score("contention", seeds), script.score("io", seeds)
    assert busy["wrong"] == 0 and waits["wrong"] == 0, (busy, waits)
    assert waits["right"] == len(seeds)  # every wait raised, as "CPU share fell"


def test_a_loader_slowdown_is_named_even_when_one_late_step_turns_the_median_early():
    """One late usual step beside the first 9 slow ones turns the step-time median while the window's median fetch
    is still a usual one: the slow steps are compared with as many of the longest fetches, not with that median."""
    m, alerts = health.Monitor(), []
    idle = {CPU: 30.0, SHARE: 27.0, LOAD: 0.3}
    for step in range(99):
        slow = step >= 90
        if step % 10 == 0:  # the process's CPU share falls while it sleeps in the loader
            alerts += m.observe(step, {**idle, SHARE: 12.0 if slow else 27.0}, {})
        wait = 0.08 if slow else 0.0105
        t = 0.093 if slow else (0.045 if step == 85 else 0.023)
        alerts += m.observe(step, {LOADER: wait, STEP_TIME: t}, {})
    (drop,) = drops(alerts)
    assert drop.step == 98 and "DataLoader is the difference" in drop.message, drop.message


def test_thermal_is_named_only_from_nvml_throttle_reasons():
    throttled = lambda step, slow: {CPU: 100.0, SHARE: 20.0, keys.gpu_key(0, "throttle_reasons"): 0x20 if slow else 0}  # noqa: E731
    _, (drop,) = stream(throttled)
    assert "throttling its clocks" in drop.message and "thermal" in drop.message
    # nothing measured at all: no cause, no alert (and a 20 % slowdown is under the 30 % line anyway)
    m, alerts = health.Monitor(), []
    for step in range(200):
        alerts += m.observe(step, {STEP_TIME: 0.1 if step < 120 else 0.2}, {})
    assert not alerts and m.states["throughput"]["notes"][0]["cause"] == "unmeasured"


def test_watch_without_an_optimizer_records_no_step_time():
    model = nn.Linear(4, 1)
    rec = Recorder()
    Watcher(rec, model)
    model(torch.randn(2, 4)).sum().backward()
    assert not perf(rec)


# -- real processes on a machine kept busy by other processes ----------------------------------------------
@contextlib.contextmanager
def burners(n: int = 2):
    """``n`` processes spinning on the CPU for as long as the block runs (ended even when it fails)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def _worker(server, name, seed, steps, mode="plain"):
    return subprocess.Popen(
        [sys.executable, str(HERE / "busy_worker.py"), server.url, "busy", name, str(seed), str(steps), mode],
        cwd=HERE,
    )


def _finish(procs, timeout=240):
    try:
        for p in procs:
            assert p.wait(timeout=timeout) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def test_healthy_runs_on_a_busy_machine_raise_no_incident(server, api):
    with burners(2):
        for pair in range(2):  # a small sweep, two at a time
            _finish([_worker(server, f"sweep-{pair}-{i}", 2 * pair + i, 250) for i in range(2)])
        _finish([_worker(server, "hogwild", 7, 200, "hogwild")])  # three processes, one shared model
        healthy = demo_healthy_runs(server.url)
    runs = api.get("/api/runs?project=busy") + api.get("/api/runs?project=demo-spirals")
    assert len(runs) == 4 + 3 + healthy and healthy == 2
    for run in runs:
        assert api.get(f"/api/runs/{run['id']}/incidents") == [], run["name"]
        for note in api.get(f"/api/runs/{run['id']}/contention"):  # information only
            assert note["severity"] == "info" and note["cause"] in ("contention", "unmeasured")
