"""Read side: plain functions that turn database rows into API data."""

from __future__ import annotations

import json
import time

from sqlalchemy import bindparam, func, select

from gradwatch import contract, protocol
from gradwatch_server.storage import chunks, db, series, summaries
from gradwatch_server.storage import query as runs_query
from gradwatch_server.storage.media import defined
from gradwatch_server.storage.media import summary as scripted_summary


class NotFound(LookupError):
    """An unknown run or key (the API answers 404)."""


def _summary(row, alert_count: int) -> dict:
    return {
        "id": row.id,
        "project": row.project,
        "name": row.name,
        "status": row.status,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "finished_at": row.finished_at,
        "last_step": row.last_step,
        "alert_count": alert_count,
        "tags": json.loads(row.tags or "[]"),
        "notes": row.notes or "",
    }


def _job(row) -> dict:
    """W&B's group and job type (``init(group=, job_type=)``), kept in the run's meta."""
    meta = _json_dict(row.meta) if row.meta and ("run_group" in row.meta or "job_type" in row.meta) else {}
    return {"group": meta.get("run_group"), "job_type": meta.get("job_type")}


def _json_dict(text) -> dict:
    try:
        value = json.loads(text or "{}")
    except (ValueError, RecursionError):
        return {}
    if (
        json_depth(value, contract.MAX_DOC_DEPTH) > contract.MAX_DOC_DEPTH
    ):  # stored before the hello checked it: unanswerable
        return {"gradwatch": f"not shown: nested more than {contract.MAX_DOC_DEPTH} levels deep"}
    return value if isinstance(value, dict) else {}


def json_depth(value, limit: int) -> int:
    """Nesting depth of a parsed JSON value, counted without recursion and stopping just past ``limit``."""
    depth, level = 0, [value]
    while level and depth <= limit:
        depth += 1
        nxt = []
        for item in level:
            if isinstance(item, dict):
                nxt.extend(v for v in item.values() if isinstance(v, (dict, list)))
            elif isinstance(item, list):
                nxt.extend(v for v in item if isinstance(v, (dict, list)))
        level = nxt
    return depth


def _last_alerts(conn, run_ids: list[int]) -> dict:
    """run id -> the root of its newest incident in brief (kind, step, layer, severity, message): the cause, not
    the latest consequence (an alert from before incidents is its own root)."""
    roots = db.alerts.c.incident_id.is_(None) | db.alerts.c.id.in_(select(db.incidents.c.root_alert_id))
    newest = select(func.max(db.alerts.c.id)).where(db.alerts.c.run_id.in_(run_ids), roots).group_by(db.alerts.c.run_id)
    rows = conn.execute(select(db.alerts).where(db.alerts.c.id.in_(newest.scalar_subquery())))
    return {
        r.run_id: {
            "kind": r.kind,
            "step": r.step,
            "layer": r.layer,
            "severity": r.severity,
            "message": r.message,
            "created_at": r.created_at,
        }
        for r in rows
    }


def list_runs(
    conn,
    project: str | None = None,
    status: str | None = None,
    q: str | None = None,
    tag: str | None = None,
    where: str | None = None,
    order_by: str | None = None,
    columns: str | None = None,
    limit: int | None = None,
) -> list[dict]:
    """Runs, newest first, with their alert counts and configs; optional filters, the ``where``/``order_by``
    language (``storage.query``, QueryError on a bad one) and the metric summaries ``columns`` names."""
    counts = select(db.alerts.c.run_id, func.count().label("n")).group_by(db.alerts.c.run_id).subquery()
    query = (
        select(db.runs, func.coalesce(counts.c.n, 0).label("alert_count"))
        .outerjoin(counts, counts.c.run_id == db.runs.c.id)
        .order_by(db.runs.c.id.desc())
    )
    if project:
        query = query.where(db.runs.c.project == project)
    if status:
        query = query.where(db.runs.c.status == status)
    if q:
        query = query.where(db.runs.c.name.contains(q, autoescape=True))
    query = runs_query.narrow(conn, query, where, order_by)
    out = [{**_summary(r, r.alert_count), "config": _json_dict(r.config), **_job(r)} for r in conn.execute(query)]
    if tag:
        out = [r for r in out if tag in r["tags"]]
    out = out[:limit] if limit else out
    summaries.attach(conn, out, columns)
    scripted = scripted_summary.of_runs(conn, [r["id"] for r in out]) if out else {}
    for r in out:
        r["run_summary"] = scripted.get(r["id"], {})  # what the script set in run.summary (W&B's)
    alerted = [r["id"] for r in out if r["alert_count"]]
    last = _last_alerts(conn, alerted) if alerted else {}
    needing = open_incidents(conn, alerted) if alerted else {}
    for r in out:
        r["last_alert"] = last.get(r["id"])
        r["open_incidents"], r["worst_incident"] = needing.get(r["id"], (0, None))
    return out


SEVERITY_RANK = {s: i for i, s in enumerate(contract.SEVERITIES)}  # info < warning < critical


def needs_look(now: float):
    """SQL: an incident that needs a look (open, or snoozed until a time now past; a mute has no end)."""
    inc = db.incidents.c
    return (inc.status == "open") | ((inc.status == "snoozed") & (inc.snoozed_until <= now))


def open_incidents(conn, run_ids: list[int]) -> dict:
    """run id -> (how many incidents need a look, the worst of them: most severe, then earliest).

    The worst in brief: id, kind, severity, first_step, last_step, cause, message (its root's).
    """
    inc = db.incidents.c
    rows = conn.execute(
        select(db.incidents, db.alerts.c.message)
        .outerjoin(db.alerts, db.alerts.c.id == inc.root_alert_id)
        .where(inc.run_id.in_(run_ids), needs_look(time.time()))
    )
    out: dict = {}
    for r in rows:
        key = (-SEVERITY_RANK.get(r.severity, 0), r.first_step if r.first_step is not None else 1 << 62, r.id)
        count, best, brief = out.get(r.run_id, (0, None, None))
        if best is None or key < best:
            brief = {"id": r.id, "kind": r.kind, "severity": r.severity, "first_step": r.first_step}
            brief.update({"last_step": r.last_step, "cause": r.cause, "message": r.message})
            best = key
        out[r.run_id] = (count + 1, best, brief)
    return {run_id: (count, brief) for run_id, (count, _, brief) in out.items()}


def get_run(conn, run_id: int) -> dict:
    """One run with config, metadata and the recorded exception (if any)."""
    row = conn.execute(select(db.runs).where(db.runs.c.id == run_id)).first()
    out = _with_alerts(conn, run_id, row)
    out.update(
        uid=row.uid,
        config=_json_dict(row.config),
        meta=_json_dict(row.meta),
        error=json.loads(row.error) if row.error else None,
        alert_config=json.loads(row.alert_config or "{}"),
        run_summary=scripted_summary.of_runs(conn, [run_id]).get(run_id, {}),
        defined_metrics=defined.for_run(conn, run_id, _json_dict(row.meta)),  # key -> its define_metric
        **_job(row),
        created_by=row.created_by,  # the name of the token whose connection created the run (None: before tokens)
    )
    return out


SUMMARY_COLUMNS = ("id", "project", "name", "status", "created_at", "updated_at", "finished_at", "last_step")


def run_summary(conn, run_id: int) -> dict:
    """A run as live pushes and webhooks carry it: the summary and the error, never config or meta
    (a client's documents can be large, and pushes go to every open page)."""
    row = conn.execute(
        select(*(db.runs.c[name] for name in SUMMARY_COLUMNS), db.runs.c.tags, db.runs.c.notes, db.runs.c.error).where(
            db.runs.c.id == run_id
        )
    ).first()
    out = _with_alerts(conn, run_id, row)
    out["error"] = json.loads(row.error) if row.error else None
    return out


def _with_alerts(conn, run_id: int, row) -> dict:
    """A run row's summary with its alert count, newest alert and open incidents; NotFound without a row."""
    if row is None:
        raise NotFound(f"run {run_id} not found")
    count = conn.execute(select(func.count()).select_from(db.alerts).where(db.alerts.c.run_id == run_id)).scalar()
    out = _summary(row, count)
    out["last_alert"] = _last_alerts(conn, [run_id]).get(run_id) if count else None
    out["open_incidents"] = open_incidents(conn, [run_id]).get(run_id, (0, None))[0] if count else 0
    return out


def require_run(conn, run_id: int) -> None:
    """NotFound unless the run exists."""
    if conn.execute(_RUN_EXISTS, {"run": run_id}).first() is None:
        raise NotFound(f"run {run_id} not found")


_RUN_EXISTS = select(db.runs.c.id).where(db.runs.c.id == bindparam("run"))


def list_keys(conn, run_id: int) -> list[str]:
    """Scalar keys, then one ``<vector>/<layer>`` key per slot of each vector key."""
    require_run(conn, run_id)
    scalars, expanded = [], []
    for row in conn.execute(
        select(db.metric_keys).where(db.metric_keys.c.run_id == run_id).order_by(db.metric_keys.c.id)
    ):
        if row.layers is None:
            scalars.append(row.key)
        else:
            expanded += [f"{row.key}/{name}" for name in json.loads(row.layers)]
    return sorted(scalars) + expanded


def loss_keys(conn, run_ids: list[int]) -> dict[int, str | None]:
    """Each run's loss key (``contract.main_loss_key``: the one it declared, else the usual names), in two
    queries for all of them; a run that does not exist is left out."""
    declared = {}
    for row in conn.execute(select(db.runs.c.id, db.runs.c.meta).where(db.runs.c.id.in_(run_ids))):
        key = json.loads(row.meta or "{}").get("loss_key")
        declared[row.id] = key if isinstance(key, str) else None
    wanted = {*contract.LOSS_KEYS, *(k for k in declared.values() if k)}
    logged: dict[int, list[str]] = {run_id: [] for run_id in declared}
    for row in conn.execute(
        select(db.metric_keys.c.run_id, db.metric_keys.c.key).where(
            db.metric_keys.c.run_id.in_(list(declared)), db.metric_keys.c.key.in_(wanted)
        )
    ):
        logged[row.run_id].append(row.key)
    return {run_id: contract.main_loss_key(logged[run_id], declared[run_id]) for run_id in declared}


def vector_layouts(conn, run_id: int) -> dict:
    """Vector key -> slot names (input to output)."""
    require_run(conn, run_id)
    rows = conn.execute(
        select(db.metric_keys.c.key, db.metric_keys.c.layers).where(
            db.metric_keys.c.run_id == run_id, db.metric_keys.c.layers.is_not(None)
        )
    )
    return {r.key: json.loads(r.layers) for r in rows}


def _candidates(key: str) -> list[str]:
    """The stored keys ``key`` may name: itself (a scalar) and each prefix before a '/' (a vector whose slot it
    is), of a stored key's length at most (so a request's key of thousands of '/' asks for a bounded list)."""
    names = [key[:i] for i, ch in enumerate(key[: contract.MAX_KEY_LEN + 1]) if ch == "/"]
    return [key, *names] if len(key) <= contract.MAX_KEY_LEN else names


def _resolve_key(conn, run_id: int, key: str):
    """('scalar', key_id, None, 1) or ('slot', vector key_id, slot index, slots); NotFound otherwise."""
    names = _candidates(key)
    rows = {r.key: r for r in conn.execute(_KEYS_NAMED, {"run": run_id, "keys": names})} if names else {}
    row = rows.get(key)
    if row is not None and row.layers is None:
        return "scalar", row.id, None, 1
    for vkey, vrow in sorted(rows.items()):
        if vrow.layers is not None and key.startswith(vkey + "/"):
            names = json.loads(vrow.layers)
            name = key[len(vkey) + 1 :]
            if name in names:
                return "slot", vrow.id, names.index(name), len(names)
    require_run(conn, run_id)
    raise NotFound(f"key {key!r} not found in run {run_id}")


# Built once: every chart read names its key (building a select costs more than SQLite running it).
_KEYS_NAMED = select(db.metric_keys.c.id, db.metric_keys.c.key, db.metric_keys.c.layers).where(
    db.metric_keys.c.run_id == bindparam("run"), db.metric_keys.c.key.in_(bindparam("keys", expanding=True))
)


def get_series(
    conn, run_id: int, key: str, max_points: int | None = None, start: int | None = None, end: int | None = None
) -> dict:
    """Every point of one key in step order (or a min/max envelope when max_points is set)."""
    _kind, key_id, slot, slots = _resolve_key(conn, run_id, key)  # NotFound names the run when it is the run
    return {"key": key, **series.read_series(conn, key_id, slot, slots, max_points, start, end)}


def points_between(conn, run_id: int, keys: list[str], lo: int, hi: int) -> dict:
    """The points of some keys between two steps: key -> (kind, steps, walls, points), the shape of ingest's
    ``stored`` (what ``live.hub.points_message`` turns into a push)."""
    rows = {
        r.key: r
        for r in conn.execute(
            select(db.metric_keys).where(db.metric_keys.c.run_id == run_id, db.metric_keys.c.key.in_(keys))
        )
    }
    stored = {}
    for key, row in rows.items():
        slots = len(json.loads(row.layers)) if row.layers is not None else 1
        p = chunks.read(conn, row.id, lo, hi, slots)
        stored[key] = ("scalar" if row.layers is None else "vector", p.steps, p.walls, p)
    return stored


MAX_HEATMAP_CELLS = 250_000  # layers x step columns in one heatmap read (docs/security.md)


def get_heatmap(
    conn,
    run_id: int,
    key: str = contract.keys.GRAD_VECTOR,
    max_steps: int = 400,
    start: int | None = None,
    end: int | None = None,
) -> dict:
    """Layer x step matrix of a vector key; each column is the max over its step bucket."""
    layouts = vector_layouts(conn, run_id)
    if key not in layouts:
        raise NotFound(f"vector key {key!r} not found in run {run_id}")
    key_id = conn.execute(
        select(db.metric_keys.c.id).where(db.metric_keys.c.run_id == run_id, db.metric_keys.c.key == key)
    ).scalar()
    layers = layouts[key]
    # layers x columns is what one read costs (memory, JSON): many layers get fewer, wider columns
    columns = max(1, min(max_steps, MAX_HEATMAP_CELLS // max(1, len(layers))))
    return {"key": key, "layers": layers, **series.read_heatmap(conn, key_id, len(layers), columns, start, end)}


def keeps_nonfinite(kind: str) -> bool:
    """Whether an alert of this kind keeps a NaN/inf value (its rule's spec says the value is the news)."""
    spec = contract.rules.spec(kind)
    return spec is not None and spec.nonfinite_value


def alert_dict(r) -> dict:
    """An alert row (or a mapping with the same names) in API form: the one owner of that shape."""
    get = r.get if isinstance(r, dict) else lambda name: getattr(r, name)
    value = get("value")
    count = get("count") or 1
    return {
        "id": get("id"),
        "run_id": get("run_id"),
        "kind": get("kind"),
        "step": get("step"),
        "key": get("key"),
        "layer": get("layer"),
        "value": protocol.encode_float(db.from_db_float(value))
        if value is not None or keeps_nonfinite(get("kind"))
        else None,
        "severity": get("severity"),
        "message": get("message"),
        "created_at": get("created_at"),
        "updated_at": get("updated_at") or get("created_at"),
        "count": count,
        "last_step": get("last_step") if get("last_step") is not None else get("step"),
        "confirmed_step": get("confirmed_step"),
        "incident_id": get("incident_id"),
    }


def get_alerts(conn, run_id: int) -> list[dict]:
    """A run's alerts in order of first arrival (a recurring alert is one entry with a count)."""
    require_run(conn, run_id)
    rows = conn.execute(select(db.alerts).where(db.alerts.c.run_id == run_id).order_by(db.alerts.c.id))
    return [alert_dict(r) for r in rows]
