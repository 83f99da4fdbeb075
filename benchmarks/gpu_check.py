"""Checks on real CUDA hardware (this machine has none; run it where there is a GPU).

    python benchmarks/gpu_check.py          (--cpu: only case 5, on the CPU, where there is no GPU; --help)

0. init() creates no CUDA context (a fresh process: torch.cuda.is_initialized() stays False).
1. No-sync hook path: with torch.cuda.set_sync_debug_mode("warn"), a training loop with
   run.watch + run.log(tensor loss) must not raise a single sync warning on the training
   thread. The sender thread does sync (it reads values off the GPU, in batches: that is its
   job), and the debug mode is process-wide, so warnings are counted per thread.
2. CUDA memory tracking: memory/cuda_allocated, _reserved, _peak as stored by the server
   match torch.cuda's own counters at the same steps.
3. Overhead: median step time with and without watch+log, side by side.
4. Layer signals (update ratio, output RMS) and system metrics (NVML) stored, and their cost per sampling setting.
   The no-sync check in 1 runs with the layer signals on (watch's default).
5. Histograms and images (issue #29): watch(histograms="all") plus log(Histogram(device tensor), Image(device
   tensor)) make no sync on the training thread, are stored, and cost <= 5 % over watch() at every=10.
Exits non-zero on any failure.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import torch
from torch import nn

import gradwatch
from gradwatch_server.serve import BackgroundServer
from gradwatch_server.settings import Settings


def step_fn(model, opt, x, y):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def no_context_at_init(url: str) -> list[str]:
    """init() in a fresh process must leave CUDA uninitialised (no context on GPU 0 for every rank)."""
    code = (
        f"import torch, gradwatch; run = gradwatch.init(project='gpu', name='ctx', server={url!r}); "
        "print(torch.cuda.is_initialized()); run.finish()"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if out.stdout.strip().splitlines()[:1] == ["False"]:
        print("OK   init() creates no CUDA context")
        return []
    return [f"init() initialised CUDA (stdout {out.stdout.strip()!r}, stderr {out.stderr[-300:]!r})"]


def signals_and_system(url: str, get, model, opt, timed) -> list[str]:
    """4. Layer signals and system metrics on the GPU: keys stored, NVML counters present, cost per setting."""
    failures = []
    costs = {}
    for name, kwargs in (
        ("no signals", {"signals": False}),
        ("every 1", {"signals_every": 1}),
        ("every 10", {"signals_every": 10}),
    ):
        run = gradwatch.init(project="gpu", name=f"signals-{name}", server=url)
        run.watch(model, opt, system_every=0.5, **kwargs)
        costs[name] = timed(run)
        run.finish(timeout=60)
        keys = get(f"/api/runs/{run.id}/keys")
        if name == "every 1":
            wanted = ["update_ratio/0.weight", "act_rms/0", "perf/step_time", "system/cpu_percent"]
            try:
                import pynvml  # noqa: F401

                wanted += ["system/gpu0/util", "system/gpu0/power_w", "system/gpu0/temperature_c"]
            except ImportError:
                print("     (nvidia-ml-py not installed: GPU counters not checked; pip install gradwatch[system])")
            missing = [k for k in wanted if k not in keys]
            if missing:
                failures.append(f"layer signals / system metrics missing keys {missing}")
            else:
                print(f"OK   layer signals and system metrics stored ({', '.join(wanted)})")
    base = costs["no signals"]
    print("     signals cost: " + ", ".join(f"{k} {v * 1e3:.3f} ms ({v / base:.3f}x)" for k, v in costs.items()))
    return failures


def histograms_case(url: str, get, dev: torch.device, rounds: int = 10) -> list[str]:
    """5. Device histograms and images: no sync on the training thread, stored, and their cost at every=10.

    The cost: watch(every=10) and watch(every=10, histograms="all") on two copies of one MLP, in alternating
    rounds of 50 steps (every step counted: the histogram steps are one in ten, dropping the slowest
    steps would drop them); the median of the rounds' ratios against the 5 % budget. On CPU (``--cpu``)
    the same steps run and are checked as stored; the sync count and the budget are CUDA's.
    """
    import copy

    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    width, layers = (1024, 24) if cuda else (256, 12)
    first = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(dev)
    x, y = torch.randn(256, width, device=dev), torch.randn(256, width, device=dev)
    failures = []
    model = copy.deepcopy(first)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    run = gradwatch.init(project="gpu", name="histograms", server=url)
    run.watch(model, opt, every=10, histograms="all")
    step_fn(model, opt, x, y)
    sync()
    seen = []
    show = warnings.showwarning
    warnings.showwarning = lambda message, *a, **k: seen.append((threading.current_thread().name, str(message)))
    warnings.simplefilter("always")
    if cuda:
        torch.cuda.set_sync_debug_mode("warn")
    try:
        for _ in range(30):
            loss = step_fn(model, opt, x, y)
            run.log({"loss": loss, "out": gradwatch.Histogram(model[0].weight), "img": gradwatch.Image(x[:32, :32])})
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = show
    mine = [m for name, m in seen if name == threading.current_thread().name and "sync" in m.lower()]
    if mine:
        failures.append(f"{len(mine)} sync(s) on the training thread with histograms, e.g. {mine[0][:200]}")
    run.finish(timeout=120)
    kinds = {m["key"]: m["kind"] for m in get(f"/api/runs/{run.id}/media")}
    if (
        kinds.get("out") != "histogram"
        or kinds.get("img") != "image"
        or not any(k.startswith("gradients/") for k in kinds)
    ):
        failures.append(f"histograms/images not stored: {sorted(kinds)[:5]}")

    configs = {}
    for name, hist in (("every10", None), ("histograms", "all")):
        m = copy.deepcopy(first)  # a model each: one run's hooks must not fire in the other's steps
        o = torch.optim.SGD(m.parameters(), lr=1e-4, momentum=0.9)
        r = gradwatch.init(project="gpu", name=f"cost-{name}", server=url)
        configs[name] = (r.watch(m, o, every=10, histograms=hist), m, o)

    def round_mean(name: str, n: int = 50) -> float:
        r, m, o = configs[name]
        sync()
        t = time.perf_counter()
        for _ in range(n):
            r.log({"loss": step_fn(m, o, x, y)})
        sync()
        return (time.perf_counter() - t) / n

    for name in configs:
        round_mean(name, 10)  # warm-up
    ratios = []
    for i in range(rounds):
        order = list(configs) if i % 2 == 0 else list(configs)[::-1]
        means = {name: round_mean(name) for name in order}
        ratios.append(means["histograms"] / means["every10"])
    for r, _m, _o in configs.values():
        r.finish(timeout=120)
    ratios.sort()
    ratio = statistics.median(ratios)
    print(
        f"     watch(every=10) + histograms='all' on {dev.type}: ratio median {ratio:.3f}x over {rounds} "
        f"alternating rounds (all {ratios[0]:.3f}-{ratios[-1]:.3f})"
    )
    if cuda and ratio > 1.05:
        failures.append(f"histograms cost {ratio:.3f}x watch() at every=10 (budget 1.05x)")
    if not failures:
        print(f"OK   {dev.type} histograms and images: stored" + (", no sync on the training thread" if cuda else ""))
    return failures


def cpu_fallback() -> int:
    """``--cpu``: case 5 on the CPU (what a machine without CUDA can check of it)."""
    with tempfile.TemporaryDirectory() as tmp:
        server = BackgroundServer(Settings(port=0, db=f"sqlite:///{tmp}/cpu.db")).start()
        try:
            failures = histograms_case(server.url, _getter(server.url), torch.device("cpu"), rounds=4)
        finally:
            server.stop()
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


def _getter(url: str):
    import json
    import urllib.request

    return lambda p: json.load(urllib.request.urlopen(url + p))


def main() -> int:
    if "-h" in sys.argv or "--help" in sys.argv:
        print(__doc__)
        return 0
    if "--cpu" in sys.argv:
        return cpu_fallback()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check here (--cpu runs the histogram case on the CPU)")
        return 2
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(24)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(256, 1024, device=dev), torch.randn(256, 1024, device=dev)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        server = BackgroundServer(Settings(port=0, db=f"sqlite:///{tmp}/gpu.db")).start()
        import json
        import urllib.request  # noqa: E401

        get = lambda p: json.load(urllib.request.urlopen(server.url + p))  # noqa: E731

        # 1. no sync on the training thread. First make sure the plain loop itself is sync-free
        # (some optimizer/torch combinations sync on their own); otherwise check with plain SGD.
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step_fn(model, opt, x, y)
        except RuntimeError:
            opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
            print("     (the plain AdamW loop syncs by itself here; checking with SGD instead)")
        finally:
            torch.cuda.set_sync_debug_mode(0)
        failures += no_context_at_init(server.url)
        run = gradwatch.init(project="gpu", name="nosync", server=server.url)
        run.watch(model, opt)
        for _ in range(5):
            run.log({"loss": step_fn(model, opt, x, y)})
        torch.cuda.synchronize()
        seen = []
        show = warnings.showwarning
        warnings.showwarning = lambda message, *a, **k: seen.append((threading.current_thread().name, str(message)))
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(100):
                run.log({"loss": step_fn(model, opt, x, y)})
            torch.cuda.set_sync_debug_mode(0)
            mine = [m for name, m in seen if name == threading.current_thread().name and "sync" in m.lower()]
            others = [m for name, m in seen if name != threading.current_thread().name]
            if mine:
                failures.append(f"{len(mine)} host-device sync(s) on the training thread, e.g. {mine[0][:200]}")
            else:
                print(
                    f"OK   no host-device sync on the training thread in 100 watched+logged steps "
                    f"({len(others)} on the sender thread, which reads values in batches)"
                )
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = show
        run.finish(timeout=60)

        # 2. memory tracking
        run_id = get("/api/runs")[0]["id"]
        keys = get(f"/api/runs/{run_id}/keys")
        for k in ("memory/cuda_allocated", "memory/cuda_reserved", "memory/cuda_peak", "grad/global_norm"):
            if k not in keys:
                failures.append(f"missing key {k}")
        alloc = get(f"/api/runs/{run_id}/series?key=memory/cuda_allocated")["values"]
        peak = get(f"/api/runs/{run_id}/series?key=memory/cuda_peak")["values"]
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        print(
            f"     cuda_allocated last={alloc[-1] / 2**20:.0f} MiB, peak={peak[-1] / 2**20:.0f} MiB, "
            f"params={params / 2**20:.0f} MiB, torch says peak={torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
        )
        if not (alloc[-1] >= params * 2 and peak[-1] <= torch.cuda.max_memory_allocated()):
            failures.append("memory counters implausible (params + grads at least, peak <= torch's peak)")
        else:
            print("OK   CUDA memory tracking")

        # 3. overhead
        def timed(run=None, n=200):
            ts = []
            for _ in range(n):
                torch.cuda.synchronize()
                t = time.perf_counter()
                loss = step_fn(model, opt, x, y)
                if run is not None:
                    run.log({"loss": loss})
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t)
            return statistics.median(ts)

        plain = timed()
        run = gradwatch.init(project="gpu", name="overhead", server=server.url)
        run.watch(model, opt)
        watched = timed(run)
        run.finish(timeout=60)
        print(
            f"     step {plain * 1e3:.3f} ms plain, {watched * 1e3:.3f} ms watched (ratio {watched / plain:.3f}x) "
            f"on {torch.cuda.get_device_name()}"
        )
        failures += signals_and_system(server.url, get, model, opt, timed)
        failures += histograms_case(server.url, get, dev)
        server.stop()
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
