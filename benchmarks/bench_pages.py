"""How the run page opens and copes with a fast live run, in real Chromium.

Run: .venv/bin/python benchmarks/bench_pages.py [--rate 2000] [--seconds 10] [--quick] [--baseline REV]
First, a finished run of 20,000 steps and 12 metrics that diverged (an open critical incident) is
opened --loads times at 1440x900: how long after navigation its loss chart shows its data (the goal: at
most 1 s; the SVG sketch drawn before Plotly counts, and Plotly's interactive chart is timed too) and where (inside the first viewport). Then a run logs loss, lr, global norm and a
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
import subprocess
import sys
import tempfile
import time
import urllib.parse
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
# Installed before the page's scripts: when (ms after navigation) the loss chart first shows its data
# (a drawn line: the first-paint sketch, lib/quickchart.js, or Plotly's), and when Plotly's chart,
# the interactive one, holds the trace.
FIRST_CHART = """window.__firstChart = null; window.__plotlyChart = null;
const drawn = (d) => [...d.querySelectorAll('svg path.line, svg path.js-line')].some((p) => (p.getAttribute('d') || '').length > 50);
const poll = () => { const d = document.getElementById('chart-loss');
  if (d && window.__firstChart === null && drawn(d)) window.__firstChart = performance.now();
  if (d && d.data && d.data.length) window.__plotlyChart = performance.now(); else requestAnimationFrame(poll); };
requestAnimationFrame(poll);"""


def serve_revision(page, rev: str) -> None:
    """Serves the run page and its static files as they were at git revision rev (a side-by-side baseline)."""
    root = Path(__file__).resolve().parents[1]
    types = {".js": "application/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml"}

    def handle(route):
        path = urllib.parse.urlparse(route.request.url).path
        rel = "run.html" if path.startswith("/runs/") else path.removeprefix("/static/")
        got = subprocess.run(["git", "-C", str(root), "show", f"{rev}:frontend/{rel}"], capture_output=True)
        if got.returncode:
            return route.fallback()  # not a frontend file then (vendor/plotly.min.js, the API)
        route.fulfill(body=got.stdout, content_type=types.get(Path(rel).suffix, "text/plain"))

    page.route(lambda url: urllib.parse.urlparse(url).path.startswith(("/runs/", "/static/")), handle)


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


def first_chart(browser, url: str, run_id: int, loads: int, baseline: str | None) -> None:
    """Prints how soon, and where, the run page draws its first chart (an open incident above it): on a first
    visit (a fresh browser profile each load), on a revisit (the HTTP cache and Chromium's code cache warm)
    and, with a baseline, on a first visit of the page as it was at that revision."""
    revisits = browser.new_context(viewport={"width": 1440, "height": 900})
    variants = {"first visit": (None, None), "revisit": (None, revisits)}
    if baseline:
        variants[f"baseline {baseline}"] = (baseline, None)
    times = {v: [] for v in variants}
    interactive, tops, incident = {v: [] for v in variants}, [], ""

    def load(rev, context):
        page = context.new_page() if context else browser.new_page(viewport={"width": 1440, "height": 900})
        if rev:
            serve_revision(page, rev)
        page.add_init_script(FIRST_CHART)
        page.goto(f"{url}/runs/{run_id}")
        page.wait_for_function("() => window.__firstChart !== null && window.__plotlyChart !== null", timeout=30000)
        return page

    load(None, revisits).close()  # the visit that fills the cache
    for _ in range(loads):
        for name, (rev, context) in variants.items():  # interleaved, so all see the same machine load
            page = load(rev, context)
            times[name].append(page.evaluate("() => window.__firstChart"))
            interactive[name].append(page.evaluate("() => window.__plotlyChart"))
            if not rev:
                tops.append(page.evaluate("() => document.getElementById('chart-loss').getBoundingClientRect().bottom"))
                incident = page.locator("#incident-line").inner_text()
            page.close()
    revisits.close()
    print(f"run page with an open incident ({incident.splitlines()[0][:60]}...), {loads} loads at 1440x900:")
    print(f"machine load average: {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} cores")
    for name in variants:
        t, i = times[name], interactive[name]
        ok = max(t) <= 1000 and max(tops) <= 900
        print(
            f"{name:>20}: loss chart with its data drawn: median {statistics.median(t):.0f} ms, max {max(t):.0f} ms; "
            f"Plotly's (hover, zoom): median {statistics.median(i):.0f} ms"
            + (
                f"; bottom at {max(tops):.0f} px of 900 -> {'within' if ok else 'NOT within'} the 1 s / first-viewport goal"
                if name == "first visit"
                else ""
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--layers", type=int, default=100)
    ap.add_argument("--loads", type=int, default=5, help="page loads of the diverged run [5]")
    ap.add_argument(
        "--baseline", metavar="REV", help="also time the run page as it was at this git revision, interleaved"
    )
    ap.add_argument("--quick", action="store_true", help="3 loads and a 4-second live run")
    args = ap.parse_args()
    if args.quick:
        args.loads, args.seconds = 3, 4.0
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("GRADWATCH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        server = ServerProcess(f"sqlite:///{tmp}/pages.db")
        # A page served by a route (the baseline) is not "from" 127.0.0.1 to Chromium's local network
        # checks, which would then block its websocket to the server.
        flags = ["--disable-features=LocalNetworkAccessChecks"] if args.baseline else []
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu", *flags])
        try:
            first_chart(browser, server.url, diverged_run(server.url), args.loads, args.baseline)
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
