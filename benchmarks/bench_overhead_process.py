"""What gradwatch costs a training script as a user feels it: whole processes, bare vs instrumented.

Run: .venv/bin/python benchmarks/bench_overhead_process.py [--quick] [--pairs 6] [--steps 200]
The same script (a 3-layer 1024-wide MLP, Adam, batch 128) runs as a whole process, once bare and
once with ``gradwatch.init`` + ``run.watch(model, opt, every=E)`` + ``run.log({"loss": ...})`` every
step + ``run.finish()``, streaming to a local ``gradwatch serve`` on the same machine. Runs
alternate (bare first in even pairs, instrumented first in odd ones) so drift hits both; the
figure is the median of per-pair ratios of the training loop's time per step (after a warm-up),
and of the whole process's wall time (import, init, finish included). Two placements: the server
on the same cores as training (what a laptop or a shared box sees), and "server elsewhere": the
server pinned to the last core and training to the others (taskset), as with a team server.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from server_process import ServerProcess  # noqa: E402

TRAIN = textwrap.dedent("""
    import sys, time
    import torch
    from torch import nn
    mode, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = torch.randn(128, 1024), torch.randn(128, 1024)
    run = None
    if mode != "bare":
        import gradwatch
        run = gradwatch.init(project="overhead", name=f"{mode}-{every}")
        if mode == "watch":
            run.watch(model, opt, every=every)
        elif mode == "watch-plain":  # gradients, LR and memory only: no per-layer signals, no system thread
            run.watch(model, opt, every=every, signals=False, system_every=None)
    warm = 10
    for step in range(steps + warm):
        if step == warm:
            start = time.perf_counter()
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if run is not None:
            run.log({"loss": loss})
    loop = (time.perf_counter() - start) / steps
    if run is not None:
        run.finish(timeout=120)
    print(loop, flush=True)
""")


def one(mode: str, steps: int, every: int, env: dict, cpus: str | None) -> tuple[float, float]:
    """(loop seconds per step, whole-process wall seconds) of one training process."""
    cmd = [sys.executable, "-c", TRAIN, mode, str(steps), str(every)]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"training process failed: {done.stderr[-2000:]}")
    return float(done.stdout.split()[-1]), wall


def pairs(config: str, every: int, n: int, steps: int, env: dict, cpus: str | None) -> dict:
    """n alternating (bare, instrumented) pairs; medians of per-pair ratios."""
    loop_ratios, wall_ratios, bare_steps = [], [], []
    for i in range(n):
        order = ("bare", config) if i % 2 == 0 else (config, "bare")
        got = {mode: one(mode, steps, every, env, cpus) for mode in order}
        loop_ratios.append(got[config][0] / got["bare"][0])
        wall_ratios.append(got[config][1] / got["bare"][1])
        bare_steps.append(got["bare"][0])
    return {
        "bare_ms": statistics.median(bare_steps) * 1e3,
        "loop": statistics.median(loop_ratios),
        "loop_range": (min(loop_ratios), max(loop_ratios)),
        "wall": statistics.median(wall_ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 pairs of short runs, the server on the same cores (CI keeps the script working)",
    )
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=200, help="measured steps per process (after 10 warm-up)")
    parser.add_argument("--only", nargs="*", help="modes to run (watch, watch-plain, log)")
    parser.add_argument("--placements", type=int, default=2, help="with --only: 1 = the server on the same cores only")
    args = parser.parse_args()
    n, steps = (2, 10) if args.quick else (args.pairs, args.steps)
    cores = os.cpu_count() or 1
    print(
        f"# gradwatch overhead, whole processes\n\nmachine: {platform.platform()}, {cores} cores, "
        f"Python {platform.python_version()}; command: {' '.join(sys.argv)}\n"
    )
    print("| server | instrumented with | bare step (ms) | loop time ratio, median [min-max] | whole process ratio |")
    print("|---|---|---|---|---|")
    placements = [("same cores", None, None)]
    if cores > 1:
        placements.append(("elsewhere (pinned)", str(cores - 1), f"0-{cores - 2}"))
    configs = [("watch", 1, "watch() + log(), every step"), ("watch", 10, "watch(every=10) + log()")]
    if args.quick:  # CI keeps the script working: one config, the server on the same cores
        configs, placements = configs[:1], placements[:1]
    else:
        configs += [("watch-plain", 1, "watch(signals=False, system_every=None) + log()"), ("log", 1, "log() only")]
    if args.only:
        configs = [c for c in configs if c[0] in args.only]
        placements = placements[: args.placements]
    with tempfile.TemporaryDirectory() as tmp:
        for where, server_cpus, train_cpus in placements:
            server = ServerProcess(f"sqlite:///{tmp}/{where[:4]}.db")
            try:
                if server_cpus:
                    subprocess.run(
                        ["taskset", "-a", "-p", "-c", server_cpus, str(server.pid)], check=True, capture_output=True
                    )
                env = {**os.environ, "GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL_DIR": f"{tmp}/spool"}
                for mode, every, label in configs:
                    r = pairs(mode, every, n, steps, env, train_cpus)
                    lo, hi = r["loop_range"]
                    print(
                        f"| {where} | {label} | {r['bare_ms']:.1f} | **{r['loop']:.3f}** [{lo:.3f}-{hi:.3f}] | "
                        f"{r['wall']:.3f} |",
                        flush=True,
                    )
            finally:
                server.stop()
    print(f"\n{n} alternating pairs of {steps} steps each; ratio = instrumented / bare, per pair, then the median.")


if __name__ == "__main__":
    main()
