"""Soak: many training processes logging for minutes, pages watching, the server killed and restarted once.

Run: .venv/bin/python benchmarks/soak.py [--clients 20] [--seconds 180]
Checks at the end that every logged point is stored exactly once, and prints the server's memory
(RSS) over time, before and after the restart.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

PY = sys.executable
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from server_process import ServerProcess, get_json, rss_mib  # noqa: E402

CLIENT = textwrap.dedent("""
    import math, sys, time, gradwatch
    seconds, rate, name = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    run = gradwatch.init(project="soak", name=name)
    start, step = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        run.log({"loss": 1.0 / (1 + step), "lr": 1e-3, "acc": math.sin(step), "tokens": step * 512.0})
        step += 1
        time.sleep(max(0.0, start + step / rate - time.perf_counter()))
    run.finish(timeout=600)
    print(step, flush=True)
""")


def watch_pages(url: str, stop: threading.Event, counts: dict) -> list[threading.Thread]:
    """Two 'browsers': the runs-list feed and a run page's feed, reconnecting across the restart."""
    from websockets.sync.client import connect

    def follow(path: str, name: str):
        while not stop.is_set():
            try:
                with connect("ws" + url[4:] + path, open_timeout=5) as ws:
                    while not stop.is_set():
                        try:
                            ws.recv(timeout=1)
                            counts[name] = counts.get(name, 0) + 1
                        except TimeoutError:
                            pass
            except Exception:  # the server is restarting: come back
                time.sleep(0.5)

    threads = [
        threading.Thread(target=follow, args=(p, n), daemon=True)
        for p, n in (("/ws/runs", "list"), ("/ws/runs/1", "run page"))
    ]
    for t in threads:
        t.start()
    return threads


def soak(clients: int, seconds: float, rate: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        db = f"sqlite:///{tmp / 'soak.db'}"
        server = ServerProcess(db, "--crash-timeout", "120")
        url = server.url
        env = {**os.environ, "GRADWATCH_SERVER": url, "GRADWATCH_SPOOL_DIR": str(tmp / "spool")}
        procs = [
            subprocess.Popen(
                [PY, "-c", CLIENT, str(seconds), str(rate), f"c{i}"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for i in range(clients)
        ]
        stop, counts, memory = threading.Event(), {}, []
        watch_pages(url, stop, counts)
        start = time.monotonic()
        restarted = False
        while any(p.poll() is None for p in procs):
            memory.append((round(time.monotonic() - start), rss_mib(server.pid)))
            if not restarted and time.monotonic() - start > seconds / 2:
                server.kill()  # a crash, not a clean stop
                time.sleep(2)
                server = ServerProcess(db, "--crash-timeout", "120", port=server.port)
                restarted = True
            time.sleep(1)
        logged = [int(p.communicate()[0].strip() or 0) for p in procs]
        runs = sorted(get_json(url + "/api/runs"), key=lambda r: int(r["name"][1:]))
        stored = [get_json(url + f"/api/runs/{r['id']}/series?key=loss")["steps"] for r in runs]
        stop.set()
        server.stop()
    exact = all(s == list(range(n)) for s, n in zip(stored, logged)) and len(stored) == clients
    return {
        "clients": clients,
        "seconds": seconds,
        "points": sum(logged) * 4,
        "exactly_once": exact,
        "memory": memory,
        "pushes": counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--rate", type=float, default=50, help="steps/s per client (4 keys per step)")
    args = parser.parse_args()
    out = soak(args.clients, args.seconds, args.rate)
    mem = out["memory"]
    half = len(mem) // 2
    print(
        f"{out['clients']} clients x {out['seconds']:.0f} s at {args.rate:.0f} steps/s, server SIGKILLed and "
        f"restarted once: {out['points']:,} points, every one stored exactly once: {out['exactly_once']}"
    )
    print(
        f"server RSS (MiB): first half {mem[1][1]:.0f} -> {mem[half - 1][1]:.0f}; after the restart "
        f"{mem[half + 2][1]:.0f} -> {mem[-1][1]:.0f} (max {max(m for _, m in mem):.0f})"
    )
    print(f"live pushes received by the two watchers: {out['pushes']}")
    step = max(1, len(mem) // 12)
    print("server RSS over time (s: MiB): " + ", ".join(f"{t}: {m:.0f}" for t, m in mem[::step]))


if __name__ == "__main__":
    main()
