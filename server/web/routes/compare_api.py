"""Many runs' series in one request, aligned on a shared x grid and optionally grouped by a config key
(mean or median with a std, standard-error or min-max band), for the compare page (docs/api.md)."""

from __future__ import annotations

import json
import math
import re
import warnings

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy import select

from gradwatch import contract
from gradwatch.contract import options
from gradwatch_server.storage import chunks, db, store
from gradwatch_server.storage.query import QueryError

router = APIRouter()

TIME_AXES = options.TIME_AXES
MAX_RUNS = 2000


def _one_of(names) -> str:
    """A Query pattern that accepts exactly these names."""
    return "^(" + "|".join(re.escape(n) for n in names) + ")$"


def _ids(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise HTTPException(400, "ids must be a comma-separated list of run ids") from None
    if len(ids) > MAX_RUNS:
        raise HTTPException(400, f"at most {MAX_RUNS} ids at once")
    return ids


def config_value(config: dict, path: str):
    """A dotted key of a (nested) config; None when absent."""
    value = config
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def by_ids(conn, ids: list[int]) -> list[dict]:
    """The runs of a list of ids, in its order (those that exist): what ``compare_series`` reads of them."""
    r = db.runs.c
    rows = conn.execute(select(r.id, r.name, r.created_at, r.config).where(r.id.in_(ids))).all()
    found = {
        row.id: {"id": row.id, "name": row.name, "created_at": row.created_at, "config": _config(row.config)}
        for row in rows
    }
    return [found[i] for i in ids if i in found]


def _config(text) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _points(conn, run_ids: list[int], keys: list[str]) -> dict:
    """(run id, key) -> Points of a scalar key (one query for the key ids, one read per key)."""
    k = db.metric_keys.c
    rows = conn.execute(
        select(k.id, k.run_id, k.key).where(k.run_id.in_(run_ids), k.key.in_(keys), k.layers.is_(None))
    ).all()
    return {(run_id, key): chunks.read(conn, key_id, slots=1) for key_id, run_id, key in rows}


def _xy(p, xp, x: str, created: float):
    """One run's (x, y) arrays for the chosen x axis: step, wall, relative time, or another key's value at each step."""
    y = p.values[:, 0]
    if x == "step":
        return p.steps.astype(np.float64), y
    if x == "wall":
        return p.walls, y
    if x == "relative":
        return p.walls - (p.walls.min() if len(p.walls) else created), y
    if xp is None or not len(xp.steps):
        return np.empty(0), np.empty(0)
    pos = np.searchsorted(xp.steps, p.steps)  # the x key's value at the same step, where it has one
    ok = pos < len(xp.steps)
    ok[ok] &= xp.steps[pos[ok]] == p.steps[ok]
    return xp.values[pos[ok], 0], y[ok]


def align(series: list[tuple[np.ndarray, np.ndarray]], points: int) -> tuple[np.ndarray, np.ndarray]:
    """Every run on one grid of ``points`` bins over the shared x range: the mean of a run's values in a bin (NaN left
    out, ±inf kept),
    gaps inside a run's own range filled linearly, NaN outside it. Returns (bin centres, runs x bins)."""
    finite = [x[np.isfinite(x)] for x, _y in series]
    spans = [(f.min(), f.max()) for f in finite if len(f)]
    if not spans:
        return np.empty(0), np.full((len(series), 0), np.nan)
    lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)
    width = (hi - lo) / points if hi > lo else 1.0
    n = points if hi > lo else 1
    centres = lo + (np.arange(n) + 0.5) * width if hi > lo else np.array([lo])
    out = np.full((len(series), n), np.nan)
    for i, (x, y) in enumerate(series):
        ok = np.isfinite(x) & ~np.isnan(y)  # ±inf stays in: a run that blew up shows as one
        if not ok.any():
            continue
        b = np.minimum(((x[ok] - lo) / width).astype(np.int64), n - 1)
        sums = np.bincount(b, weights=y[ok], minlength=n)
        counts = np.bincount(b, minlength=n)
        filled = counts > 0
        row = np.full(n, np.nan)
        row[filled] = sums[filled] / counts[filled]
        first, last = np.flatnonzero(filled)[[0, -1]]
        inside = np.arange(first, last + 1)
        row[inside] = np.interp(inside, np.flatnonzero(filled), row[filled])
        out[i] = row
    return centres, out


def aggregate(matrix: np.ndarray, agg: str, band: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(centre line, lower band, upper band, runs with a value) per bin over the rows of ``matrix``."""
    count = np.isfinite(matrix).sum(axis=0)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an empty bin is expected: NaN, sent as null
        centre = np.nanmedian(matrix, axis=0) if agg == "median" else np.nanmean(matrix, axis=0)
        if band == "minmax":
            lo, hi = np.nanmin(matrix, axis=0), np.nanmax(matrix, axis=0)
        elif band in ("std", "sem"):
            spread = np.nanstd(matrix, axis=0, ddof=1) if matrix.shape[0] > 1 else np.zeros(matrix.shape[1])
            spread = np.where(count > 1, spread, 0.0)
            if band == "sem":
                spread = spread / np.sqrt(np.maximum(count, 1))
            lo, hi = centre - spread, centre + spread
        else:
            lo = hi = centre
    return centre, lo, hi, count


def _floats(values: np.ndarray) -> list:
    return [None if math.isnan(v) else contract.encode_float(v) for v in values.tolist()]


def group_label(value) -> str:
    return "(none)" if value is None else value if isinstance(value, str) else json.dumps(value)


def compare_series(conn, runs: list[dict], key: str, x: str, group: str | None, agg: str, band: str, points: int):
    """The response of ``/api/compare/series`` for runs already chosen."""
    ids = [r["id"] for r in runs]
    data = _points(conn, ids, [key] + ([x] if x not in TIME_AXES else []))
    series, kept = [], []
    for r in runs:
        p = data.get((r["id"], key))
        if p is None:
            continue
        series.append(_xy(p, data.get((r["id"], x)), x, r["created_at"]))
        kept.append(r)
    centres, matrix = align(series, points)
    groups: dict = {}
    for i, r in enumerate(kept):
        value = config_value(r.get("config") or {}, group) if group else r["id"]
        groups.setdefault(json.dumps(value, sort_keys=True), (value, []))[1].append(i)
    out = []
    for value, rows in groups.values():
        centre, lo, hi, count = aggregate(matrix[rows], agg, band if group else "none")
        out.append(
            {
                "value": value if group else None,
                "label": group_label(value) if group else kept[rows[0]]["name"],
                "count": len(rows),
                "run_ids": [kept[i]["id"] for i in rows],
                "y": _floats(centre),
                "lo": _floats(lo),
                "hi": _floats(hi),
                "n": count.tolist(),
            }
        )
    if group:
        numeric = all(isinstance(g["value"], (int, float)) and not isinstance(g["value"], bool) for g in out)
        out.sort(key=lambda g: g["value"] if numeric else group_label(g["value"]))
    return {
        "key": key,
        "x": x,
        "group": group,
        "agg": agg,
        "band": band if group else "none",
        "xs": _floats(centres),
        "runs": [{"id": r["id"], "name": r["name"], "config": r.get("config") or {}} for r in kept],
        "missing": [r["id"] for r in runs if r not in kept],
        "groups": out,
    }


@router.get("/api/compare/series")
def series(
    request: Request,
    key: str = Query(..., min_length=1, max_length=contract.MAX_KEY_LEN),
    ids: str | None = None,
    project: str | None = None,
    where: str | None = Query(None, max_length=4000),
    group: str | None = Query(None, max_length=contract.MAX_KEY_LEN),
    x: str = Query(options.TIME_AXES[0], min_length=1, max_length=contract.MAX_KEY_LEN),
    agg: str = Query(options.AGGREGATIONS[0], pattern=_one_of(options.AGGREGATIONS)),
    band: str = Query(options.BANDS[0], pattern=_one_of(options.BANDS)),
    points: int = Query(200, ge=2, le=2000),
    limit: int = Query(1000, ge=1, le=MAX_RUNS),
) -> dict:
    """One key of many runs (``ids``, or ``project`` + ``where``) on a shared x grid; with ``group``, one line per
    value of that config key with its band and run count."""
    wanted = _ids(ids)

    def read(conn):
        if wanted is not None and not (project or where):
            runs = by_ids(conn, wanted)
        else:
            try:
                runs = store.list_runs(conn, project=project, where=where, limit=None if wanted else limit)
            except QueryError as exc:
                raise HTTPException(400, str(exc)) from None
            if wanted is not None:
                by_id = {r["id"]: r for r in runs}
                runs = [by_id[i] for i in wanted if i in by_id]
        return compare_series(conn, runs[:limit], key, x, group, agg, band, points)

    return request.app.state.services.read(read)
