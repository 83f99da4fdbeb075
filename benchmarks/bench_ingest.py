"""Ingest through the whole path next to raw SQLite row inserts of the same points, in one run.

Run: .venv/bin/python benchmarks/bench_ingest.py [--quick] [--repeat 3]
For each scenario: separate training processes (the real ``gradwatch`` client: ``init``, ``log``
or ``watch``, ``finish``) stream to a real ``gradwatch serve`` on a fresh SQLite file; the clock
stops when every point is queryable over HTTP. The baseline is ``sqlite3.executemany`` of the
same points as (run, key, step, value) rows into a WITHOUT ROWID table, in the same run.
Also: a 1M-step single-scalar run logged as fast as Python can call ``log()`` (loop time and how
long after the loop it is completely stored), and log() -> readable over HTTP latency at 20 and
at 5,000 steps/s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
sys.path.insert(0, str(ROOT / "tests"))

from pg_cluster import fresh_database, optional_cluster  # noqa: E402
from server_process import ServerProcess, get_json  # noqa: E402

SCALAR_CLIENT = textwrap.dedent("""
    import sys, time, gradwatch
    steps, keys, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    run = gradwatch.init(project="bench", name=name)
    names = [f"k{i}" for i in range(keys)]
    t0 = time.perf_counter()
    for s in range(steps):
        run.log({k: s * 1e-3 + j for j, k in enumerate(names)})
    loop = time.perf_counter() - t0
    run.finish(timeout=600)
    print(loop, time.perf_counter() - t0, flush=True)
""")

VECTOR_CLIENT = textwrap.dedent("""
    # Per-layer norms arrive through the path run.watch() uses (run.recorder.put_layout / put_record), with
    # precomputed values: this measures delivery and storage, not the model's backward pass.
    import sys, time, gradwatch
    steps, layers, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    run = gradwatch.init(project="bench", name=name)
    run.recorder.put_layout("grad", [f"layer{i}.weight" for i in range(layers)])
    norms = [[1e-3 * (i + 1) * (1 + k % 7) for i in range(layers)] for k in range(64)]
    t0 = time.perf_counter()
    for s in range(steps):
        run.recorder.put_record(s, {"loss": 1.0 / (s + 1), "grad/global_norm": 1.0}, {"grad": (norms[s % 64], (), layers)})
    loop = time.perf_counter() - t0
    run.finish(timeout=600)
    print(loop, time.perf_counter() - t0, flush=True)
""")


POSTGRES: str | None = None  # a cluster URL (--postgres): each server gets a fresh database in it
WORKERS = 1


class Server(ServerProcess):
    """``gradwatch serve`` in its own process on a fresh SQLite file (or a fresh PostgreSQL database)."""

    def __init__(self, tmp: Path):
        self.db = tmp / "bench.db"
        super().__init__(fresh_database(POSTGRES) if POSTGRES else f"sqlite:///{self.db}", "--workers", str(WORKERS))


def wait_stored(url: str, runs: int, last_step: int, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = get_json(url + "/api/runs")
        if len(rows) >= runs and all(r["last_step"] == last_step and r["status"] == "finished" for r in rows):
            return
        time.sleep(0.02)
    raise RuntimeError("points not stored in time")


def run_clients(script: str, url: str, clients: int, steps: int, width: int, tmp: Path) -> tuple[float, list]:
    """Seconds from the clients' start until every point is queryable; and each client's (loop, total)."""
    env = {**os.environ, "GRADWATCH_SERVER": url, "GRADWATCH_SPOOL_DIR": str(tmp / "spool")}
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [PY, "-c", script, str(steps), str(width), f"c{i}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(clients)
    ]
    wait_stored(url, clients, steps - 1)
    elapsed = time.perf_counter() - start
    times = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        if p.returncode:
            raise RuntimeError(f"client failed: {err[-2000:]}")
        times.append(tuple(float(x) for x in out.split()))
    return elapsed, times


def raw_sqlite(tmp: Path, clients: int, steps: int, keys: int) -> float:
    """Seconds to executemany the same points, one row each, into a (run, key, step) WITHOUT ROWID table."""
    path = tmp / f"raw-{time.monotonic_ns()}.db"
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")  # the durability gradwatch acks with by default
    con.execute(
        "CREATE TABLE points (run INTEGER, key INTEGER, step INTEGER, value REAL, "
        "PRIMARY KEY (run, key, step)) WITHOUT ROWID"
    )
    rows = [(r, k, s, s * 1e-3 + k) for r in range(clients) for s in range(steps) for k in range(keys)]
    start = time.perf_counter()
    for i in range(0, len(rows), 100_000):  # committed in batches, as a server would
        con.executemany("INSERT INTO points VALUES (?, ?, ?, ?)", rows[i : i + 100_000])
        con.commit()
    elapsed = time.perf_counter() - start
    con.close()
    return elapsed


def scenario(name, script, clients, steps, width, points_per_step, repeat) -> dict:
    results, raws, loops = [], [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            server = Server(tmp)
            try:
                elapsed, times = run_clients(script, server.url, clients, steps, width, tmp)
            finally:
                server.stop()
            size = 0 if POSTGRES else server.db.stat().st_size + sum(p.stat().st_size for p in tmp.glob("bench.db-*"))
            used = 0 if POSTGRES else used_bytes(server.db)
            raws.append(raw_sqlite(tmp, clients, steps, points_per_step))
            results.append(elapsed)
            loops.append(max(t[0] for t in times))
    points = clients * steps * points_per_step
    med, raw = statistics.median(results), statistics.median(raws)
    return {
        "scenario": name,
        "points": points,
        "seconds": med,
        "spread": (min(results), max(results)),
        "points_s": points / med,
        "raw_points_s": points / raw,
        "ratio": raw / med,
        "loop_s": statistics.median(loops),
        "bytes_per_point": size / points,
        "used_per_point": used / points,
    }


def used_bytes(path: Path) -> int:
    """Bytes of the SQLite file's pages in use: the file less its free pages (rows deleted since, such as the
    raw small rows merged into compressed chunks, leave pages a later write reuses), the WAL left out."""
    con = sqlite3.connect(path)
    try:
        pages, free, size = (
            con.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size")
        )
    finally:
        con.close()
    return (pages - free) * size


def million_steps(steps: int) -> dict:
    """One scalar logged as fast as Python can call log(): loop time, and stored how long after the loop."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = Server(tmp)
        try:
            _elapsed, times = run_clients(SCALAR_CLIENT, server.url, 1, steps, 1, tmp)
        finally:
            server.stop()
    loop, total = times[0]
    return {"steps": steps, "loop_s": loop, "stored_after_loop_s": total - loop}


LATENCY_CLIENT = textwrap.dedent("""
    import sys, time, gradwatch
    rate, n = float(sys.argv[1]), int(sys.argv[2])
    run = gradwatch.init(project="bench", name=f"latency-{rate}")
    run.log({"warm": 0.0})
    time.sleep(2.0)  # the observer subscribes meanwhile
    start = time.perf_counter()
    for s in range(n):
        run.log({"x": float(s)}, step=s + 1)  # its wall time t is taken inside log()
        time.sleep(max(0.0, start + (s + 1) / rate - time.perf_counter()))
    run.finish()
""")


def latency(rate: float, n: int) -> dict:
    """log() -> pushed to an open page, and -> readable over HTTP, per point, from the point's own time."""
    import threading

    from websockets.sync.client import connect

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = Server(tmp)
        env = {**os.environ, "GRADWATCH_SERVER": server.url, "GRADWATCH_SPOOL_DIR": str(tmp / "spool")}
        client = subprocess.Popen([PY, "-c", LATENCY_CLIENT, str(rate), str(n)], env=env, stderr=subprocess.DEVNULL)
        try:
            while not get_json(server.url + "/api/runs"):
                time.sleep(0.01)
            run_id = get_json(server.url + "/api/runs")[0]["id"]
            pushed, readable = [], []
            ws = connect("ws" + server.url[4:] + f"/ws/runs/{run_id}", max_size=None)
            poller = threading.Thread(target=_poll_http, args=(server.url, run_id, n, readable), daemon=True)
            poller.start()
            while len(pushed) < n:
                msg = json.loads(ws.recv(timeout=60))
                now = time.time()
                x = (msg.get("series") or {}).get("x") if msg.get("type") == "points" else None
                if x:
                    pushed += [now - t for t in x["wall_times"]]
            ws.close()
            poller.join(timeout=60)
            client.wait(timeout=120)
        finally:
            client.kill()
            server.stop()
    return {"rate": rate, "push": _pct(pushed), "http": _pct(readable)}


def _poll_http(url: str, run_id: int, n: int, out: list) -> None:
    seen = 0
    while seen < n:
        got = (
            get_json(url + f"/api/runs/{run_id}/series?key=x&start={seen + 1}") if seen or _has_x(url, run_id) else None
        )
        now = time.time()
        if got and got["steps"]:
            out += [now - t for t in got["wall_times"]]
            seen = got["steps"][-1]


def _has_x(url: str, run_id: int) -> bool:
    return "x" in get_json(url + f"/api/runs/{run_id}/keys")


def _pct(values: list) -> tuple[float, float]:
    values = sorted(values)
    return values[len(values) // 2] * 1e3, values[max(0, int(len(values) * 0.99) - 1)] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (CI keeps the script working)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", action="store_true", help="a throwaway PostgreSQL cluster instead of SQLite")
    parser.add_argument("--workers", type=int, default=1, help="server processes (PostgreSQL only)")
    parser.add_argument("--only-ingest", action="store_true", help="skip the 1M-step and latency parts")
    args = parser.parse_args()
    global POSTGRES, WORKERS
    with optional_cluster(args.postgres) as url:
        POSTGRES, WORKERS = url, args.workers
        report(args)


def report(args) -> None:
    q = args.quick
    repeat = 1 if q else args.repeat
    engine = f"PostgreSQL, {WORKERS} server process(es)" if POSTGRES else "SQLite"
    print(
        f"# gradwatch ingest benchmark ({engine})\n\nmachine: {platform.platform()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; command: {' '.join(sys.argv)}\n"
    )
    rows = [
        scenario("1 client, 50 scalar keys", SCALAR_CLIENT, 1, 2000 if q else 20000, 50, 50, repeat),
        scenario("4 clients, 50 scalar keys", SCALAR_CLIENT, 4, 500 if q else 5000, 50, 50, repeat),
        scenario("1 client, 300-layer vectors", VECTOR_CLIENT, 1, 300 if q else 5000, 300, 302, repeat),
        scenario("4 clients, 300-layer vectors", VECTOR_CLIENT, 4, 100 if q else 1500, 300, 302, repeat),
    ]
    print(
        "| scenario | points | whole path (s, median [min-max]) | points/s | raw SQLite rows/s | ratio | "
        "client loop (s) | bytes/point: file and WAL | in use |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['scenario']} | {r['points']:,} | {r['seconds']:.2f} [{r['spread'][0]:.2f}-{r['spread'][1]:.2f}] | "
            f"{r['points_s']:,.0f} | {r['raw_points_s']:,.0f} | **{r['ratio']:.2f}** | {r['loop_s']:.2f} | "
            f"{r['bytes_per_point']:.1f} | {r['used_per_point']:.1f} |"
        )
    if args.only_ingest:
        return
    big = million_steps(20_000 if q else 1_000_000)
    print(
        f"\n{big['steps']:,} steps of one scalar, log() as fast as Python can: loop {big['loop_s']:.2f} s, "
        f"completely stored {big['stored_after_loop_s']:.2f} s after the loop ended."
    )
    print(
        "\n| logging rate | log() -> pushed to a page, p50 / p99 (ms) | log() -> readable over HTTP, p50 / p99 (ms) |"
    )
    print("|---|---|---|")
    for rate, n in ((20, 40 if q else 400), (5000, 2000 if q else 20000)):
        lat = latency(rate, n)
        print(
            f"| {rate:,} steps/s | {lat['push'][0]:.1f} / {lat['push'][1]:.1f} | {lat['http'][0]:.1f} / "
            f"{lat['http'][1]:.1f} |"
        )


if __name__ == "__main__":
    main()
