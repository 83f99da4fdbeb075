"""Retention: deleting runs nobody has updated for a while (``gradwatch gc`` and the hourly schedule).

A run with millions of points is hundreds of chunk rows and tens of thousands of rollup rows;
deleting it in one transaction holds the one writer thread (and, on SQLite, the database's write
lock) for seconds, and every ingest batch waits behind it. So a run is deleted in slices: each
slice is one short writer job (a bounded number of rows), and the next slice is only queued
after the previous one committed, so batches that arrived meanwhile are written in between.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass

from sqlalchemy import delete, func, select, text

from gradwatch.contract import ACTIVE_STATUSES
from gradwatch_server.storage import database, db, edits
from gradwatch_server.storage.store import NotFound

log = logging.getLogger("gradwatch.server")

ACTIVE = ACTIVE_STATUSES  # never collected: a training job may still be writing to them
# One slice, measured on SQLite (benchmarks/bench_retention.py), takes a few ms: 32 chunk rows
# (up to 2,048 values each, ~48 KiB) or rollup rows holding ~32k slot summaries (a rollup row
# keeps ~64 bytes per slot: tiny for a scalar, ~19 KiB for a 300-layer vector).
CHUNK_ROWS = 32
ROLLUP_VALUES = 32768
ROLLUP_ROW_MIN = 16  # a scalar row still costs an index entry and a page write: count it as 16
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.I)
SCHEDULE_EVERY = 3600.0


def parse_duration(text: str) -> float:
    """'90d', '12h', '30m', '45s', '2w' -> seconds; ValueError naming the accepted forms."""
    match = DURATION.match(str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration: use a positive number and a unit, e.g. 90d, 12h, 30m, 45s, 2w")
    return float(match.group(1)) * UNITS[match.group(2).lower()]


@dataclass
class Policy:
    """Which runs a collection may delete."""

    cutoff: float  # unix time: runs last updated before it are old
    keep_tagged: bool = False  # a tag marks a run someone wants to keep

    def allows(self, row) -> bool:
        if row.status in ACTIVE or row.updated_at >= self.cutoff:
            return False
        return not (self.keep_tagged and _tags(row.tags))


def _tags(text) -> list:
    try:
        tags = json.loads(text or "[]")
    except ValueError:
        return ["?"]  # unreadable tags: treat the run as tagged rather than lose it
    return tags if isinstance(tags, list) else ["?"]


def candidates(conn, policy: Policy) -> list[dict]:
    """Runs the policy would delete, oldest first, with their stored point count."""
    r = db.runs.c
    rows = conn.execute(
        select(r.id, r.project, r.name, r.status, r.updated_at, r.tags)
        .where(r.updated_at < policy.cutoff, r.status.not_in(ACTIVE))
        .order_by(r.updated_at, r.id)
    ).all()
    rows = [row for row in rows if policy.allows(row)]
    points = _points(conn, [row.id for row in rows]) if rows else {}
    return [
        {
            "id": row.id,
            "project": row.project,
            "name": row.name,
            "status": row.status,
            "updated_at": row.updated_at,
            "tags": _tags(row.tags),
            "points": points.get(row.id, 0),
        }
        for row in rows
    ]


def _points(conn, run_ids: list[int]) -> dict:
    k, c = db.metric_keys.c, db.chunks.c
    out = {}
    for lo in range(0, len(run_ids), 500):  # bounded IN lists
        query = (
            select(k.run_id, func.coalesce(func.sum(c.n), 0))
            .select_from(db.metric_keys.join(db.chunks, c.key_id == k.id))
            .where(k.run_id.in_(run_ids[lo : lo + 500]))
            .group_by(k.run_id)
        )
        out.update({run_id: int(n) for run_id, n in conn.execute(query)})
    return out


# -- deleting one run in slices (every function taking ``conn`` runs on the writer thread) ------------
def _begin(conn, run_id: int, policy: Policy | None) -> list[tuple[int, int]] | None:
    """The run's (key id, slots), or None when it no longer matches the policy; NotFound when gone."""
    r = db.runs.c
    row = conn.execute(select(r.status, r.updated_at, r.tags).where(r.id == run_id)).first()
    if row is None:
        raise NotFound(f"run {run_id} not found")
    if policy is not None and not policy.allows(row):
        return None
    k = db.metric_keys.c
    return [
        (key_id, len(json.loads(layers)) if layers else 1)
        for key_id, layers in conn.execute(select(k.id, k.layers).where(k.run_id == run_id))
    ]


def _chunk_slice(conn, run_id: int, keys: list[tuple[int, int]], limit: int) -> list[int]:
    """Delete up to ``limit`` chunk rows of these keys; the keys found empty."""
    c = db.chunks.c
    deleted, emptied = 0, []
    for key_id, _slots in keys:
        ids = list(
            conn.execute(select(c.id).where(c.key_id == key_id).order_by(c.last_step).limit(limit - deleted)).scalars()
        )
        if ids:
            conn.execute(delete(db.chunks).where(c.id.in_(ids)))
        deleted += len(ids)
        if deleted >= limit:
            break
        emptied.append(key_id)
    return emptied


def _rollup_slice(conn, run_id: int, keys: list[tuple[int, int]], budget: int) -> list[int]:
    """Delete rollup rows of these keys worth ``budget`` slot summaries, in index order; the keys found empty."""
    c = db.rollups.c
    emptied = []
    for key_id, slots in keys:
        if budget <= 0:
            break
        cost = max(ROLLUP_ROW_MIN, slots)
        limit = max(1, budget // cost)
        rows = conn.execute(
            select(c.level, c.block).where(c.key_id == key_id).order_by(c.level, c.block).limit(limit)
        ).all()
        spans: dict = {}
        for level, block in rows:  # the first rows in (level, block) order: one block range per level
            lo, hi = spans.get(level, (block, block))
            spans[level] = (min(lo, block), max(hi, block))
        for level, (lo, hi) in spans.items():
            conn.execute(delete(db.rollups).where(c.key_id == key_id, c.level == level, c.block.between(lo, hi)))
            h = db.rollup_heat.c
            conn.execute(delete(db.rollup_heat).where(h.key_id == key_id, h.level == level, h.block.between(lo, hi)))
        budget -= len(rows) * cost
        if len(rows) == limit:
            break
        emptied.append(key_id)
    return emptied


def _finish(conn, run_id: int) -> None:
    """The rest (keys, alerts, the run, and any rows written since the slices began) in one small job."""
    edits.delete_run(conn, run_id)


def _sliced(conn, pipeline, fn, run_id: int, *args):
    """One slice job: the run's cached ingest state is dropped first (it must not outlive the rows
    being deleted; a batch committed between two slices may have cached it again)."""
    if pipeline is not None:
        pipeline.invalidate(run_id)
    return fn(conn, run_id, *args)


async def delete_run_in_slices(
    services,
    run_id: int,
    policy: Policy | None = None,
    *,
    chunk_rows: int = CHUNK_ROWS,
    rollup_values: int = ROLLUP_VALUES,
    pause: float = 0.0,
) -> bool:
    """Delete a run and everything it owns as a series of short writer jobs; False if the policy kept it.

    NotFound for an unknown run. Each job is queued only after the previous one committed, so
    ingest batches queued meanwhile go first; ``pause`` adds a sleep between jobs (for a separate
    process sharing a SQLite file with a live server, whose writer must get the lock).
    """

    async def job(fn, *args):
        return await services.writer.submit_here(_sliced, services.pipeline, fn, run_id, *args)

    keys = await job(_begin, policy)
    if keys is None:
        return False
    for slice_fn, limit in ((_chunk_slice, chunk_rows), (_rollup_slice, rollup_values)):
        left = list(keys)
        while left:
            done = set(await job(slice_fn, left, limit))
            left = [k for k in left if k[0] not in done]
            await asyncio.sleep(pause)  # yield: let queued ingest jobs reach the writer first
    await job(_finish)
    if services.publisher is not None:
        services.publisher.deleted(run_id)  # open runs lists and run pages drop it live
    return True


async def collect(
    services,
    older_than: float,
    keep_tagged: bool = False,
    dry_run: bool = False,
    now: float | None = None,
    on_deleted=None,
    pause: float = 0.0,
) -> list[dict]:
    """Delete (or with ``dry_run`` only list) runs last updated more than ``older_than`` seconds ago."""
    policy = Policy(cutoff=(now if now is not None else time.time()) - older_than, keep_tagged=keep_tagged)
    runs = await services.aread(candidates, policy)
    if dry_run:
        return runs
    deleted = []
    for run in runs:
        try:
            # The policy is checked again in the first slice: a run may have resumed since the listing.
            if not await delete_run_in_slices(services, run["id"], policy, pause=pause):
                continue
        except NotFound:  # deleted meanwhile (by a person, or another server process)
            continue
        deleted.append(run)
        if on_deleted is not None:
            on_deleted(run)
    return deleted


async def run_on_schedule(services, every: float = SCHEDULE_EVERY) -> None:
    """While ``retention_days`` is set: collect at start and then every ``every`` seconds."""
    days = getattr(services.settings, "retention_days", 0) or 0
    if days <= 0:
        return
    keep_tagged = bool(getattr(services.settings, "retention_keep_tagged", True))
    while True:
        try:
            deleted = await one_pass(services, days * 86400, keep_tagged)
            if deleted:
                log.warning(
                    "gradwatch: retention deleted %d run(s) not updated for %g days: %s",
                    len(deleted),
                    days,
                    ", ".join(f"{r['id']} ({r['project']}/{r['name']})" for r in deleted),
                )
        except Exception as exc:  # the schedule must outlive a bad moment of the database
            log.warning("gradwatch: retention pass failed (will retry in %gs): %r", every, exc)
        await asyncio.sleep(every)


# "gwgc": held by the one process running a pass; not migrate.UPGRADE_LOCK, so a start never waits for gc
LOCK_KEY = 0x67776763


async def one_pass(services, older_than: float, keep_tagged: bool) -> list[dict]:
    """One collection; with several server processes on PostgreSQL, only the one that gets the lock runs it."""
    lock = await asyncio.to_thread(try_lock, services.engine)
    if lock is False:
        return []  # another process is collecting right now
    try:
        return await collect(services, older_than, keep_tagged)
    finally:
        if lock is not None:
            await asyncio.to_thread(unlock, lock)


def try_lock(engine):
    """None on SQLite (one process), False when another process holds the lock, else the holding connection."""
    if engine.dialect.name != "postgresql":
        return None
    conn = engine.connect()
    if conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}).scalar():
        conn.commit()
        return conn
    conn.close()
    return False


def unlock(conn) -> None:
    try:
        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
        conn.commit()
    finally:
        conn.close()  # closing the session would release it anyway


class Offline:
    """What ``collect`` and ``delete_run_in_slices`` need, without a server: for ``gradwatch gc``."""

    pipeline = None  # no ingest here: no cached run state to drop
    publisher = None  # and no open pages to tell

    def __init__(self, url: str):
        from gradwatch_server.ingest.writer import Writer

        self.engine = database.make_engine(url)
        self.writer = Writer(self.engine)

    def read(self, fn, *args):
        with self.engine.connect() as conn:
            return fn(conn, *args)

    async def aread(self, fn, *args):
        return await asyncio.to_thread(self.read, fn, *args)

    def close(self) -> None:
        self.writer.close()
        self.engine.dispose()
