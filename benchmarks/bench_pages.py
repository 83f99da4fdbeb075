"""How the run page copes with a fast live run: redraw cost, main-thread load and lag, in real Chromium.

Run: .venv/bin/python benchmarks/bench_pages.py [--rate 2000] [--seconds 10]
A run logs loss, lr, global norm and a 100-layer gradient-norm vector at --rate steps/s while the
run page is open. Reported: how much of the page's main thread the chart updates took, how long
one redraw took, and how many steps the chart trailed the newest logged step.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--layers", type=int, default=100)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("GRADWATCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        server = ServerProcess(f"sqlite:///{tmp}/pages.db")
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.add_init_script(TIME_MESSAGES)
            run = gradwatch.init(project="bench", name="fast", server=server.url, flush_interval=0.1)
            names = [f"layer{i}.weight" for i in range(args.layers)]
            run.recorder.put_layout("grad", names)
            run.log({"loss": 1.0, "lr": 1e-3, "grad/global_norm": 1.0}, step=0)
            time.sleep(1.0)
            page.goto(f"{server.url}/runs/1")
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
                    with urllib.request.urlopen(f"{server.url}/api/runs/1") as resp:
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
