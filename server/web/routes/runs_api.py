"""The runs list with configs and metric summaries, filtered and sorted by the runs language (docs/api.md)."""

from __future__ import annotations

import json
import logging
import re

from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from gradwatch_server.storage import db, store
from gradwatch_server.storage.query import QueryError

router = APIRouter()
log = logging.getLogger("gradwatch.server")


@router.get("/api/runs")
def list_runs(
    request: Request,
    project: str | None = None,
    status: str | None = None,
    q: str | None = None,
    tag: str | None = None,
    where: str | None = Query(None, max_length=4000),
    order_by: str | None = Query(None, max_length=2000),
    columns: str | None = Query(None, max_length=8000),
    limit: int | None = Query(None, ge=1, le=100_000),
) -> list[dict]:
    """Runs (newest first, or by ``order_by``) with config and the ``columns``' summaries; ``where`` filters."""
    check_limits(where, order_by, columns)
    try:
        return request.app.state.services.read(
            store.list_runs,
            project=project,
            status=status,
            q=q,
            tag=tag,
            where=where,
            order_by=order_by,
            columns=columns,
            limit=limit,
        )
    except QueryError as exc:
        raise HTTPException(400, str(exc)) from None
    except (RecursionError, SQLAlchemyError) as exc:  # what the limits do not foresee: the caller's query, a 400
        log.warning("runs query refused by the database: %r", exc)
        raise HTTPException(
            400, "the database could not run this query (too complex); simplify where/order_by/columns"
        ) from None


MAX_NESTING = 32  # parentheses in the runs language, deepest
MAX_FIELDS = 32  # config./summary. fields in one query (SQLite joins at most 64 tables)
FIELD = re.compile(r"\b(?:config|summary)\.[^\s,()<>=!]+")


def check_limits(*texts: str | None) -> None:
    """A 400 for a query deeper or wider than the database can run (docs/security.md, "Limits")."""
    depth = deepest = 0
    for ch in "".join(t or "" for t in texts):
        depth += (ch == "(") - (ch == ")")
        deepest = max(deepest, depth)
    if deepest > MAX_NESTING:
        raise HTTPException(400, f"the query nests parentheses {deepest} deep; at most {MAX_NESTING}")
    fields = {m.group(0) for t in texts for m in FIELD.finditer(t or "")}
    if len(fields) > MAX_FIELDS:
        raise HTTPException(400, f"the query names {len(fields)} config/summary fields; at most {MAX_FIELDS}")


def _columns(conn, project: str | None) -> dict:
    """Config keys (flattened with dots) and metric keys with a summary, over a project's runs (or all)."""
    runs = select(db.runs.c.id, db.runs.c.config)
    if project:
        runs = runs.where(db.runs.c.project == project)
    config: set = set()
    for _run_id, text in conn.execute(runs):
        try:
            config |= set(flatten(json.loads(text or "{}")))
        except ValueError:
            continue
    s = db.summaries.c
    keys = select(s.key).distinct()
    if project:
        keys = keys.where(s.run_id.in_(select(db.runs.c.id).where(db.runs.c.project == project)))
    return {"config": sorted(config), "summary": sorted(k for (k,) in conn.execute(keys))}


def flatten(value, prefix: str = "") -> dict:
    """A nested config as dotted keys (``optim.lr``), the form ``config.<key>`` names."""
    if not isinstance(value, dict):
        return {prefix: value} if prefix else {}
    out: dict = {}
    for k, v in value.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


@router.get("/api/columns")
def columns(request: Request, project: str | None = None) -> dict:
    """The columns the runs table can show: config keys and metric keys with summaries."""
    return request.app.state.services.read(_columns, project)
