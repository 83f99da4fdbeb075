"""What happens to a run's data on its way in: plain functions run on the writer thread."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from gradwatch import protocol
from sqlalchemy import select, update

from . import db, health, rollup
from .diagnose import diagnose


@dataclass
class RunState:
    """Writer-side cache for one run: key ids, vector layouts and the health monitor."""

    run_id: int
    key_ids: dict = field(default_factory=dict)
    layouts: dict = field(default_factory=dict)
    monitor: health.Monitor | None = None
    last_step: int | None = None
    last_seq: int = 0  # the last committed batch: the one authority on duplicates and gaps
    rollups: dict = field(default_factory=dict)


def open_run(conn, info: dict, server_alerts: dict, now: float | None = None,
             resume_from: int | None = None) -> dict:
    """Create the run for a hello, or resume it (reconnect); returns run_id and acked_seq."""
    now = now or time.time()
    row = conn.execute(select(db.runs.c.id, db.runs.c.last_seq, db.runs.c.status)
                       .where(db.runs.c.uid == info["uid"])).first()
    if row is not None:
        if row.status == "crashed":
            conn.execute(update(db.runs).where(db.runs.c.id == row.id).values(status="running", updated_at=now))
        out = {"run_id": row.id, "acked_seq": row.last_seq, "created": False}
    else:
        out = _create_run(conn, info, server_alerts, now)
    if resume_from is not None and resume_from > out["acked_seq"] + 1:
        _skip_lost_batches(conn, out, resume_from, now)
    return out


def _skip_lost_batches(conn, opened: dict, resume_from: int, now: float) -> None:
    """The client no longer holds batches this database never got (acked by a server whose data is
    gone): say so in an alert and carry on from what it has, instead of refusing it forever."""
    first_lost, last_lost = opened["acked_seq"] + 1, resume_from - 1
    conn.execute(update(db.runs).where(db.runs.c.id == opened["run_id"]).values(last_seq=last_lost, updated_at=now))
    insert_alert(conn, opened["run_id"], health.Alert(
        "data_gap", None, float(last_lost - first_lost + 1), "warning", message=(
            f"Batches {first_lost}-{last_lost} of this run were acknowledged earlier by a server that no longer has "
            "them (was the database replaced or restored from a backup?). Everything the training process still "
            "held is stored from here on.")), now)
    opened.update(acked_seq=last_lost, skipped=last_lost - first_lost + 1)


def ensure_layouts(conn, run_id: int, layouts: dict) -> list[str]:
    """Create the vector keys a hello names that this run does not have yet; returns them."""
    known = {r.key for r in conn.execute(select(db.metric_keys.c.key).where(db.metric_keys.c.run_id == run_id))}
    added = []
    for key, names in layouts.items():
        protocol.check_key(key)
        if not isinstance(names, list):
            raise protocol.ProtocolError(f"layout of {key!r} must be a list of names")
        if key not in known:
            conn.execute(db.metric_keys.insert().values(run_id=run_id, key=key, layers=json.dumps([str(n) for n in names])))
            added.append(key)
    return added


def _create_run(conn, info: dict, server_alerts: dict, now: float) -> dict:
    alerts = info.get("alerts") if isinstance(info.get("alerts"), dict) else {}
    result = conn.execute(db.runs.insert().values(
        uid=info["uid"], project=str(info.get("project") or "default")[:200],
        name=str(info.get("name") or info["uid"][:8])[:200], status="running", created_at=now, updated_at=now,
        last_seq=0, config=json.dumps(info.get("config") or {}), meta=json.dumps(info.get("meta") or {}),
        alert_config=json.dumps({**server_alerts, **alerts}),
        tags=json.dumps([str(t) for t in info.get("tags") or []]), notes=""))
    return {"run_id": result.inserted_primary_key[0], "acked_seq": 0, "created": True}


def load_state(conn, run_id: int) -> RunState:
    """Rebuild the writer cache of a run from the database (after a server restart)."""
    state = RunState(run_id)
    for row in conn.execute(select(db.metric_keys).where(db.metric_keys.c.run_id == run_id)):
        state.key_ids[row.key] = row.id
        if row.layers is not None:
            state.layouts[row.key] = json.loads(row.layers)
    cfg, meta, state.last_step, state.last_seq = conn.execute(
        select(db.runs.c.alert_config, db.runs.c.meta, db.runs.c.last_step, db.runs.c.last_seq)
        .where(db.runs.c.id == run_id)).one()
    state.monitor = health.Monitor(health.thresholds(json.loads(cfg or "{}")), meta=json.loads(meta or "{}"))
    _replay_recent(conn, state)
    return state


RULE_KEYS = ("grad/global_norm", "memory/cuda_reserved", "amp/scale")


def _replay_recent(conn, state: RunState) -> None:
    """Warm the health rules with the run's latest steps (after a restart), dropping their alerts.

    Rolling baselines, streak counts and open episodes come back as they were, so a restarted
    server neither misses an explosion for lack of history nor repeats an alert already raised.
    """
    th = state.monitor.th
    depth = int(max(v for k, v in th.items() if k.endswith((".window", ".patience", ".min_history")))) + 1
    steps: dict = {}
    for key, key_id in state.key_ids.items():
        if key in state.layouts or not (protocol.is_loss_key(key) or key in RULE_KEYS):
            continue
        rows = conn.execute(select(db.points.c.step, db.points.c.value).where(db.points.c.key_id == key_id)
                            .order_by(db.points.c.step.desc()).limit(depth)).all()
        for step, value in rows:
            steps.setdefault(step, ({}, {}))[0][key] = db.from_db_float(value)
    grad_id = state.key_ids.get(health.GRAD_VECTOR)
    if grad_id is not None and health.GRAD_VECTOR in state.layouts:
        rows = conn.execute(select(db.vectors.c.step, db.vectors.c.data, db.vectors.c.missing)
                            .where(db.vectors.c.key_id == grad_id).order_by(db.vectors.c.step.desc()).limit(depth)).all()
        layout = state.layouts[health.GRAD_VECTOR]
        for step, data, missing in rows:
            values = db.unpack_vector(data, missing)
            if len(values) == len(layout):
                steps.setdefault(step, ({}, {}))[1][health.GRAD_VECTOR] = (layout, values)
    for step in sorted(steps)[-depth:]:
        state.monitor.observe(step, *steps[step])


def _key_id(conn, state: RunState, key: str, layers: list | None = None) -> int:
    key_id = state.key_ids.get(key)
    if key_id is None:
        key_id = conn.execute(db.metric_keys.insert().values(
            run_id=state.run_id, key=key, layers=json.dumps(layers) if layers is not None else None
        )).inserted_primary_key[0]
        state.key_ids[key] = key_id
    return key_id


def apply_batch(conn, state: RunState, message: dict, now: float | None = None) -> dict:
    """Store one batch (already checked to be the next seq); returns what to push to pages."""
    now = now or time.time()
    for key, names in (message.get("layouts") or {}).items():
        protocol.check_key(key)
        if not isinstance(names, list):
            raise protocol.ProtocolError(f"layout of {key!r} must be a list of names")
        names = [str(n) for n in names]
        key_id = _key_id(conn, state, key, names)
        conn.execute(update(db.metric_keys).where(db.metric_keys.c.id == key_id).values(layers=json.dumps(names)))
        state.layouts[key] = names
    records = message.get("records") or []
    if not isinstance(records, list):
        raise protocol.ProtocolError("batch.records must be a list")
    decoded = [protocol.decode_record(r) for r in records]
    push = _store_records(conn, state, decoded, records)
    new_alerts = []
    for step, _wall, scalars, vecs in decoded:
        new_alerts += state.monitor.observe(step, scalars, {k: (state.layouts.get(k), v) for k, v in vecs.items()})
    run_changes: dict = {"updated_at": now, "last_seq": message["seq"]}
    for ev in message.get("events") or []:
        new_alerts += _apply_event(conn, state, ev, run_changes, now)
    stored_alerts = [insert_alert(conn, state.run_id, a, now) for a in new_alerts]
    steps = [d[0] for d in decoded]
    if steps:
        run_changes["last_step"] = max(steps if state.last_step is None else [*steps, state.last_step])
    conn.execute(update(db.runs).where(db.runs.c.id == state.run_id).values(**run_changes))
    state.last_step = run_changes.get("last_step", state.last_step)
    state.last_seq = message["seq"]
    push.update(alerts=stored_alerts, status=run_changes.get("status"), last_step=run_changes.get("last_step"))
    return push


def _store_records(conn, state: RunState, decoded: list, wire: list) -> dict:
    """Insert a batch's points and vectors, update the rollups; returns the live push for pages."""
    point_rows, vector_rows = [], []
    series: dict = {}
    vec_push: dict = {}
    raw: dict = {}  # key -> one list of values per step, for the rollups
    for (step, wall, scalars, vecs), record in zip(decoded, wire):
        for key, value in scalars.items():
            point_rows.append({"key_id": _key_id(conn, state, key), "step": step, "wall_time": wall,
                               "value": db.to_db_float(value)})
            raw.setdefault(key, []).append([value])
            s = series.setdefault(key, {"steps": [], "values": [], "wall_times": []})
            s["steps"].append(step)
            s["values"].append(protocol.encode_float(value))
            s["wall_times"].append(wall)
        for key, values in vecs.items():
            layout = state.layouts.get(key)
            if layout is None:
                raise protocol.ProtocolError(f"vector {key!r} arrived before its layout (send layouts first)")
            if len(layout) != len(values):
                raise protocol.ProtocolError(f"vector {key!r} has {len(values)} values, layout has {len(layout)}")
            data, missing = db.pack_vector(values)
            vector_rows.append({"key_id": _key_id(conn, state, key, layout), "step": step, "wall_time": wall,
                                "data": data, "missing": missing})
            raw.setdefault(key, []).append(values)
            v = vec_push.setdefault(key, {"steps": [], "values": []})
            v["steps"].append(step)
            v["values"].append(record["vectors"][key])  # already in wire form (checked by decode_record)
    if point_rows:
        conn.execute(db.points.insert(), point_rows)
    if vector_rows:
        conn.execute(db.vectors.insert(), vector_rows)
    for key, s in series.items():
        rollup.update_rollups(conn, state.rollups, state.key_ids[key], s["steps"], raw[key])
    for key, v in vec_push.items():
        rollup.update_rollups(conn, state.rollups, state.key_ids[key], v["steps"], raw[key])
    return {"series": series, "vectors": vec_push}


def _apply_event(conn, state: RunState, ev: dict, changes: dict, now: float) -> list:
    """Apply a run-level event; returns alerts it implies."""
    if not isinstance(ev, dict):
        raise protocol.ProtocolError("event must be an object")
    kind = ev.get("type")
    if kind == "status":
        status = ev.get("status")
        if status not in ("running", "finished", "failed"):
            raise protocol.ProtocolError(f"unknown status {status!r}")
        changes["status"] = status
        if status in ("finished", "failed"):
            changes["finished_at"] = now
        return []
    if kind == "exception":
        error = {k: ev.get(k) for k in ("exc_type", "message", "traceback", "step", "memory")}
        error["diagnosis"] = diagnose(str(ev.get("exc_type")), str(ev.get("message")), ev.get("memory"))
        changes["error"] = json.dumps(error)
        return state.monitor.on_exception(error)
    if kind == "alert":
        return [health.Alert(kind=str(ev.get("kind")), step=ev.get("step"), layer=ev.get("layer"),
                             value=protocol.decode_float(ev.get("value")), severity=str(ev.get("severity", "warning")),
                             message=str(ev.get("message", "")), key=ev.get("key"))]
    raise protocol.ProtocolError(f"unknown event type {kind!r}")


def insert_alert(conn, run_id: int, alert: "health.Alert", now: float) -> dict:
    """Store one alert; returns it in API form."""
    row = {"run_id": run_id, "kind": alert.kind, "step": alert.step, "key": alert.key, "layer": alert.layer,
           "value": None if alert.value is None else db.to_db_float(alert.value), "severity": alert.severity,
           "message": alert.message, "created_at": now}
    alert_id = conn.execute(db.alerts.insert().values(**row)).inserted_primary_key[0]
    row["id"] = alert_id
    row["value"] = protocol.encode_float(alert.value) if alert.value is not None else None
    return row


def mark_crashed(conn, run_ids: list[int], now: float | None = None) -> list[int]:
    """Mark running runs as crashed (their process went away without finishing)."""
    if not run_ids:
        return []
    conn.execute(update(db.runs).where(db.runs.c.id.in_(run_ids), db.runs.c.status == "running")
                 .values(status="crashed", updated_at=now or time.time()))
    return run_ids
