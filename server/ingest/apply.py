"""What happens to a batch: plain functions run on the writer thread, one batch at a time.

(A hello is answered by hello.py; run states by run_states.py.) ``apply_batch`` stores one decoded batch (batch.py) of a run:
layouts, then every key's points as chunks (chunks.py) and rollups (rollup.py), then the health
rules over the whole batch, then events, alerts and the run row. Whatever cannot be stored (a
malformed record, a key over the run's limit) is left out, counted, and reported as a
``data_refused`` alert and in the ack; the rest of the batch is stored.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import select, update

from gradwatch import contract, protocol
from gradwatch import thresholds as th_rules
from gradwatch_server.health import monitor as health
from gradwatch_server.health.alerts import AlertBook
from gradwatch_server.health.diagnose import diagnose, with_incident
from gradwatch_server.ingest import media as media_ingest
from gradwatch_server.ingest import run_row
from gradwatch_server.ingest.batch import Batch
from gradwatch_server.ingest.hello import clean_json
from gradwatch_server.ingest.limits import cap_alert_events
from gradwatch_server.rules import policy as project_rules
from gradwatch_server.storage import chunks, db, rollup_writes, summaries
from gradwatch_server.storage.blocks import rollup_cache
from gradwatch_server.storage.blocks.clock import Clock
from gradwatch_server.storage.media import defined


@dataclass
class Limits:
    """Per-run caps (server settings), each refusal explained in the run's alerts."""

    max_keys: int = contract.MAX_KEYS_PER_RUN
    max_layers: int = contract.MAX_LAYERS
    media: media_ingest.MediaLimits = field(default_factory=media_ingest.MediaLimits)


@dataclass
class RunState:
    """Writer-side cache for one run: key ids, vector layouts, chunk tails, rollups and the health monitor."""

    run_id: int
    key_ids: dict = field(default_factory=dict)
    layouts: dict = field(default_factory=dict)
    monitor: health.Monitor | None = None
    last_step: int | None = None
    last_seq: int = 0  # the last committed batch: the one authority on duplicates and gaps
    rollups: rollup_cache.Cache = field(default_factory=rollup_cache.Cache)
    tails: dict = field(default_factory=dict)
    alerts: AlertBook | None = None
    media_bytes: int | None = None  # media the run holds (ingest/media.py), summed on first use
    clock: Clock | None = None  # the run's step -> wall time (storage/blocks/clock.py), loaded at first use
    definitions: dict = field(default_factory=dict)  # define_metric's (storage/media/defined.py), from meta.metrics

    def run_clock(self, conn) -> Clock:
        if self.clock is None:
            self.clock = Clock.load(conn, self.run_id)
        return self.clock


def load_state(conn, run_id: int) -> RunState:
    """Rebuild the writer cache of a run from the database (after a server restart)."""
    state = RunState(run_id)
    for row in conn.execute(select(db.metric_keys).where(db.metric_keys.c.run_id == run_id)):
        state.key_ids[row.key] = row.id
        if row.layers is not None:
            state.layouts[row.key] = json.loads(row.layers)
    cfg, meta, state.last_step, state.last_seq, project = conn.execute(
        select(
            db.runs.c.alert_config, db.runs.c.meta, db.runs.c.last_step, db.runs.c.last_seq, db.runs.c.project
        ).where(db.runs.c.id == run_id)
    ).one()
    th, policy = project_rules.for_run(conn, project, _loads(cfg))  # the run's own alerts= win over the project's
    state.monitor = health.Monitor(health.thresholds(th), meta=_loads(meta), policy=policy)
    state.definitions = defined.of_meta(_loads(meta))
    state.alerts = AlertBook.load(conn, run_id)
    _replay_recent(conn, state)
    return state


def _loads(text) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


REPLAY_DEPTH = 2 * th_rules.MAX_WINDOW  # most steps a rebuilt run state replays (docs/security.md, "Limits")


def _replay_recent(conn, state: RunState) -> None:
    """Warm the health rules with the run's latest steps (after a restart), dropping their alerts.

    Rolling baselines, streak counts and open episodes come back as they were, so a restarted
    server neither misses an explosion for lack of history nor repeats an alert already raised.
    """
    th = state.monitor.th
    # capped: a patience or min_history of 1e7 must not make every rules change replay a whole run on the writer
    depth = (
        min(REPLAY_DEPTH, int(max(v for k, v in th.items() if k.endswith((".window", ".patience", ".min_history")))))
        + 1
    )
    steps: dict = {}
    for key, key_id in state.key_ids.items():
        if key in state.layouts or not health.relevant(key):
            continue
        points = chunks.latest(conn, key_id, depth, slots=1)
        for step, value in zip(points.steps.tolist(), points.values[:, 0].tolist()):
            steps.setdefault(step, ({}, {}))[0][key] = value
    grad_id = state.key_ids.get(health.GRAD_VECTOR)
    layout = state.layouts.get(health.GRAD_VECTOR)
    if grad_id is not None and layout is not None:
        points = chunks.latest(conn, grad_id, depth, slots=len(layout))
        for step, values, present in zip(points.steps.tolist(), points.values.tolist(), points.present().tolist()):
            norms = [v if p else None for v, p in zip(values, present)]
            steps.setdefault(step, ({}, {}))[1][health.GRAD_VECTOR] = (layout, norms)
    for step in sorted(steps)[-depth:]:
        state.monitor.observe(step, *steps[step])


def _key_id(conn, state: RunState, key: str, limits: Limits, layers: list | None = None) -> int | None:
    """The key's id, created on first use; None when the run already has its maximum of keys."""
    key_id = state.key_ids.get(key)
    if key_id is None:
        if len(state.key_ids) >= limits.max_keys:
            return None
        key_id = conn.execute(
            db.metric_keys.insert().values(
                run_id=state.run_id, key=key, layers=json.dumps(layers) if layers is not None else None
            )
        ).inserted_primary_key[0]
        state.key_ids[key] = key_id
        rollup_cache.new_key(state.rollups, key_id)
    return key_id


def apply_batch(
    conn, state: RunState, batch: Batch, now: float | None = None, limits: Limits | None = None, marked: bool = False
) -> dict:
    """Store one batch whose seq the caller claimed (``run_row.claim_seq``); returns what to push and what was refused.

    ``marked``: the claim wrote the run's updated_at (``now``) and last_step already (``run_row.claim_seq``).
    """
    now = now or time.time()
    limits = limits or Limits()
    del batch.problems[batch.decoding_problems :]  # a retry (after a failed group commit) starts afresh
    _apply_layouts(conn, state, batch, limits)
    stored = _store_columns(conn, state, batch, limits)
    summaries.record(conn, state.run_id, stored)  # last/min/max per key, one upsert per batch
    new_alerts = _observe(state, batch) + state.monitor.take_updates()  # alerts follow their open episodes
    run_changes: dict = {"updated_at": now}  # last_seq: written by the claim, in this transaction
    redefined = _defines_metrics(batch)
    media_ingest.apply(conn, state, batch, limits.media)  # histograms, images, tables; summary and config events
    _defined_summaries(conn, state, stored, redefined)
    for ev in cap_alert_events(batch.events, state.alerts.rows, batch.problems):
        try:
            new_alerts += _apply_event(state, ev, run_changes)
        except (protocol.ProtocolError, TypeError, ValueError, OverflowError) as exc:
            batch.problems.append(f"event: {exc}")
    if batch.problems:
        new_alerts.append(refused_alert(batch))
    if run_changes.get("status") in contract.CLIENT_ENDINGS:  # its newest blocks are final now
        run_clock = state.run_clock(conn)
        omits = functools.partial(run_clock.omits, conn)
        pending, tails = rollup_writes.Writes(), chunks.Writes()
        rollup_writes.write_pending(conn, state.rollups, pending)
        pending.flush(conn, omits)  # every level's newest block: lean where the clock has its walls, as a batch's
        for tail in state.tails.values():
            chunks.seal(tails, tail, omits)
        tails.flush(conn)
        run_clock.flush(conn)
    changed = [state.alerts.record(conn, a, now) for a in new_alerts]
    if "error" in run_changes:  # a crash right after a divergence (even in the same batch) is told as part of it
        run_changes["error"] = with_incident(run_changes["error"], state.alerts.incidents.rows)
    if batch.newest is not None:
        run_changes["last_step"] = batch.newest if state.last_step is None else max(batch.newest, state.last_step)
    if not marked or run_changes.keys() - {"updated_at", "last_step"}:
        run_row.set_columns(conn, state.run_id, run_changes)
    state.last_step = run_changes.get("last_step", state.last_step)
    state.last_seq = batch.seq
    return {
        "stored": stored,
        "alerts": changed,
        "status": run_changes.get("status"),
        "last_step": run_changes.get("last_step"),
        "refused": "; ".join(batch.problems)[:2000] or None,
    }


def _defines_metrics(batch: Batch) -> bool:
    """Whether the batch carries a ``define_metric`` (a meta event with ``metrics``)."""
    return any(
        isinstance(e, dict) and e.get("type") == "meta" and isinstance(e.get("meta"), dict) and "metrics" in e["meta"]
        for e in batch.events
    )


def _defined_summaries(conn, state: RunState, stored: dict, redefined: bool) -> None:
    """define_metric's summaries of the batch's keys (of every key when the definitions changed)."""
    if redefined:
        meta = conn.execute(select(db.runs.c.meta).where(db.runs.c.id == state.run_id)).scalar()
        state.definitions = defined.of_meta(_loads(meta))
        defined.materialize(conn, state.run_id, state.definitions)
    elif state.definitions:
        keys = [k for k, (kind, *_rest) in stored.items() if kind == "scalar"]
        if keys:
            defined.materialize(conn, state.run_id, state.definitions, keys)


def refused_alert(batch: Batch) -> health.Alert:
    shown = "; ".join(batch.problems[:5]) + (f"; and {len(batch.problems) - 5} more" if len(batch.problems) > 5 else "")
    return health.Alert(
        "data_refused",
        batch.oldest,
        float(len(batch.problems)),
        "warning",
        key=None,
        message=(f"Part of batch {batch.seq} could not be stored: {shown[:1500]}. Everything else in it was stored."),
    )


def _apply_layouts(conn, state: RunState, batch: Batch, limits: Limits) -> None:
    for key, names in batch.layouts.items():
        if len(names) > limits.max_layers:
            batch.problems.append(f"layout of {key!r} has {len(names)} slots, over the limit of {limits.max_layers}")
            continue
        key_id = _key_id(conn, state, key, limits, names)
        if key_id is None:
            batch.problems.append(f"key {key!r} not created: the run already has {limits.max_keys} keys")
            continue
        if state.layouts.get(key) != names:
            conn.execute(update(db.metric_keys).where(db.metric_keys.c.id == key_id).values(layers=json.dumps(names)))
            state.layouts[key] = names


def _store_columns(conn, state: RunState, batch: Batch, limits: Limits) -> dict:
    """Every key's points into chunks and rollups; returns key -> (kind, steps, walls, Column) as stored."""
    stored = {}
    chunk_writes, rollup_rows = chunks.Writes(), rollup_writes.Writes()
    run_clock = state.run_clock(conn)
    run_clock.observe(batch.steps, batch.walls, batch.ascending)
    omits = functools.partial(run_clock.omits, conn)
    shared = []  # scalar keys logged at every step of the batch: their rollups are summarised together
    for kind, columns in (("scalar", batch.scalars), ("vector", batch.vectors)):
        for key, column in columns.items():
            key_id = _accept(conn, state, batch, limits, kind, key, column.values.shape[1])
            if key_id is None:
                continue
            steps, walls = batch.column_steps(column)
            points = chunks.Points(steps, walls, column.values, column.missing)
            tail = state.tails.get(key)
            if tail is None:  # first write since this cache was built: pick up the key's small rows
                tail = state.tails[key] = chunks.load_tail(conn, key_id, column.values.shape[1])
            chunks.append(chunk_writes, tail, key_id, points, omits)
            if kind == "scalar" and column.rows is None:
                shared.append((key_id, column.values))  # (k, 1): side by side, column j is key j
            else:
                rollup_writes.update_rollups(
                    conn, state.rollups, key_id, steps, walls, column.values, points.present(), rollup_rows
                )
            stored[key] = (kind, steps, walls, column)
    if shared:
        values = np.concatenate([v for _k, v in shared], axis=1)
        rollup_writes.update_many(
            conn,
            state.rollups,
            [k for k, _v in shared],
            batch.steps,
            batch.walls,
            values,
            chunks.all_present(values.shape),
            rollup_rows,
        )
    chunk_writes.flush(conn)
    rollup_rows.flush(conn, omits)  # a vector's summaries lean where the clock has their walls
    run_clock.flush(conn)  # the entries those chunks and summaries rely on, in the same transaction
    return stored


def _accept(conn, state: RunState, batch: Batch, limits: Limits, kind: str, key: str, slots: int) -> int | None:
    """The key id to store a column under, or None (and the reason in ``batch.problems``)."""
    if kind == "vector" and not 0 < slots <= limits.max_layers:
        batch.problems.append(f"vector {key!r} with {slots} values per step not stored (limit 1-{limits.max_layers})")
        return None
    if (key in state.layouts) != (kind == "vector") and key in state.key_ids:
        batch.problems.append(f"{key!r} was logged both as a number and as a vector; {kind} values not stored")
        return None
    layers = state.layouts.get(key) or ([f"param[{i}]" for i in range(slots)] if kind == "vector" else None)
    key_id = _key_id(conn, state, key, limits, layers)
    if key_id is None:
        batch.problems.append(f"key {key!r} not stored: the run already has {limits.max_keys} keys")
    elif kind == "vector" and key not in state.layouts:
        state.layouts[key] = layers
    return key_id


def _observe(state: RunState, batch: Batch) -> list:
    """The health rules over the whole batch (``Monitor.observe_batch``): the keys they read, in record order."""
    scalars = {k: c for k, c in batch.scalars.items() if state.monitor.reads(k)}  # a project's custom rules too
    grad = batch.vectors.get(health.GRAD_VECTOR)
    if not scalars and grad is None:
        return []
    every = np.arange(len(batch.steps))
    cols = {k: (every if c.rows is None else c.rows, c.values[:, 0]) for k, c in scalars.items()}
    vecs = {}
    if grad is not None:
        present = np.ones(grad.values.shape, dtype=bool) if grad.missing is None else ~grad.missing
        vecs[health.GRAD_VECTOR] = (
            state.layouts.get(health.GRAD_VECTOR) or [],
            every if grad.rows is None else grad.rows,
            grad.values,
            present,
        )
    return state.monitor.observe_batch(batch.steps, cols, vecs)


def _apply_event(state: RunState, ev, changes: dict) -> list:
    """Apply a run-level event; returns alerts it implies."""
    if not isinstance(ev, dict):
        raise protocol.ProtocolError("event must be an object")
    kind = ev.get("type")
    if kind == "status":
        status = ev.get("status")
        if status not in contract.CLIENT_STATUSES:
            raise protocol.ProtocolError(f"unknown status {status!r}")
        changes["status"] = status
        if status in contract.CLIENT_ENDINGS:
            changes["finished_at"] = changes["updated_at"]
            return state.monitor.flush()  # an alert held for its step's loss goes out now
        return []
    if kind == "exception":
        error = {k: clean_json(ev.get(k)) for k in ("exc_type", "message", "traceback", "step", "memory")}
        error["message"] = str(error["message"])[:20000]
        error["traceback"] = str(error["traceback"])[-50000:]
        error["diagnosis"] = diagnose(
            str(ev.get("exc_type"))[:200],
            error["message"][:4000],
            ev.get("memory") if isinstance(ev.get("memory"), dict) else None,
        )
        changes["error"] = json.dumps(error)
        return state.monitor.on_exception(error)
    if kind == "alert":
        step = ev.get("step")
        return [
            health.Alert(
                kind=str(ev.get("kind"))[:40],
                step=step if type(step) is int else None,
                layer=_short(ev.get("layer")),
                value=protocol.decode_float(ev.get("value")),
                severity=str(ev.get("severity", "warning"))[:16],
                message=str(ev.get("message", ""))[:4000],
                key=_short(ev.get("key")),
            )
        ]
    raise protocol.ProtocolError(f"unknown event type {kind!r}")


def _short(value) -> str | None:
    return None if value is None else str(value)[: contract.MAX_KEY_LEN]
