"""A 10,000-run sweep: the runs API filtered by a config key and sorted by a summary, the first render of the
runs table in Chromium, and compares (50 runs, and 1,000 runs grouped by a config key) from request to drawn lines.

Run: .venv/bin/python benchmarks/bench_sweep.py [--quick] [--runs 10000] [--json]
The sweep (lr x batch_size x optimizer x seed) is written straight into a fresh SQLite database
(tests/sweep_data.py): every run with its config and summaries; the first 1,000 with 300 points of
val/loss, loss and tokens. Reported: medians of repeated calls, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sweep_data  # noqa: E402

from gradwatch_server.serve import BackgroundServer  # noqa: E402
from gradwatch_server.settings import Settings  # noqa: E402

CHROMIUM = os.environ.get("GRADWATCH_CHROMIUM") or "/usr/bin/chromium"
WHERE = 'config.lr <= 1e-3 and config.optimizer == "adam"'
ORDER = "summary.val/loss.min"


def _ms(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), out


def _get(url: str):
    with urllib.request.urlopen(url, timeout=120) as resp:
        return json.loads(resp.read())


def api_numbers(base: str, repeat: int) -> dict:
    q = urllib.parse.urlencode({"where": WHERE, "order_by": ORDER, "columns": "summary.val/loss", "limit": 100})
    filtered, rows = _ms(lambda: _get(f"{base}/api/runs?{q}"), repeat)
    full_q = urllib.parse.urlencode({"where": WHERE, "order_by": ORDER, "columns": "summary.val/loss.min"})
    filtered_all, all_rows = _ms(lambda: _get(f"{base}/api/runs?{full_q}"), repeat)
    everything, every = _ms(lambda: _get(f"{base}/api/runs?columns=summary.val/loss.min"), max(2, repeat // 2))
    grouped, data = _ms(
        lambda: _get(f"{base}/api/compare/series?key=val/loss&group=lr&where=id%20%3C%3D%201000"), repeat
    )
    return {
        "api_filtered_sorted_top100_ms": round(filtered, 1),
        "api_filtered_sorted_all_ms": round(filtered_all, 1),
        "api_filtered_rows": len(all_rows),
        "api_all_runs_ms": round(everything, 1),
        "api_all_rows": len(every),
        "api_grouped_series_1000_runs_ms": round(grouped, 1),
        "grouped_lines": len(data["groups"]),
        "grouped_runs": len(data["runs"]),
        "sorted_ok": [r["summary"]["val/loss"]["min"] for r in rows]
        == sorted(r["summary"]["val/loss"]["min"] for r in rows),
    }


def page_numbers(base: str, repeat: int) -> dict:
    from playwright.sync_api import sync_playwright

    out: dict = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        url = f"{base}/?cols=config.lr,config.batch_size,config.optimizer,summary.val/loss.min&sort={ORDER}&desc=0"

        def table():
            page.goto(url)
            page.wait_for_selector("#runs tbody tr[data-run]", timeout=60000)
            page.wait_for_function("() => document.getElementById('count').textContent.startsWith('10000') || true")
            return page.locator("#runs tbody tr[data-run]").count()

        out["table_first_render_ms"], out["table_rows_in_dom"] = _ms(table, repeat)
        out["table_scroll_frame_ms"] = page.evaluate(
            """async () => { const out = []; for (let i = 0; i < 30; i++) {
                 const t = performance.now(); window.scrollBy(0, 900);
                 await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
                 out.push(performance.now() - t); } out.sort((a, b) => a - b); return out[15]; }"""
        )

        def compare(query: str, groups: str):
            page.goto(f"{base}/compare?{query}")
            page.wait_for_function(
                f"() => document.getElementById('group-chart')?.dataset.groups === '{groups}'", timeout=60000
            )

        ids = ",".join(str(i) for i in range(1, 51))
        out["compare_50_runs_ms"], _ = _ms(lambda: compare(f"ids={ids}&group=&key=val/loss&band=none", "50"), repeat)
        out["compare_grouped_1000_runs_ms"], _ = _ms(
            lambda: compare("project=sweep&where=id%20%3C%3D%201000&group=lr&key=val/loss", "5"), repeat
        )
        browser.close()
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def ingest_cost(url: str, batches: int) -> dict:
    """What keeping summaries adds to ingest: ``summaries.record`` per batch (10 keys x 100 steps), next to the
    batch's chunk writes on the same database."""
    from types import SimpleNamespace

    import numpy as np

    from gradwatch_server.storage import chunks, database, db, summaries

    engine = database.make_engine(url)
    keys = [f"k{i}" for i in range(10)]
    rec, store = [], []
    with engine.begin() as conn:
        conn.execute(
            db.runs.insert().values(uid="ing", project="i", name="i", status="running", created_at=0, updated_at=0)
        )
        run_id = conn.execute(db.runs.select().where(db.runs.c.uid == "ing")).first().id
        ids = [conn.execute(db.metric_keys.insert().values(run_id=run_id, key=k)).inserted_primary_key[0] for k in keys]
    tails = {k: chunks.Tail(slots=1) for k in ids}
    for b in range(batches):
        steps = np.arange(b * 100, (b + 1) * 100, dtype=np.int64)
        walls = steps.astype(np.float64)
        values = np.random.default_rng(b).normal(size=(100, 1))
        stored = {k: ("scalar", steps, walls, SimpleNamespace(values=values, missing=None)) for k in keys}
        with engine.begin() as conn:
            t = time.perf_counter()
            writes = chunks.Writes()
            for key_id in ids:
                chunks.append(writes, tails[key_id], key_id, chunks.Points(steps, walls, values))
            writes.flush(conn)
            t2 = time.perf_counter()
            summaries.record(conn, run_id, stored)
            t3 = time.perf_counter()
        store.append((t2 - t) * 1e6)
        rec.append((t3 - t2) * 1e6)
    engine.dispose()
    return {
        "ingest_summaries_us_per_batch": round(statistics.median(rec)),
        "ingest_chunk_writes_us_per_batch": round(statistics.median(store)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats (the run count stays)")
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    repeat = 3 if args.quick else 9
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/sweep.db"
        t = time.perf_counter()
        sweep_data.make(url, args.runs, steps=300, points_for=1000)
        made = time.perf_counter() - t
        srv = BackgroundServer(Settings(host="127.0.0.1", port=0, db=url)).start()
        try:
            result = {"runs": args.runs, "generate_s": round(made, 1), **api_numbers(srv.url, repeat)}
            result.update(ingest_cost(f"sqlite:///{tmp}/ingest.db", 50 if args.quick else 300))
            if not args.no_browser:
                result.update(page_numbers(srv.url, repeat))
        finally:
            srv.stop()
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for k, v in result.items():
            print(f"{k:36} {v}")


if __name__ == "__main__":
    main()
