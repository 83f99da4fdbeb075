"""How well ``throughput_drop`` names a slowdown's cause, on synthetic runs whose counters arrive as the client
samples them: every ``system_every`` seconds of wall time (1-10 s), the machine's and this process's CPU as
averages over the interval since the last sample (psutil), the load a 1-minute average.

Five kinds of run, N of each (every run draws its own step time, loader share, onset, slowdown, sample
interval and rate of late steps):
- ``loader``: the DataLoader slows. Right: an alert naming it.
- ``heavier``: each step needs more CPU work. Right: an alert, not naming the loader.
- ``io``: the process waits on something that is not CPU (its share falls). Right: the "CPU share fell" alert.
- ``contention``: other processes take the machine. Right: no alert (a note).
- ``healthy``: nothing changes. Right: no alert.

Seeds: ``--split tune`` (0-299) is where rules are tried (tests/test_throughput.py runs 0-29 of them);
``--split held-out`` (1000-1299, the default) is what docs/benchmarks.md reports, and no test uses it.

    python benchmarks/pace_causes.py [--split held-out|tune] [--runs 300]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gradwatch.contract import keys  # noqa: E402
from gradwatch_server.health import monitor as health  # noqa: E402

ST, LW, CPU, SHARE, LOAD = keys.STEP_TIME, keys.LOADER_WAIT, keys.CPU_PERCENT, keys.PROCESS_CPU, keys.LOAD_PER_CORE
KINDS = ("loader", "heavier", "io", "contention", "healthy")
SPLITS = {"tune": 0, "held-out": 1000}
CORES = 8


class Sampler:
    """System counters as psutil gives them: averages since the previous sample, every ``every`` seconds."""

    def __init__(self, every: float):
        self.every, self.last, self.busy, self.own, self.load = every, 0.0, 0.0, 0.0, 0.3

    def step(self, t: float, dt: float, own: float, others: float, load_target: float) -> dict | None:
        self.own, self.busy = self.own + own, self.busy + own + others
        self.load += (1 - math.exp(-dt / 60)) * (load_target - self.load)
        if t - self.last < self.every:
            return None
        span = t - self.last
        out = {CPU: min(100.0, 100 * self.busy / span / CORES), SHARE: 100 * self.own / span / CORES}
        self.last, self.busy, self.own = t, 0.0, 0.0
        return {**out, LOAD: self.load / CORES}


def run(seed: int, kind: str) -> tuple[int, list, list]:
    """One run's throughput_drop alerts: (onset step, each step's end in seconds, alerts)."""
    r = random.Random(seed)
    base, share = r.uniform(0.01, 0.3), r.uniform(0.1, 0.6)  # step seconds, the loader's part of a step
    sampler = Sampler(r.choice([1.0, 2.0, 5.0, 5.0, 10.0]))
    onset_t, k, late = r.uniform(20, 60), r.uniform(2.0, 5.0), r.uniform(0.0, 0.05)
    monitor, alerts, t, onset, step, ends = health.Monitor(), [], 0.0, None, 0, []
    while t < onset_t + 120 and step < 20_000:
        on = t >= onset_t
        onset = step if on and onset is None else onset
        wait = base * share * r.uniform(0.8, 1.2) * (k if on and kind in ("loader", "contention") else 1)
        rest = base * (1 - share) * r.uniform(0.9, 1.1) * (k if on and kind in ("heavier", "contention") else 1)
        rest += base * (k - 1) if on and kind == "io" else 0.0
        own = base * (1 - share) if on and kind in ("contention", "io") else rest  # CPU seconds of the step
        rest += base * r.uniform(1, 3) if r.random() < late else 0.0  # a late usual step
        dt = wait + rest
        t += dt
        ends.append(t)
        busy = on and kind == "contention"
        sample = sampler.step(t, dt, min(own, dt), CORES * 0.9 * dt if busy else 0.2 * dt, CORES * 1.2 if busy else 0.3)
        if sample:
            alerts += monitor.observe(step, sample, {})
        alerts += monitor.observe(step, {LW: wait, ST: dt}, {})
        step += 1
    return onset, ends, [a for a in alerts if a.kind == "throughput_drop"]


def right(kind: str, alerts: list) -> bool:
    first = alerts[0].message if alerts else None
    if kind == "loader":
        return first is not None and "DataLoader is the difference" in first
    if kind == "heavier":
        return first is not None and "DataLoader is the difference" not in first
    if kind == "io":
        return first is not None and "CPU share fell" in first
    return first is None


def score(kind: str, seeds: range) -> dict:
    """Right / wrong (an alert naming another cause, or one that should not be) / missed; steps and seconds from
    the slowdown's start to a right alert."""
    out = {"right": 0, "wrong": 0, "missed": 0, "lead": [], "seconds": []}
    for seed in seeds:
        onset, ends, alerts = run(seed, kind)
        if right(kind, alerts):
            out["right"] += 1
            if alerts:
                out["lead"].append(alerts[0].step - onset)
                out["seconds"].append(ends[alerts[0].step] - ends[onset - 1])
        else:
            out["wrong" if alerts else "missed"] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=sorted(SPLITS), default="held-out")
    parser.add_argument("--runs", type=int, default=300, help="runs of each kind [300]")
    args = parser.parse_args()
    seeds = range(SPLITS[args.split], SPLITS[args.split] + args.runs)
    print(f"{args.split} seeds {seeds.start}-{seeds.stop - 1}, {args.runs} runs a kind\n")
    print("| kind | right | wrong | missed | to the alert, steps p50 / p90 | seconds p50 / p90 |")
    print("|---|---|---|---|---|---|")
    for kind in KINDS:
        got = score(kind, seeds)
        print(
            f"| {kind} | {got['right']} | {got['wrong']} | {got['missed']} | {_spread(got['lead'], '.0f')} | "
            f"{_spread(got['seconds'], '.1f')} |"
        )


def _spread(xs: list, form: str) -> str:
    return f"{statistics.median(xs):{form}} / {sorted(xs)[int(0.9 * len(xs))]:{form}}" if xs else "-"


if __name__ == "__main__":
    main()
