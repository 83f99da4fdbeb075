"""The runs table on a 10,000-run sweep, this tree's pages against an older commit's, side by side in one run.

Run: .venv/bin/python benchmarks/bench_runs_table.py [--quick] [--runs 10000] [--old 9714c17]
One server (this tree) over one generated SQLite sweep (tests/sweep_data.py). The old pages are the
``--old`` commit's frontend/ (``git archive``), served to the same Chromium by intercepting /, /static/
(Playwright routes), so both read the same API and data. Old and new alternate per repeat (the machine is
noisy); reported: medians in milliseconds of the first render (navigation start to the first row drawn
with the count), of a scroll frame (scrollBy 900 px, two animation frames), and the grouped table's first
render (group=lr), with new/old ratios.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import sweep_data  # noqa: E402

from gradwatch_server.serve import BackgroundServer  # noqa: E402
from gradwatch_server.settings import Settings  # noqa: E402

CHROMIUM = os.environ.get("GRADWATCH_CHROMIUM") or "/usr/bin/chromium"
COLS = "config.lr,config.batch_size,config.optimizer,summary.val/loss.min"
TYPES = {".js": "application/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml"}
FIRST_ROW = (
    "() => document.querySelector('#runs tbody tr[data-run], #runs tbody tr.group-row') &&"
    " document.getElementById('count').textContent.includes('10000')"
)
SCROLL = """async () => { const out = []; for (let i = 0; i < 30; i++) {
  const t = performance.now(); window.scrollBy(0, 900);
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  out.push(performance.now() - t); } out.sort((a, b) => a - b); return out[15]; }"""


def old_frontend(rev: str, into: Path) -> Path:
    """The ``rev`` commit's frontend/ extracted under ``into``."""
    tar = subprocess.run(["git", "archive", rev, "frontend"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return into / "frontend"


def serve_old(page, base: str, folder: Path) -> None:
    """Answer the runs page and its assets from ``folder`` (the API still from the server)."""

    def answer(route):
        path = route.request.url[len(base) :].split("?")[0]
        file = folder / "index.html" if path in ("", "/") else folder / path.removeprefix("/static/")
        if not file.is_file():
            return route.continue_()
        route.fulfill(body=file.read_bytes(), content_type=TYPES.get(file.suffix, "application/octet-stream"))

    page.route(lambda url: url == base + "/" or url.startswith(base + "/?") or "/static/pages/" in url, answer)
    page.route(lambda url: "/static/lib/" in url or url.endswith("/static/style.css"), answer)


def measure(page, url: str) -> tuple[float, float]:
    """(first render ms since navigation start, median scroll frame ms) of one load of ``url``."""
    page.goto(url)
    page.wait_for_function(FIRST_ROW, timeout=120_000, polling="raf")
    first = page.evaluate("() => performance.now()")
    return first, page.evaluate(SCROLL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats instead of 7")
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--old", default="9714c17", help="the commit whose pages to compare with")
    args = ap.parse_args()
    repeat = 3 if args.quick else 7
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/sweep.db"
        sweep_data.make(url, args.runs)
        folder = old_frontend(args.old, Path(tmp))
        srv = BackgroundServer(Settings(host="127.0.0.1", port=0, db=url)).start()
        results: dict = {(side, what): [] for side in ("old", "new") for what in ("first", "scroll", "grouped")}
        try:
            with sync_playwright() as p:
                # Pages answered by a route count as another origin's: let their websocket reach 127.0.0.1.
                flags = ["--no-sandbox", "--disable-gpu", "--disable-features=LocalNetworkAccessChecks"]
                browser = p.chromium.launch(executable_path=CHROMIUM, args=flags)
                pages = {}
                for side in ("old", "new"):
                    pages[side] = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
                    if side == "old":
                        serve_old(pages[side], srv.url, folder)
                table = f"{srv.url}/?cols={COLS}&sort=summary.val/loss.min&desc=0"
                for _ in range(repeat):
                    for side, page in pages.items():
                        first, scroll = measure(page, table)
                        results[side, "first"].append(first)
                        results[side, "scroll"].append(scroll)
                        results[side, "grouped"].append(measure(page, f"{srv.url}/?cols={COLS}&group=lr")[0])
                browser.close()
        finally:
            srv.stop()
    print(f"{args.runs} runs, {repeat} repeats, old = {args.old} (medians, ms)")
    for what, label in (("first", "first render"), ("scroll", "scroll frame"), ("grouped", "grouped first render")):
        old, new = (statistics.median(results[s, what]) for s in ("old", "new"))
        print(f"{label:22} old {old:8.1f}  new {new:8.1f}  new/old {new / old:5.2f}")


if __name__ == "__main__":
    main()
