"""Per run and scalar key: last, min, max (with their steps) and count, kept at ingest so lists never scan points.

``record`` runs on the writer thread once per batch: numpy over each scalar column of the batch,
then one upsert statement for all of the batch's keys that merges the batch's figures into the
stored ones in SQL (so a restarted server needs no cache). NaN is not a number SQL knows: it is
counted in ``nans`` and a NaN last value is stored as NULL; min and max skip NaN and keep ±inf.
``backfill`` fills the table for runs stored before it existed (from their chunks, once).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from sqlalchemy import and_, case, exists, select
from sqlalchemy.dialects import postgresql, sqlite

from gradwatch import contract
from gradwatch_server.storage import chunks, db, query
from gradwatch_server.storage.prepared import Prepared

FIELDS = ("last", "min", "max", "count", "last_step", "min_step", "max_step", "nans")
VALUE_FIELDS = ("last", "min", "max")  # floats (NaN/±inf encoded in the API); the rest are integers


SMALL = 16  # points up to which a Python loop costs less than numpy's calls (a live batch has one or two)


def batch_row(run_id: int, key: str, steps: np.ndarray, values: np.ndarray) -> dict | None:
    """One key's figures over one batch; None when it has no points. Min and max skip NaN and keep ±inf."""
    if not len(steps):
        return None
    nans, last, last_step, extremes = _small(steps, values) if len(steps) <= SMALL else _large(steps, values)
    row = {"run_id": run_id, "key": key, "count": len(steps), "nans": nans, "last": db.to_db_float(last)}
    row["last_step"] = last_step
    row["min"], row["min_step"], row["max"], row["max_step"], total = extremes or (None, None, None, None, 0.0)
    row["total"] = db.to_db_float(total)  # 0.0 for NaN only; inf - inf is NaN: NULL, the mean then read from points
    return row


def _small(steps, values) -> tuple:
    """(nans, last value, its step, (min, its step, max, its step, sum) or None) in plain floats."""
    steps, values = steps.tolist(), values.tolist()
    last_i, lo, hi, nans, total = 0, None, None, 0, 0.0
    for i, (step, value) in enumerate(zip(steps, values)):
        if step >= steps[last_i]:
            last_i = i  # the latest of the largest step
        if value != value:
            nans += 1
            continue
        if lo is None or value < values[lo]:
            lo = i
        if hi is None or value > values[hi]:
            hi = i
        total += value
    extremes = None if lo is None else (values[lo], steps[lo], values[hi], steps[hi], total)
    return nans, values[last_i], steps[last_i], extremes


def _large(steps, values) -> tuple:
    """``_small``'s figures by numpy, no Python loop over points."""
    steps = np.asarray(steps, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    last_i = len(steps) - 1 - int(np.argmax(steps[::-1]))
    nan = np.isnan(values)
    kept = np.flatnonzero(~nan)
    extremes = None
    if len(kept):
        # Not np.nanargmax: it reads NaN as -inf, so [nan, -inf] had its max at the NaN (stored as NULL).
        finite = values[kept] if len(kept) < len(values) else values
        lo, hi = int(kept[finite.argmin()]), int(kept[finite.argmax()])
        with np.errstate(invalid="ignore"):
            total = float(finite.sum())
        extremes = (float(values[lo]), int(steps[lo]), float(values[hi]), int(steps[hi]), total)
    return len(values) - len(kept), float(values[last_i]), int(steps[last_i]), extremes


def upsert(conn, rows: list[dict]) -> None:
    """Merge batch figures into the stored ones: one statement for every key of the batch."""
    if not rows:
        return
    _upsert_statement(conn.dialect.name).run_many(conn, rows)


@functools.lru_cache(maxsize=4)
def _upsert_statement(dialect: str):
    """The upsert, built once per dialect (building it cost more than running it, once per batch)."""
    s, stmt = db.summaries.c, (postgresql if dialect == "postgresql" else sqlite).insert(db.summaries)
    new = stmt.excluded
    lower = and_(new.min.is_not(None), (s.min.is_(None)) | (new.min < s.min))
    higher = and_(new.max.is_not(None), (s.max.is_(None)) | (new.max > s.max))
    later = new.last_step >= s.last_step
    stmt = stmt.on_conflict_do_update(
        index_elements=[s.run_id, s.key],
        set_={
            "count": s["count"] + new["count"],
            "nans": s.nans + new.nans,
            "min": case((lower, new.min), else_=s.min),
            "min_step": case((lower, new.min_step), else_=s.min_step),
            "max": case((higher, new.max), else_=s.max),
            "max_step": case((higher, new.max_step), else_=s.max_step),
            "last": case((later, new["last"]), else_=s["last"]),
            "last_step": case((later, new.last_step), else_=s.last_step),
            "total": s.total + new.total,  # NULL once either is: the mean is then read from points
        },
    )
    names = ["run_id", "key", "count", "nans", "last", "last_step", "min", "min_step", "max", "max_step", "total"]
    return Prepared(stmt, names)


def record(conn, run_id: int, stored: dict) -> None:
    """Summaries of a batch's stored scalar keys (``apply._store_columns``'s ``stored``), in one upsert."""
    rows = []
    for key, (kind, steps, _walls, column) in stored.items():
        if kind == "scalar":
            values = column.values[:, 0]
            if column.missing is not None:
                keep = ~column.missing[:, 0]
                steps, values = steps[keep], values[keep]
            row = batch_row(run_id, key, steps, values)
            if row is not None:
                rows.append(row)
    upsert(conn, rows)


def backfill(conn, limit: int | None = None) -> int:
    """Summaries from the chunks of scalar keys that have none (runs stored before this table); returns keys done."""
    k = db.metric_keys.c
    has = exists().where(db.summaries.c.run_id == k.run_id, db.summaries.c.key == k.key)
    query = select(k.id, k.run_id, k.key).where(k.layers.is_(None), ~has).order_by(k.id)
    done = 0
    for key_id, run_id, key in conn.execute(query.limit(limit) if limit else query).all():
        points = chunks.read(conn, key_id, slots=1)
        values, steps = points.values[:, 0], points.steps
        if points.missing is not None:
            keep = ~points.missing[:, 0]
            steps, values = steps[keep], values[keep]
        upsert(conn, [r for r in [batch_row(run_id, key, steps, values)] if r])
        done += 1
    return done


def for_runs(conn, run_ids: list[int], keys: list[str] | None = None) -> dict:
    """run id -> key -> {last, min, max, count, ...} in API form (non-finite values as the contract's strings)."""
    if not run_ids:
        return {}
    s = db.summaries.c
    query = select(s.run_id, s.key, s["count"], s.nans, s["last"], s.last_step, s.min, s.min_step, s.max, s.max_step)
    many = len(run_ids) > 500  # a long IN list costs more than reading the keys' rows and dropping the rest
    if keys is not None:
        query = query.where(s.key.in_(keys))
    if not many or keys is None:
        query = query.where(s.run_id.in_(run_ids))
    wanted = set(run_ids)
    out: dict = {}
    for run_id, key, count, nans, last, last_step, lo, lo_step, hi, hi_step in conn.execute(query):
        if run_id in wanted:
            if last is None and count:
                last = math.nan
            out.setdefault(run_id, {})[key] = {
                "last": _api_float(last),
                "min": _api_float(lo),
                "max": _api_float(hi),
                "count": count,
                "nans": nans,
                "last_step": last_step,
                "min_step": lo_step,
                "max_step": hi_step,
            }
    return out


def _api_float(v):
    return v if v is None or math.isfinite(v) else contract.encode_float(v)


def value_at(conn, run_id: int, key: str, step: int | None) -> float | None:
    """A scalar key's value at one step (the ``at_min``/``at_max`` columns); None when it has none there."""
    if step is None:
        return None
    key_id = conn.execute(
        select(db.metric_keys.c.id).where(
            db.metric_keys.c.run_id == run_id, db.metric_keys.c.key == key, db.metric_keys.c.layers.is_(None)
        )
    ).scalar()
    if key_id is None:
        return None
    points = chunks.read(conn, key_id, step, step, 1)
    if not len(points.steps) or (points.missing is not None and points.missing[-1, 0]):
        return None
    return float(points.values[-1, 0])


def attach(conn, runs: list[dict], columns: str | None) -> None:
    """Add each run's ``summary`` for the metric keys ``columns`` names (``summary.*``: every key), with
    ``at_min``/``at_max`` values read at the other key's best step."""
    fields = query.named("columns", query.parse_columns, columns) if columns else []
    wanted = {f.name for f in fields if f.kind == "summary"}
    every = "*" in wanted
    calls = [f for f in fields if f.kind == "summary" and f.part.startswith("at_")]
    keys = None if every else sorted(wanted | {f.part.split(":", 1)[1] for f in calls})
    ids = [r["id"] for r in runs]
    found = for_runs(conn, ids, keys) if every or keys else {}
    for run in runs:
        run["summary"] = found.get(run["id"], {})
    for f in calls:
        how, other = f.part.split(":", 1)
        for run in runs:
            best = run["summary"].get(other, {}).get("min_step" if how == "at_min" else "max_step")
            value = value_at(conn, run["id"], f.name, best)
            run["summary"].setdefault(f.name, {})[f"{how}({other})"] = contract.encode_float(value)
