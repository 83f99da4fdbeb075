"""W&B's ``define_metric``: which logged keys a run's definitions (``meta.metrics``) name, and the summaries
they ask for, written into the run's ``run_summary`` as the key's summary value.

A definition names a key or a glob (``"val/*"``, ``fnmatch`` rules); a key's own name wins over a glob,
a longer glob over a shorter one. ``summary`` is ``min``, ``max``, ``mean``, ``last`` (comma-separated
for several), ``best`` (min or max by ``goal``), ``copy`` (last) or ``none``. One reduction is stored
as the number itself; several as ``{"min": .., "max": ..}``. The figures come from the ``summaries``
table (kept at ingest), so this costs one read of a few rows per batch, never a scan of points.
"""

from __future__ import annotations

import fnmatch
import json

import numpy as np
from sqlalchemy import select

from gradwatch import contract
from gradwatch_server.storage import chunks, db
from gradwatch_server.storage.media import summary as run_summary

REDUCTIONS = ("min", "max", "mean", "last")
ALIASES = {"copy": "last"}
MAX_DEFINITIONS = 200  # definitions read per run (a script defines a handful)


def of_meta(meta: dict | None) -> dict[str, dict]:
    """The definitions a run's metadata holds: name or glob -> {step_metric, summary, goal} (strings)."""
    found = (meta or {}).get("metrics")
    if not isinstance(found, dict):
        return {}
    out = {}
    for name, spec in list(found.items())[:MAX_DEFINITIONS]:
        if isinstance(spec, dict):
            out[str(name)] = {k: str(v) for k, v in spec.items() if k in ("step_metric", "summary", "goal") and v}
    return out


def spec_for(definitions: dict[str, dict], key: str) -> dict | None:
    """The definition that names ``key``: its own, else the longest glob that matches it; None without one."""
    if key in definitions:
        return definitions[key]
    globs = [n for n in definitions if any(c in n for c in "*?[") and fnmatch.fnmatchcase(key, n)]
    return definitions[max(globs, key=len)] if globs else None


def resolve(definitions: dict[str, dict], keys) -> dict[str, dict]:
    """key -> its definition, for the ``keys`` a definition names (what the run page reads)."""
    if not definitions:
        return {}
    return {k: spec for k in keys if (spec := spec_for(definitions, k)) is not None}


def reductions(spec: dict) -> list[str]:
    """The reductions a definition asks for, in its order (``best`` by its goal; unknown ones dropped)."""
    out = []
    for part in str(spec.get("summary") or "").split(","):
        part = ALIASES.get(part.strip().lower(), part.strip().lower())
        if part == "best":
            part = "max" if str(spec.get("goal", "")).lower().startswith("max") else "min"
        if part in REDUCTIONS and part not in out:
            out.append(part)
    return out


def materialize(conn, run_id: int, definitions: dict[str, dict], keys=None) -> None:
    """Write the requested summaries of ``keys`` (default: every key the run has figures for) into run_summary."""
    if not definitions:
        return
    s = db.summaries.c
    query = select(s.key, s["count"], s.nans, s["last"], s.min, s.max, s.total).where(s.run_id == run_id)
    if keys is not None:
        keys = [k for k in keys if spec_for(definitions, k) is not None]
        if not keys:
            return
        query = query.where(s.key.in_(keys))
    values = {}
    for row in conn.execute(query):
        spec = spec_for(definitions, row.key)
        wanted = reductions(spec) if spec else []
        figures = {r: _figure(conn, run_id, row, r) for r in wanted}
        figures = {r: contract.encode_float(v) for r, v in figures.items() if v is not None}
        if figures:
            one = len(wanted) == 1
            values[row.key] = json.dumps(figures[wanted[0]] if one else figures)
    if values:
        run_summary.set_values(conn, run_id, values, [])


def _figure(conn, run_id: int, row, reduction: str) -> float | None:
    """One reduction of a key's figures; None when it has none (only NaN for min/max/mean)."""
    if reduction == "last":
        return db.from_db_float(row.last) if row.count else None
    if reduction in ("min", "max"):
        return getattr(row, reduction)
    finite = row.count - row.nans
    if finite <= 0:
        return None
    if row.total is not None:
        return row.total / finite
    return _mean_from_points(conn, run_id, row.key)


def _mean_from_points(conn, run_id: int, key: str) -> float | None:
    """A key's mean read from its points (figures kept before ``summaries.total`` existed, or inf - inf)."""
    k = db.metric_keys.c
    key_id = conn.execute(select(k.id).where(k.run_id == run_id, k.key == key, k.layers.is_(None))).scalar()
    if key_id is None:
        return None
    points = chunks.read(conn, key_id, slots=1)
    values = points.values[:, 0] if points.missing is None else points.values[~points.missing[:, 0], 0]
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else None


def for_run(conn, run_id: int, meta: dict | None) -> dict[str, dict]:
    """key -> definition for the scalar keys the run logged (the ``defined_metrics`` field of a run)."""
    definitions = of_meta(meta)
    if not definitions:
        return {}
    k = db.metric_keys.c
    keys = conn.execute(select(k.key).where(k.run_id == run_id, k.layers.is_(None))).scalars()
    return resolve(definitions, keys)
