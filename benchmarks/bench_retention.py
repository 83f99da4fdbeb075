"""Ingest latency while a 1M-point run is deleted: in one transaction vs in slices (retention.py).

Run: .venv/bin/python benchmarks/bench_retention.py [--steps 1000000] [--db postgresql://...]
Builds a big run through the real ingest path (bench_series.build), then, on a real ``Services``
(writer thread, group commit), streams small batches into another run every 20 ms and times each
one from submit to commit, while the big run is deleted: first with ``edits.delete_run`` in one
writer job (what ``DELETE /api/runs/{id}`` does today), then with
``retention.delete_run_in_slices``. Measured, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_series import build
from sqlalchemy import create_engine, text

from gradwatch import protocol
from gradwatch_server.ingest.batch import decode
from gradwatch_server.services import Services
from gradwatch_server.settings import Settings
from gradwatch_server.storage import database, edits, retention

EVERY = 0.02  # one live batch every 20 ms
STEPS = 50  # steps per live batch


def _batch(seq: int) -> dict:
    lo = (seq - 1) * STEPS
    records = [(i, time.time(), {"loss": 1.0 / (1 + i)}, {}) for i in range(lo, lo + STEPS)]
    return {"type": "batch", "seq": seq, "columns": protocol.encode_columns(records)}


async def _live(services: Services, run_id: int, stop: asyncio.Event, latencies: list, seq0: int) -> int:
    seq = seq0
    while not stop.is_set():
        seq += 1
        started = time.perf_counter()
        await services.pipeline.submit(run_id, decode(_batch(seq)))
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(EVERY)
    return seq


async def _scenario(url: str, big_id: int, how: str) -> dict:
    services = Services(Settings(db=url))
    try:
        run_id = (await services.pipeline.open_run({"uid": f"live-{how}", "project": "bench", "name": "live"}))[
            "run_id"
        ]
        quiet: list = []
        stop = asyncio.Event()
        task = asyncio.create_task(_live(services, run_id, stop, quiet, 0))
        await asyncio.sleep(1.0)
        stop.set()
        seq = await task
        during: list = []
        stop = asyncio.Event()
        task = asyncio.create_task(_live(services, run_id, stop, during, seq))
        await asyncio.sleep(0.2)
        started = time.perf_counter()
        if how == "one transaction":
            await services.write(edits.delete_run, big_id)
        else:
            await retention.delete_run_in_slices(services, big_id)
        took = time.perf_counter() - started
        stop.set()
        await task
        return {"how": how, "delete_s": took, "quiet": quiet, "during": during}
    finally:
        services.close()


def _ms(values: list, q: float) -> float:
    values = sorted(values)
    return 1000 * values[min(len(values) - 1, int(q * len(values)))]


def _copy_postgres(url: str, name: str) -> str:
    """A copy of the built database (CREATE DATABASE ... TEMPLATE), so both scenarios start equal."""
    admin = create_engine(database.driver_url(url), isolation_level="AUTOCOMMIT")
    source = url.rsplit("/", 1)[1]
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE {source}"))
    admin.dispose()
    return url.rsplit("/", 1)[0] + "/" + name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--vector-steps", type=int, default=0, help="steps that also log a 300-layer norm vector")
    parser.add_argument("--db", default="", help="a PostgreSQL URL (an empty database it may fill); default SQLite")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-retention-"))
    url = args.db or f"sqlite:///{tmp / 'big.db'}"
    engine = database.make_engine(url)
    started = time.perf_counter()
    big_id, _rate = build(engine, args.steps, args.vector_steps)
    engine.dispose()
    print(
        f"built a {args.steps:,}-step run ({args.vector_steps:,} with 300-layer vectors) in {time.perf_counter() - started:.1f} s ({url.split(':')[0]})"
    )
    results = []
    for i, how in enumerate(("one transaction", "in slices")):
        if args.db:
            copy = _copy_postgres(url, f"gw_bench_copy{i}")
        else:
            shutil.copy(tmp / "big.db", tmp / f"copy{i}.db")
            copy = f"sqlite:///{tmp / f'copy{i}.db'}"
        results.append(asyncio.run(_scenario(copy, big_id, how)))
    print(f"\nlive batches of {STEPS} steps every {EVERY * 1000:.0f} ms, submit-to-commit latency (ms)\n")
    print("| delete | took (s) | batches during | p50 | p99 | max | idle p50 / max |\n|---|---|---|---|---|---|---|")
    for r in results:
        d, q = r["during"], r["quiet"]
        print(
            f"| {r['how']} | {r['delete_s']:.2f} | {len(d)} | {_ms(d, 0.5):.1f} | {_ms(d, 0.99):.1f} | "
            f"{max(d) * 1000:.1f} | {_ms(q, 0.5):.1f} / {max(q) * 1000:.1f} |"
        )
    print(f"\n(mean during the sliced delete: {statistics.mean(results[1]['during']) * 1000:.1f} ms)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
