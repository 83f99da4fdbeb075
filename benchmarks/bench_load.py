"""Many live runs on one server: server CPU per logged step, log->page latency, memory, and how many runs it holds.

Run: .venv/bin/python benchmarks/bench_load.py [--quick] [--runs 20 --rate 10] [--find] [--real 4] [--postgres [--workers 2]]
A real ``gradwatch serve`` on a fresh SQLite file. N live runs each log one step of 2 scalars
``rate`` times a second: simulated runs are websocket connections of this process speaking the
real protocol (``gradwatch.protocol``: hello, ``columns`` batches of one step each, as the idle
client link sends them); ``--real K`` makes K of them real training processes (``gradwatch.init``
+ ``run.log``). A page (a ``/ws/runs/{id}`` subscriber) watches one run and times every point
from its ``log`` wall time to its arrival. Over a steady window: the server process's CPU from
/proc (user + system), per step it committed (until it caught up with the window's steps); its RSS; push latency p50/p99; and at the end every run's
points are counted over HTTP (each stored exactly once). ``--find`` doubles N until p99 > 250 ms
or the runs cannot keep their rate, then bisects to within an eighth, and reports the largest N that held. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from pg_cluster import fresh_database, optional_cluster  # noqa: E402
from server_process import ServerProcess, get_json, rss_mib  # noqa: E402

from gradwatch import protocol  # noqa: E402
from gradwatch.delivery.sender import MIN_GAP  # noqa: E402

KEYS = ("loss", "acc")
FLUSH_INTERVAL = 0.2  # the client's default flush_interval
P99_LIMIT_MS = 250.0
TICK = os.sysconf("SC_CLK_TCK")
POSTGRES: str | None = None  # a throwaway cluster's URL (--postgres): each server gets a fresh database in it
WORKERS = 1

REAL_CLIENT = textwrap.dedent("""
    import sys, time, gradwatch
    rate, seconds, name = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    run = gradwatch.init(project="load", name=name)
    start, s = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        run.log({"loss": 1.0 / (s + 1), "acc": s * 1e-3}, step=s)
        s += 1
        time.sleep(max(0.0, start + s / rate - time.perf_counter()))
    run.finish(timeout=120)
    print(s, flush=True)
""")


def _stat(pid: int) -> list:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU so far of a process, its threads and its child processes (``--workers``), plus
    PostgreSQL's server processes when it is the database (its work is the server's too)."""
    parents: dict = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields, comm = _stat(int(entry.name)), (entry / "comm").read_text().strip()
            except OSError:
                continue
            parents[int(entry.name)] = (int(fields[1]), comm, (int(fields[11]) + int(fields[12])) / TICK)
    total = 0.0
    for p, (_parent, comm, cpu) in parents.items():
        q = p
        while q in parents and q != pid:
            q = parents[q][0]
        if q == pid or (POSTGRES and comm in ("postgres", "postmaster")):
            total += cpu
    return total


class SimRun:
    """One simulated live run: a websocket that says hello, then sends one-step batches at a steady rate."""

    def __init__(self, ws_url: str, index: int):
        self.ws_url, self.index = ws_url, index
        self.sent = self.acked = self.batches = 0
        self.sizes: list = []  # steps in each batch sent, by seq - 1
        self.gap = 0.0  # what the server's last ack asked for: a real client's link coalesces to it
        self.pending: list = []
        self.last_batch = 0.0
        self.late = 0  # steps sent more than one period behind schedule (the generator could not keep up)
        self.run_id: int | None = None
        self.timer: asyncio.TimerHandle | None = None  # the link's wait for its gap or flush interval to pass
        self.waking: asyncio.Future | None = None  # the send that timer started

    async def open(self, websockets):
        # As the real client link: no permessage-deflate (packed floats barely compress).
        self.ws = await websockets.connect(self.ws_url + protocol.INGEST_PATH, max_size=None, compression=None)
        run = {
            "uid": f"load-{os.getpid()}-{self.index}-{time.monotonic_ns()}",
            "project": "load",
            "name": f"sim{self.index}",
        }
        await self.ws.send(protocol.dumps(protocol.hello(run)))
        welcome = json.loads(await self.ws.recv())
        self.run_id = welcome["run_id"]
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for text in self.ws:
            msg = json.loads(text)
            if msg.get("type") == "ack":
                self.acked = msg["seq"]
                self.gap = msg.get("gap", 0.0)
                await self.flush_or_wait()

    async def send(self, rate: float, until: float, offset: float) -> None:
        period = 1.0 / rate
        start = time.monotonic() + offset
        while True:
            due = start + self.sent * period
            if due >= until:
                return await self.flush()
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -period:
                self.late += 1
            step = self.sent
            self.pending.append((step, time.time(), {"loss": 1.0 / (step + 1), "acc": step * 1e-3}, {}))
            self.sent += 1
            await self.flush_or_wait()

    def wait(self) -> float:
        """Seconds until the real client link (delivery/sender.py ``_cycle``) sends what is pending: an idle
        link once MIN_GAP, or the gap a busy server asked for, has passed since its last batch; one with a
        batch in flight when its ack comes or the flush interval has passed, so batches grow when the
        server falls behind. 0: send now."""
        since = time.monotonic() - self.last_batch
        idle = self.batches == self.acked
        return max(0.0, (max(MIN_GAP, self.gap) if idle else FLUSH_INTERVAL) - since)

    async def flush_or_wait(self) -> None:
        """Send the pending steps if they are due, else wake when they are, as the real link's timed wait does
        (its records go at the gap's end, the tick the server's clock set: not at the next logged step)."""
        if not self.pending:
            return
        wait = self.wait()
        if wait <= 0:
            return await self.flush()
        loop = asyncio.get_running_loop()
        if self.timer is not None and self.timer.when() <= loop.time() + wait:
            return  # already woken in time
        if self.timer is not None:
            self.timer.cancel()  # an ack made them due sooner
        self.timer = loop.call_later(wait, self._wake)

    def _wake(self) -> None:
        self.timer = None
        self.waking = asyncio.ensure_future(self.flush_or_wait())  # held: the loop keeps tasks weakly

    async def flush(self) -> None:
        if self.pending:
            self.batches += 1
            self.sizes.append(len(self.pending))
            msg = {"type": "batch", "seq": self.batches, "columns": protocol.encode_columns(self.pending)}
            self.pending, self.last_batch = [], time.monotonic()
            await self.ws.send(protocol.dumps(msg))

    def acked_steps(self) -> int:
        return sum(self.sizes[: self.acked])

    async def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.waking is not None and not self.waking.done():
            self.waking.cancel()
        await self.ws.close()
        self.reader.cancel()


async def watch_page(ws_url: str, run_id: int, out: list, stop: asyncio.Event, websockets) -> None:
    """A page on one run: the delay from each point's log time to its arrival here."""
    async with websockets.connect(ws_url + f"/ws/runs/{run_id}", max_size=None) as ws:
        while not stop.is_set():
            try:
                text = await asyncio.wait_for(ws.recv(), 0.5)
            except asyncio.TimeoutError:
                continue
            now = time.time()
            msg = json.loads(text)
            series = msg.get("series") or {} if msg.get("type") == "points" else {}
            loss = series.get("loss")
            if loss:
                out.extend(now - t for t in loss["wall_times"])


def pct(values: list, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1e3 if values else float("nan")


async def drive(url: str, pid: int, n: int, rate: float, seconds: float, warmup: float) -> dict:
    """N simulated runs for warmup + seconds; measured over the steady window."""
    import websockets

    ws_url = "ws" + url[4:]
    runs = [SimRun(ws_url, i) for i in range(n)]
    for i in range(0, n, 50):  # hellos in waves: each is a writer transaction
        await asyncio.gather(*(r.open(websockets) for r in runs[i : i + 50]))
    latencies: list = []
    stop = asyncio.Event()
    page = asyncio.ensure_future(watch_page(ws_url, runs[0].run_id, latencies, stop, websockets))
    await asyncio.sleep(0.3)  # the page subscribes
    until = time.monotonic() + warmup + seconds
    senders = [asyncio.ensure_future(r.send(rate, until, i / (n * rate))) for i, r in enumerate(runs)]
    await asyncio.sleep(warmup)
    sent0, cpu0, lat0, t0 = sum(r.sent for r in runs), cpu_seconds(pid), len(latencies), time.monotonic()
    done0 = sum(r.acked_steps() for r in runs)
    await asyncio.gather(*senders)
    sent1, t1 = sum(r.sent for r in runs), time.monotonic()
    batches = sum(r.batches for r in runs)
    rss = rss_mib(pid)
    deadline = time.monotonic() + 120
    while sum(r.acked for r in runs) < batches and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    # CPU per step over what the server committed from the window's start until it caught up: a
    # server that falls behind pays for the backlog after the window, and that counts too.
    cpu1, behind = cpu_seconds(pid), time.monotonic() - t1
    done = sum(r.acked_steps() for r in runs) - done0
    await asyncio.sleep(0.3)
    stop.set()
    await page
    for r in runs:
        await r.close()
    window = latencies[lat0:]
    steps = sent1 - sent0
    return {
        "runs": n,
        "rate": rate,
        "achieved": steps / (t1 - t0) / n,
        "cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0 + behind),
        "cpu_ms_per_step": 1e3 * (cpu1 - cpu0) / max(done, 1),
        "behind_s": behind,
        "done": done,
        "window_s": t1 - t0,
        "p50": pct(window, 0.5),
        "p99": pct(window, 0.99),
        "rss": rss,
        "late": sum(r.late for r in runs),
        "steps_per_batch": sum(r.sent for r in runs) / max(batches, 1),
        "run_ids": [r.run_id for r in runs],
        "sent": [r.sent for r in runs],
    }


def check_stored(url: str, run_ids: list, sent: list, sample: int = 20) -> int:
    """Runs (of a sample) whose stored points differ from what was sent: each step stored exactly once."""
    bad = 0
    for run_id, n in list(zip(run_ids, sent))[:sample]:
        got = get_json(url + f"/api/runs/{run_id}/series?key=loss")
        steps = got["steps"]
        if len(steps) != n or steps != sorted(set(steps)):
            bad += 1
    return bad


def real_clients(url: str, k: int, rate: float, seconds: float, tmp: Path) -> list:
    env = {**os.environ, "GRADWATCH_SERVER": url, "GRADWATCH_SPOOL_DIR": str(tmp / "spool")}
    return [
        subprocess.Popen(
            [sys.executable, "-c", REAL_CLIENT, str(rate), str(seconds), f"real{i}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for i in range(k)
    ]


def measure(n: int, rate: float, seconds: float, warmup: float, real: int = 0) -> dict:
    """One server, N live runs (``real`` of them real client processes), measured."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        # Every simulated run connects from this one process (one address): lift the per-client cap.
        caps = ["--max-connections-per-client", str(n + 20), "--max-connections", str(max(1000, n + 100))]
        if POSTGRES:
            db, caps = fresh_database(POSTGRES), [*caps, "--workers", str(WORKERS)]
        else:
            db = f"sqlite:///{tmp / 'load.db'}"
        server = ServerProcess(db, *caps)
        try:
            procs = real_clients(server.url, real, rate, warmup + seconds + 1, tmp) if real else []
            result = asyncio.run(drive(server.url, server.pid, n - real, rate, seconds, warmup))
            for p in procs:
                out, _ = p.communicate(timeout=180)
                result["steps_real"] = result.get("steps_real", 0) + int(out.split()[-1])
            if real:  # the real runs' steps of the window count too (they log at the same rate)
                done = result["done"]
                result["cpu_ms_per_step"] *= done / (done + real * rate * result["window_s"])
            result["runs"] = n
            result["bad_runs"] = check_stored(server.url, result.pop("run_ids"), result.pop("sent"))
        finally:
            server.stop()
    result["real"] = real
    return result


def held(r: dict) -> bool:
    return r["p99"] <= P99_LIMIT_MS and r["achieved"] >= 0.95 * r["rate"] and r["bad_runs"] == 0 and r["behind_s"] < 1


def find_largest(results: list, n: int, run) -> int | None:
    """Double N from ``n`` until a run does not hold, then halve the interval to within 1/8: the largest N held."""

    def probe(k: int) -> bool:
        r = next((r for r in results if r["runs"] == k), None)
        if r is None:
            results.append(r := run(k))
            print(row(r), flush=True)
        return held(r)

    best, failed = None, None
    while failed is None:
        if probe(n):
            best, n = n, n * 2
        else:
            failed = n
    while best is not None and failed - best > max(1, best // 8):
        mid = (best + failed) // 2
        best, failed = (mid, failed) if probe(mid) else (best, mid)
    return best


def row(r: dict) -> str:
    return (
        f"| {r['runs']} ({r['real']} real) | {r['rate']:g} | {r['achieved']:.1f} | {r['cpu_pct']:.0f} % | "
        f"**{r['cpu_ms_per_step']:.3f}** | {r['steps_per_batch']:.1f} | {r['p50']:.0f} / {r['p99']:.0f} | "
        f"{r['rss']:.0f} | {r['behind_s']:.1f} | {r['bad_runs']} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small and short (CI keeps the script working)")
    parser.add_argument("--runs", type=int, nargs="*", default=None, help="live runs (several: one row each)")
    parser.add_argument("--rate", type=float, default=10.0, help="steps per second per run")
    parser.add_argument("--seconds", type=float, default=12.0, help="the measured steady window")
    parser.add_argument("--real", type=int, default=0, help="how many of the runs are real client processes")
    parser.add_argument(
        "--find", action="store_true", help="double N until p99 > 250 ms, then bisect; report the largest held"
    )
    parser.add_argument("--postgres", action="store_true", help="a throwaway PostgreSQL cluster instead of SQLite")
    parser.add_argument("--workers", type=int, default=1, help="server processes (PostgreSQL only)")
    args = parser.parse_args()
    global POSTGRES, WORKERS
    with optional_cluster(args.postgres) as url:
        POSTGRES, WORKERS = url, args.workers
        report(args)


def report(args) -> None:
    if args.quick:
        runs, seconds, warmup = args.runs or [4], 2.0, 1.0
    else:
        runs, seconds, warmup = args.runs or [1, 20, 100], args.seconds, 3.0
    print(
        f"# gradwatch live load benchmark ({f'PostgreSQL, {WORKERS} server process(es)' if POSTGRES else 'SQLite'})\n\nmachine: {platform.platform()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; command: {' '.join(sys.argv)}\n"
    )
    print(
        "| live runs | steps/s each | achieved | server CPU | CPU ms per step | steps per batch | log->page p50 / p99 (ms) | "
        "server RSS (MiB) | caught up after (s) | runs not stored exactly once |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for n in runs:
        results.append(measure(n, args.rate, seconds, warmup, min(args.real, n)))
        print(row(results[-1]), flush=True)
    if args.find:
        best = find_largest(results, max(runs), lambda n: measure(n, args.rate, seconds, warmup))
        print(f"\nLargest N held at {args.rate:g} steps/s with p99 <= {P99_LIMIT_MS:.0f} ms: **{best or 'none'}**")
    print(
        "\nTwo scalars per step; the simulated runs batch as the real client link does. CPU: the server process (all threads) over the window."
    )


if __name__ == "__main__":
    main()
