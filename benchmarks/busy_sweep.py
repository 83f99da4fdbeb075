"""Healthy runs on a machine kept busy by other processes: how many get an incident (the goal is none).

Run: .venv/bin/python benchmarks/busy_sweep.py [--sweep 24] [--parallel 2] [--burners 2] [--steps 250]

What a new user does on a shared box: a sweep of small MLPs (Adam, learning rates 1e-3..3e-3),
``--parallel`` at a time, while ``--burners`` other processes spin on the CPU; then three hogwild
runs (three processes training one shared model, tests/busy_worker.py) and the demo's two healthy
runs in threads. Every run is healthy, so every incident counted here is a false alarm: the table
prints them by kind, and the exit code is 1 when any run has one. The suite keeps a small version
of this (tests/test_throughput.py); this is the full-size one the issue describes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from server_process import ServerProcess  # noqa: E402
from training import demo_healthy_runs  # noqa: E402

WORKER = ROOT / "tests" / "busy_worker.py"


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _workers(url: str, specs: list[tuple[str, int, str]], steps: int) -> None:
    """Start one busy_worker per spec, wait for all; a worker that fails is an error of the benchmark."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), url, "busy", name, str(seed), str(steps), mode], cwd=WORKER.parent
        )
        for name, seed, mode in specs
    ]
    try:
        for p in procs:
            if p.wait(timeout=900) != 0:
                raise SystemExit(f"a worker exited {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def _burners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=int, default=24, help="runs in the sweep")
    parser.add_argument("--parallel", type=int, default=2, help="sweep runs at a time")
    parser.add_argument("--burners", type=int, default=2, help="other processes spinning on the CPU")
    parser.add_argument("--hogwild", type=int, default=3, help="hogwild jobs (three runs each)")
    parser.add_argument("--steps", type=int, default=250)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(f"sqlite:///{tmp}/busy.db") as server:
        burners = _burners(args.burners)
        try:
            for first in range(0, args.sweep, args.parallel):
                seeds = range(first, min(first + args.parallel, args.sweep))
                _workers(server.url, [(f"sweep-{s}", s, "plain") for s in seeds], args.steps)
            for h in range(args.hogwild):
                _workers(server.url, [(f"hogwild{h}", 100 + h, "hogwild")], args.steps - 50)
            demo_healthy_runs(server.url, timeout=900)
        finally:
            for b in burners:
                b.kill()
                b.wait(timeout=10)
        load = os.getloadavg()[0]
        runs = _get(f"{server.url}/api/runs?project=busy") + _get(f"{server.url}/api/runs?project=demo-spirals")
        kinds: collections.Counter = collections.Counter()
        flagged = []
        for run in runs:
            incidents = _get(f"{server.url}/api/runs/{run['id']}/incidents")
            if incidents:
                flagged.append(f"{run['name']}: {incidents[0]['root']['message']}")
            kinds.update(i["kind"] for i in incidents)
    print("# healthy runs on a busy machine\n")
    print(f"{len(runs)} healthy runs ({args.sweep} sweep, {3 * args.hogwild} hogwild, 2 demo), {args.burners} burners,")
    print(
        f"{args.parallel} sweep runs at a time, load average {load:.1f} at the end, {time.monotonic() - started:.0f} s\n"
    )
    print("| runs with an incident | incidents by kind |")
    print("|---|---|")
    print(f"| {len(flagged)} of {len(runs)} | {', '.join(f'{k} {n}' for k, n in kinds.items()) or 'none'} |")
    if flagged:
        print("\nflagged:\n" + "\n".join(f"- {f}" for f in flagged))
    sys.exit(1 if flagged else 0)


if __name__ == "__main__":
    main()
