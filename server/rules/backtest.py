"""Replaying rules on history: where proposed rules would have fired on a project's recent runs, next to
where its current rules fired, before anyone saves them.

The current rules' firings are the runs' stored alerts. For the proposal only what it changes is replayed:
the built-in kinds whose threshold, switch or severity differ, and its custom rules. The scalar keys those
read are read from the chunks once per run. The loss rules replay each loss series whole
(``health.loss.replay_series``: rolling medians at numpy speed, a run of spikes in one comparison); the
other kinds and the custom rules go through a Monitor with every other rule off, through ``observe_batch``
in large batches (the rules' numpy bulk checks make a healthy stretch cost a few array operations).
Per-layer vectors are not replayed: a per-layer rule's changes show as its alerts kept or dropped.

Bounded (docs/security.md, "Limits"): runs are read and replayed one at a time, newest first, never all held
at once; a replay stops, answering what it has with ``complete: false`` and why, at ``POINTS_BUDGET`` points
x rules, at its deadline, or when ``stop`` is set (the client left). The route runs one replay per project
at a time, on the replays' own thread pool (never the writer's thread, never the pool the API reads on).
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
from sqlalchemy import select

from gradwatch import contract
from gradwatch.protocol import is_loss_key
from gradwatch_server.health import loss, registry
from gradwatch_server.health import monitor as health
from gradwatch_server.health.common import GLOBAL, Alert
from gradwatch_server.rules.policy import EMPTY, Policy
from gradwatch_server.storage import chunks, db

BATCH = 2048  # records per observe_batch call after the first
FIRST = 256
MAX_RUNS = 100
POINTS_BUDGET = 20_000_000  # points x rules one replay may judge (rules: the replayed kinds + the custom rules)
DEADLINE = 8.0  # seconds a replay may run before it answers with what it has


class Stopped(Exception):
    """The replay must end now: the reason it gives (the deadline passed, the client left)."""


class Limits:
    """When a replay stops: its deadline, a stop event the route sets when the client leaves."""

    def __init__(self, deadline: float = DEADLINE, stop: threading.Event | None = None):
        self.until, self.stop = time.monotonic() + deadline, stop or threading.Event()
        self.deadline = deadline

    def check(self) -> None:
        if self.stop.is_set():
            raise Stopped("the client left")
        if time.monotonic() > self.until:
            raise Stopped(f"the replay's deadline of {self.deadline:g} s passed")


LOSS_KINDS = {r.kind: i for i, r in enumerate(loss.RULES)}  # replayed whole series at a time, in rule order


def _keys(conn, run_id: int, wanted) -> dict:
    """key -> key id for the run's scalar keys the rules read."""
    rows = conn.execute(
        select(db.metric_keys.c.id, db.metric_keys.c.key).where(
            db.metric_keys.c.run_id == run_id, db.metric_keys.c.layers.is_(None)
        )
    )
    return {r.key: r.id for r in rows if wanted(r.key)}


def run_columns(conn, run_id: int, wanted) -> tuple[np.ndarray, dict]:
    """(steps, key -> (rows, values)) of a run, the shape Monitor.observe_batch takes."""
    series = {}
    for key, key_id in _keys(conn, run_id, wanted).items():
        p = chunks.read(conn, key_id, column=0)
        series[key] = (p.steps, p.values[:, 0])
    if not series:
        return np.empty(0, dtype=np.int64), {}
    steps = max((s for s, _ in series.values()), key=len)
    if not _covers(steps, series.values()):
        steps = np.unique(np.concatenate([s for s, _ in series.values()]))
    return steps, {k: (np.searchsorted(steps, s), v) for k, (s, v) in series.items()}


def _covers(steps: np.ndarray, series) -> bool:
    """Whether ``steps`` is strictly increasing and holds every series' steps (the usual case: a loss logged every
    step holds the rest, a validation loss every 100 steps among them): then no union is needed."""
    if len(steps) > 1 and not (np.diff(steps) > 0).all():
        return False
    for other, _ in series:
        idx = np.searchsorted(steps, other)
        if (idx >= len(steps)).any() or (steps[np.minimum(idx, len(steps) - 1)] != other).any():
            return False
    return True


def reads(kinds: set, keys: set):
    """Whether a scalar key is one the replayed kinds (or the custom rules, on ``keys``) read: the rest stay unread.
    The gradient norm too where a replayed rule looks only at records that carry gradients."""
    rules = [r for r in registry.RULES if r.kind in kinds]
    names = set(keys).union(*(r.reads for r in rules)) | ({GLOBAL} if any(r.needs_grads for r in rules) else set())
    losses = any(r.losses for r in rules)
    return lambda key: key in names or (losses and is_loss_key(key))


def affected(current: dict, proposed: dict) -> set:
    """The built-in kinds whose verdicts the proposal can change: a threshold, the on/off switch or the severity."""
    kinds = set(registry.kinds())
    out = set(current["disabled"]) ^ set(proposed["disabled"])
    for name in set(current["thresholds"]) | set(proposed["thresholds"]):
        if current["thresholds"].get(name) != proposed["thresholds"].get(name):
            out.add(name.split(".", 1)[0])
    for kind in set(current["severity"]) | set(proposed["severity"]):
        if current["severity"].get(kind) != proposed["severity"].get(kind):
            out.add(kind)
    return out & kinds


def replay(
    steps: np.ndarray, cols: dict, doc: dict, run_alerts: dict, kinds: set, limits: Limits | None = None
) -> list:
    """Where the rules of ``doc`` for ``kinds`` (and its custom rules) fire on one run, in step order."""
    th = health.thresholds({**doc["thresholds"], **run_alerts})
    on = kinds - set(doc["disabled"])
    rest = on - set(LOSS_KINDS)
    policy = Policy({**{k: doc[k] for k in EMPTY}, "disabled": sorted(set(registry.kinds()) - rest)})
    fired = _loss_alerts(steps, cols, th, on & set(LOSS_KINDS), doc["severity"])
    if rest or policy.custom:
        fired += _monitor(steps, cols, th, policy, limits or Limits(float("inf")))
    return [_brief(a.kind, a.step, a.value, a.key, a.layer, a.severity) for a in fired]


def _loss_alerts(steps: np.ndarray, cols: dict, th: dict, kinds: set, severity: dict) -> list:
    """The loss rules' alerts, each loss series replayed whole; in the order a Monitor raises them within a step
    (rule order, then key order), with the project's severities."""
    if not kinds:
        return []
    found = []
    for n, (key, (rows, values)) in enumerate(cols.items()):
        if is_loss_key(key):
            for i, kind in loss.replay_series(kinds, values, th):
                step = int(steps[rows[i]])
                sev = severity.get(kind, loss.SEVERITY[kind])
                found.append(((step, LOSS_KINDS[kind], n), Alert(kind, step, float(values[i]), sev, "", key=key)))
    found.sort(key=lambda f: f[0])
    return [a for _, a in found]


def _monitor(steps: np.ndarray, cols: dict, th: dict, policy: Policy, limits: Limits) -> list:
    """The other replayed kinds and the custom rules: a Monitor fed the run in large batches."""
    monitor = health.Monitor(th, policy=policy)
    fired, lo = [], 0
    while lo < len(steps):
        limits.check()
        hi = min(lo + (FIRST if lo == 0 else BATCH), len(steps))  # a short first batch: rules warming up go
        part = {}  # record by record until their history is full, and that costs per record
        for key, (rows, values) in cols.items():
            a, b = np.searchsorted(rows, [lo, hi])
            if b > a:
                part[key] = (rows[a:b] - lo, values[a:b])
        fired += monitor.observe_batch(steps[lo:hi], part, {})
        lo = hi
    return fired + policy.apply(monitor.flush())


def _brief(kind, step, value, key, layer, severity) -> dict:
    return {"kind": kind, "step": step, "value": value, "key": key, "layer": layer, "severity": severity}


def stored(conn, run_id: int) -> list[dict]:
    """Where the rules fired on the run as it went (its stored alerts), in brief."""
    rows = conn.execute(select(db.alerts).where(db.alerts.c.run_id == run_id).order_by(db.alerts.c.step))
    return [
        _brief(r.kind, r.step, contract.encode_float(db.from_db_float(r.value)), r.key, r.layer, r.severity)
        for r in rows
    ]


def backtest(
    conn, project: str, current: dict, proposed: dict, limit: int = MAX_RUNS, limits: Limits | None = None
) -> dict:
    """Per run of the project's ``limit`` newest: where the current rules fired (its alerts) and where the
    proposed ones would have (the kinds the proposal changes and its custom rules replayed, the rest as fired).
    Stops early (``complete`` false, ``stopped`` says why) at the budget, the deadline or the client's leaving."""
    t0, limits = time.perf_counter(), limits or Limits()
    kinds = affected(current, proposed)
    keys = {r["key"] for r in proposed["custom"]}
    wanted = reads(kinds, keys)
    rules = max(1, len(kinds) + len(proposed["custom"]))
    ids = conn.execute(
        select(db.runs.c.id).where(db.runs.c.project == project).order_by(db.runs.c.id.desc()).limit(limit)
    ).scalars()
    out, points, stopped = [], 0, None
    for run_id in list(ids):  # one run read and replayed at a time: memory is one run's keys, not the project's
        try:
            limits.check()
            r = conn.execute(
                select(db.runs.c.id, db.runs.c.name, db.runs.c.alert_config).where(db.runs.c.id == run_id)
            ).first()
            if r is None:
                continue  # deleted meanwhile
            fired = stored(conn, r.id)
            cols = run_columns(conn, r.id, wanted) if kinds or keys else None
            size = 0 if cols is None else sum(len(v) for _, v in cols[1].values())
            if (points + size) * rules > POINTS_BUDGET:
                stopped = (
                    f"the replay budget of {POINTS_BUDGET:,} points x rules was reached after {len(out)} run(s) "
                    f"({rules} rule(s) replayed)"
                )
                break
            out.append(_one((r, fired, cols), proposed, kinds, limits))
            points += size
        except Stopped as exc:
            stopped = f"{exc} after {len(out)} run(s)"
            break
    return {
        "project": project,
        "replayed": sorted(kinds) + (["custom_rule"] if keys else []),
        "runs": out,
        "points": points,
        "complete": stopped is None,
        "stopped": stopped,
        "budget": {"points_x_rules": POINTS_BUDGET, "seconds": limits.deadline},
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _one(job, proposed: dict, kinds: set, limits: Limits | None = None) -> dict:
    """One run's answer: its alerts, and the proposal's (kept where unchanged, replayed where changed)."""
    r, fired, cols = job
    kept = [
        a
        for a in fired
        if a["kind"] not in kinds and a["kind"] != "custom_rule" and a["kind"] not in proposed["disabled"]
    ]
    if cols is not None:
        new = replay(*cols, proposed, _own_alerts(r.alert_config), kinds, limits)
        for a in new:
            a["value"] = contract.encode_float(a["value"]) if a["value"] is not None else None
        kept = sorted(kept + new, key=lambda a: a["step"] if a["step"] is not None else -1)
    return {"run_id": r.id, "name": r.name, "current": fired, "proposed": kept}


def _own_alerts(text) -> dict:
    """A run's own alert thresholds (its init(alerts=...)): they win in the replay too."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
