"""What happens to a hello: the run created or resumed, after checking the client's run secret."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time

from sqlalchemy import select, update

from gradwatch import contract, protocol
from gradwatch_server.health import monitor as health
from gradwatch_server.health.alerts import insert_alert
from gradwatch_server.storage import db
from gradwatch_server.storage.store import json_depth


def open_run(conn, info: dict, server_alerts: dict, now: float | None = None, resume_from: int | None = None) -> dict:
    """Create the run for a hello, or resume it (reconnect); returns run_id and acked_seq."""
    now = now or time.time()
    row = conn.execute(
        select(db.runs.c.id, db.runs.c.last_seq, db.runs.c.status, db.runs.c.secret).where(db.runs.c.uid == info["uid"])
    ).first()
    if row is not None and row.secret is not None and not hmac.compare_digest(row.secret, _secret_hash(info) or ""):
        # A uid alone (it shows in URLs and logs) must not let anyone resume, move the run's sequence or add data.
        raise protocol.ProtocolError("this run uid belongs to another client (its run secret does not match)")
    if row is not None and row.secret is None:
        # Nothing can prove who owns a run made without a secret (gradwatch before run secrets, or a
        # client that sent none): resuming it would let anyone with the token move its sequence ahead
        # so the real client's batches are dropped as duplicates. Its data stays readable.
        raise protocol.ProtocolError(
            f"run {row.id} was created without a run secret, so nothing proves this client owns it: it is "
            "read-only (its data stays); start a new run to keep logging"
        )
    if row is not None:
        conn.execute(update(db.runs).where(db.runs.c.id == row.id).values(seen_at=now))
        if row.status in ("crashed", "stalled"):
            conn.execute(update(db.runs).where(db.runs.c.id == row.id).values(status="running", updated_at=now))
        out = {"run_id": row.id, "acked_seq": row.last_seq, "created": False}
    else:
        check_limits(info)  # only a new run stores the documents: a resume never re-reads them
        out = _create_run(conn, info, server_alerts, now)
    if resume_from is not None and resume_from > out["acked_seq"] + 1:
        _skip_lost_batches(conn, out, resume_from, now)
    return out


def _skip_lost_batches(conn, opened: dict, resume_from: int, now: float) -> None:
    """The client no longer holds batches this database never got (acked by a server whose data is
    gone): say so in an alert and carry on from what it has, instead of refusing it forever."""
    first_lost, last_lost = opened["acked_seq"] + 1, resume_from - 1
    conn.execute(update(db.runs).where(db.runs.c.id == opened["run_id"]).values(last_seq=last_lost, updated_at=now))
    insert_alert(
        conn,
        opened["run_id"],
        health.Alert(
            "data_gap",
            None,
            float(last_lost - first_lost + 1),
            "warning",
            message=(
                f"Batches {first_lost}-{last_lost} of this run were acknowledged earlier by a server that no longer has "
                "them (was the database replaced or restored from a backup?). Everything the training process still "
                "held is stored from here on."
            ),
        ),
        now,
    )
    opened.update(acked_seq=last_lost, skipped=last_lost - first_lost + 1)


def ensure_layouts(
    conn, run_id: int, layouts: dict, max_keys: int = contract.MAX_KEYS_PER_RUN, max_layers: int = contract.MAX_LAYERS
) -> list[str]:
    """Create the vector keys a hello names that this run does not have yet (within the run's limits)."""
    known = {r.key for r in conn.execute(select(db.metric_keys.c.key).where(db.metric_keys.c.run_id == run_id))}
    added = []
    for key, names in layouts.items():
        protocol.check_key(key)
        if not isinstance(names, list):
            raise protocol.ProtocolError(f"layout of {key!r} must be a list of names")
        if key in known or len(names) > max_layers or len(known) + len(added) >= max_keys:
            continue  # over a limit: left to the batches, where the refusal is reported on the run
        conn.execute(
            db.metric_keys.insert().values(
                run_id=run_id,
                key=key,
                layers=json.dumps([protocol.clean_text(n)[: contract.MAX_KEY_LEN] for n in names]),
            )
        )
        added.append(key)
    return added


def check_limits(info: dict) -> None:
    """The size, nesting and tag caps of a new run's hello; ProtocolError naming the cap (docs/security.md)."""
    for name in ("config", "meta", "alerts"):
        value = info.get(name)
        if value is None:
            continue
        depth = json_depth(value, contract.MAX_DOC_DEPTH)
        if depth > contract.MAX_DOC_DEPTH:
            raise protocol.ProtocolError(
                f"hello.run.{name} is nested more than {contract.MAX_DOC_DEPTH} levels deep; flatten it"
            )
        size = len(json.dumps(value, ensure_ascii=False, default=str))
        if size > contract.MAX_DOC_BYTES:
            raise protocol.ProtocolError(
                f"hello.run.{name} is {size} bytes of JSON, over the limit of {contract.MAX_DOC_BYTES}; "
                "log big values as artifacts, not in the config"
            )
    check_tags(info.get("tags") or [], "hello.run.tags")


def check_tags(tags, field: str = "tags") -> None:
    """The tag caps shared by a hello and an edit (PATCH); ProtocolError (a ValueError) naming them."""
    if not isinstance(tags, list) or len(tags) > contract.MAX_TAGS:
        raise protocol.ProtocolError(f"{field} must be a list of at most {contract.MAX_TAGS} tags")
    if not all(isinstance(t, str) and 0 < len(t) <= contract.MAX_TAG_LEN for t in tags):
        raise protocol.ProtocolError(f"{field} must be strings of 1-{contract.MAX_TAG_LEN} characters each")


def _create_run(conn, info: dict, server_alerts: dict, now: float) -> dict:
    alerts = info.get("alerts") if isinstance(info.get("alerts"), dict) else {}
    result = conn.execute(
        db.runs.insert().values(
            uid=info["uid"],
            project=protocol.clean_text(info.get("project") or "default")[: contract.MAX_NAME_LEN],
            secret=_secret_hash(info),
            name=protocol.clean_text(info.get("name") or info["uid"][:8])[: contract.MAX_NAME_LEN],
            status="running",
            created_at=now,
            updated_at=now,
            seen_at=now,
            last_seq=0,
            config=_json(info.get("config") or {}),
            meta=_json(info.get("meta") or {}),
            alert_config=_json({**server_alerts, **alerts}),
            tags=_json([str(t) for t in info.get("tags") or []] if isinstance(info.get("tags"), list) else []),
            notes="",
        )
    )
    return {"run_id": result.inserted_primary_key[0], "acked_seq": 0, "created": True}


def _secret_hash(info: dict) -> str | None:
    """The stored form of the client's per-run secret (never the secret itself)."""
    secret = info.get("secret")
    return hashlib.sha256(secret.encode("utf-8", "replace")).hexdigest() if isinstance(secret, str) and secret else None


def _json(value) -> str:
    """Strict JSON for a stored document (a bare NaN from a client becomes the string "NaN")."""
    return json.dumps(clean_json(value), ensure_ascii=False)


def clean_json(value):
    """A client's JSON value made safe to store: non-finite floats as strings, strings valid Unicode."""
    if isinstance(value, float) and not math.isfinite(value):
        return protocol.encode_float(value)
    if isinstance(value, str):
        return protocol.clean_text(value)
    if isinstance(value, dict):
        return {protocol.clean_text(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    return value
