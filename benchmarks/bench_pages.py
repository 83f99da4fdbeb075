"""How the run page opens and copes with a fast live run, in real Chromium.

Run: .venv/bin/python benchmarks/bench_pages.py [--rate 2000] [--seconds 10] [--quick]
First, a finished run of 20,000 steps and 12 metrics that diverged (an open critical incident) is
opened --loads times at 1440x900: how long after navigation its first chart is drawn (the goal: at
most 1 s) and where (inside the first viewport). Then a run logs loss, lr, global norm and a
100-layer gradient-norm vector at --rate steps/s while the run page is open. Reported: how much of
the page's main thread the chart updates took, how long one redraw took, and how many steps the
chart trailed the newest logged step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import ServerProcess  # noqa: E402

import gradwatch  # noqa: E402

# The page is an ES module: the flush timings come from the hook common.throttle reports to
# (window.__gwFlushMs), the heatmap's draws from wrapping the method on the module's instance.
INSTRUMENT = """async () => {
  window.__gwFlushMs = []; window.__heatMs = []; window.__liveMs.length = 0;
  const { heatmap } = await import("/static/pages/run.js");
  const draw = heatmap.draw.bind(heatmap);
  heatmap.draw = (...a) => { const t = performance.now(); const r = draw(...a); window.__heatMs.push(performance.now() - t); return r; };
}"""
# Installed before the page's scripts: times every websocket message handler (parse + onLive).
TIME_MESSAGES = """window.__liveMs = [];
Object.defineProperty(WebSocket.prototype, "onmessage", { set(fn) {
  this.addEventListener("message", (ev) => { const t = performance.now(); fn(ev); window.__liveMs.push(performance.now() - t); });
} });"""
LAST_X = "() => { const x = document.getElementById('chart-loss').data[0].x; return x[x.length - 1]; }"
# Installed before the page's scripts: when (ms after navigation) the loss chart first holds a trace.
FIRST_CHART = """window.__firstChart = null;
const poll = () => { const d = document.getElementById('chart-loss');
  if (d && d.data && d.data.length) window.__firstChart = performance.now(); else requestAnimationFrame(poll); };
requestAnimationFrame(poll);"""


def diverged_run(url: str, steps: int = 20_000) -> int:
    """A finished run that learned, then diverged into NaN: the server raises an incident on it."""
    run = gradwatch.init(project="bench", name="diverged", server=url, flush_interval=0.1)
    onset = steps * 3 // 4
    for step in range(steps):
        loss = 1 / math.sqrt(step + 1) if step < onset else 10.0 ** min(300, (step - onset) / 20)
        loss = math.nan if step >= steps - 50 else loss
        metrics = {"loss": loss, "lr": 1e-3 * (1 + max(0, step - onset)), "grad/global_norm": 1.0 + loss}
        metrics.update({f"train/m{i}": math.sin(step / (100 + i)) for i in range(6)})
        metrics.update({f"val/m{i}": math.cos(step / (100 + i)) for i in range(6)} if step % 50 == 0 else {})
        run.recorder.put_record(step, metrics, {})
    run.finish(timeout=300)
    return run.id


def first_chart(browser, url: str, run_id: int, loads: int) -> None:
    """Prints how soon, and where, the run page draws its first chart (an open incident above it)."""
    times, tops = [], []
    for _ in range(loads):
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.add_init_script(FIRST_CHART)
        page.goto(f"{url}/runs/{run_id}")
        page.wait_for_function("() => window.__firstChart !== null", timeout=30000)
        times.append(page.evaluate("() => window.__firstChart"))
        tops.append(page.evaluate("() => document.getElementById('chart-loss').getBoundingClientRect().bottom"))
        incident = page.locator("#incident-line").inner_text()
        page.close()
    ok = max(times) <= 1000 and max(tops) <= 900
    print(f"run page with an open incident ({incident.splitlines()[0][:60]}...), {loads} loads at 1440x900:")
    print(
        f"first chart drawn: median {statistics.median(times):.0f} ms, max {max(times):.0f} ms after navigation; "
        f"its bottom at {max(tops):.0f} px of 900 -> {'within' if ok else 'NOT within'} the 1 s / first-viewport goal"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--layers", type=int, default=100)
    ap.add_argument("--loads", type=int, default=5, help="page loads of the diverged run [5]")
    ap.add_argument("--quick", action="store_true", help="3 loads and a 4-second live run")
    args = ap.parse_args()
    if args.quick:
        args.loads, args.seconds = 3, 4.0
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("GRADWATCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        server = ServerProcess(f"sqlite:///{tmp}/pages.db")
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            first_chart(browser, server.url, diverged_run(server.url), args.loads)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.add_init_script(TIME_MESSAGES)
            run = gradwatch.init(project="bench", name="fast", server=server.url, flush_interval=0.1)
            names = [f"layer{i}.weight" for i in range(args.layers)]
            run.recorder.put_layout("grad", names)
            run.log({"loss": 1.0, "lr": 1e-3, "grad/global_norm": 1.0}, step=0)
            time.sleep(1.0)
            page.goto(f"{server.url}/runs/{run.id}")
            page.wait_for_function(
                "() => { const d = document.getElementById('chart-loss').data; return d && d[0].x.length; }"
            )
            page.evaluate(INSTRUMENT)
            lags, server_lags, step, start = [], [], 1, time.perf_counter()
            busy_before = page.evaluate("() => performance.now()")
            while time.perf_counter() - start < args.seconds:
                due = int((time.perf_counter() - start) * args.rate)
                while step <= due:
                    norms = [1.0 / (1 + i) for i in range(args.layers)]
                    run.recorder.put_record(
                        step,
                        {"loss": 1 / math.sqrt(step), "lr": 1e-3, "grad/global_norm": 1.0},
                        {"grad": (norms, [], args.layers)},
                    )
                    step += 1
                if step % 500 < 50:
                    with urllib.request.urlopen(f"{server.url}/api/runs/{run.id}") as resp:
                        stored = json.load(resp)["last_step"]
                    lags.append(step - 1 - page.evaluate(LAST_X))
                    server_lags.append(step - 1 - stored)
                time.sleep(0.005)
            elapsed_page = page.evaluate("() => performance.now()") - busy_before
            run.finish(timeout=120)
            flush_ms = page.evaluate("() => window.__gwFlushMs")
            heat_ms = page.evaluate("() => window.__heatMs")
            live_ms = page.evaluate("() => window.__liveMs")
            points = page.evaluate("() => document.getElementById('chart-loss').data[0].x.length")
        finally:
            browser.close()
            server.stop()
    busy = (sum(flush_ms) + sum(heat_ms) + sum(live_ms)) / elapsed_page
    print(
        f"live run at {args.rate:.0f} steps/s for {args.seconds:.0f} s ({step - 1} steps, {args.layers}-layer heatmap)"
    )
    print(
        f"chart flushes : {len(flush_ms)} ({len(flush_ms) / args.seconds:.1f}/s), median {statistics.median(flush_ms):.1f} ms, "
        f"max {max(flush_ms):.1f} ms"
    )
    print(f"heatmap draws : {len(heat_ms)}, median {statistics.median(heat_ms) if heat_ms else 0:.1f} ms")
    print(f"live messages : {len(live_ms)}, median {statistics.median(live_ms):.1f} ms to take one in")
    print(f"main thread busy with live data: {busy:.0%} of wall time; loss chart holds {points} points")
    for what, lag in (("stored in the database", server_lags), ("drawn on the chart", lags)):
        print(
            f"lag behind the newest logged step, {what}: median {statistics.median(lag):.0f} steps "
            f"(~{statistics.median(lag) / args.rate * 1000:.0f} ms), max {max(lag):.0f}"
        )


if __name__ == "__main__":
    main()
