"""Incidents: the alerts of a run that share a cause, one root and its consequences in step order.

An lr-50 run raises ``loss_divergence`` (1), ``nonfinite_gradients`` (3) and ``nan_loss`` (4): one story.
Kinds that one failure produces together form a family (``FAMILIES``); a new alert joins the run's latest
incident of its family unless that incident is resolved or went quiet for ``JOIN_GAP`` steps. The root
(the first alert) carries the cause when one is visible: the learning rate at onset against the one where
the loss was falling, or the layer where NaN started. A consequence whose usual advice is wrong in the
incident's light (exactly-zero gradients after a divergence are saturation, not a ``.detach()``) is
rewritten to say so.
"""

from __future__ import annotations

import math
import time

import numpy as np
from sqlalchemy import case, select, update

from gradwatch.contract import keys as vocab
from gradwatch_server.storage import chunks, db, store

STATUSES = ("open", "acknowledged", "snoozed", "resolved")
JOIN_GAP = 2000  # steps of quiet after which a new alert of the family starts a new incident
# Kinds one failure produces together: a too-high LR diverges, the gradients explode and go NaN, the loss goes NaN,
# the network saturates (zero gradients), AMP skips steps. Kinds not listed are incidents of their own.
DIVERGENCE = (
    "loss_divergence",
    "loss_spike",
    "exploding_gradients",
    "nonfinite_gradients",
    "nan_loss",
    "zero_gradients",
    "vanishing_gradients",
    "amp_overflow",
    "nan_provenance",  # the client's probe of where the first NaN was born
    "instability_warning",  # the early warning that comes before a divergence
)
FAMILIES = {kind: "divergence" for kind in DIVERGENCE}
DIVERGED = ("loss_divergence", "nan_loss", "nonfinite_gradients", "exploding_gradients")  # the model blew up
VERBS = {
    "loss_divergence": "diverged",
    "loss_spike": "loss spiked",
    "exploding_gradients": "gradients exploded",
    "nonfinite_gradients": "gradients non-finite",
    "nan_loss": "loss NaN",
    "zero_gradients": "gradients zero",
    "vanishing_gradients": "gradients vanishing",
    "amp_overflow": "AMP overflowing",
    "nan_provenance": "NaN born",
    "instability_warning": "instability warned",
    "missing_gradients": "gradients missing",
    "memory_pressure": "memory full",
    "stalled": "stalled",
}


def family(kind: str) -> str:
    """The family a kind belongs to: the kinds it may share an incident with."""
    return FAMILIES.get(kind, kind)


def story(alerts: list[dict]) -> str:
    """'diverged at 1 → gradients non-finite at 3 → loss NaN at 4': each kind once, at its first step."""
    seen, parts = set(), []
    for a in sorted(alerts, key=_order):
        if a["kind"] not in seen:
            seen.add(a["kind"])
            at = f" at {a['step']}" if a["step"] is not None else ""
            parts.append(VERBS.get(a["kind"], a["kind"]) + at)
    return " → ".join(parts)


def _order(a: dict):
    return (a["step"] if a["step"] is not None else math.inf, a["id"] or 0)


class IncidentBook:
    """A run's incidents, loaded once per writer cache: which one a new alert joins."""

    def __init__(self, run_id: int, rows: list[dict]):
        self.run_id = run_id
        self.rows = rows  # oldest first: dicts of the incidents table's columns

    @classmethod
    def load(cls, conn, run_id: int) -> IncidentBook:
        rows = conn.execute(select(db.incidents).where(db.incidents.c.run_id == run_id).order_by(db.incidents.c.id))
        return cls(run_id, [{c.name: getattr(r, c.name) for c in db.incidents.columns} for r in rows])

    def _joins(self, alert: dict) -> dict | None:
        fam, step = family(alert["kind"]), alert["step"]
        for inc in reversed(self.rows):
            if inc["family"] != fam:
                continue
            if inc["status"] == "resolved":
                return None
            quiet = step is not None and inc["last_step"] is not None and step - inc["last_step"] > JOIN_GAP
            return None if quiet else inc
        return None

    def attach(self, conn, alert: dict, now: float, kinds_seen: set) -> tuple[dict, dict | None]:
        """Put a newly stored alert in its incident (a new one when none fits); returns (alert, message change)."""
        inc = self._joins(alert)
        step = alert["step"]
        if inc is None:
            inc = {
                "run_id": self.run_id,
                "root_alert_id": alert["id"],
                "kind": alert["kind"],
                "family": family(alert["kind"]),
                "cause": root_cause(conn, self.run_id, alert),
                "first_step": step,
                "last_step": step,
                "severity": alert["severity"],
                "status": "open",
                "snoozed_until": None,
                "status_by": None,
                "created_at": now,
                "updated_at": now,
            }
            inc["id"] = conn.execute(db.incidents.insert().values(**inc)).inserted_primary_key[0]
            self.rows.append(inc)
        else:
            changes = {"updated_at": now, **_span(inc, step)}
            if alert["severity"] == "critical":
                changes["severity"] = "critical"
            if inc["status"] in ("acknowledged",) and alert["severity"] == "critical" and inc["severity"] != "critical":
                changes["status"] = "open"  # it got worse than what was acknowledged
            conn.execute(update(db.incidents).where(db.incidents.c.id == inc["id"]).values(**changes))
            inc.update(changes)
        changes = {"incident_id": inc["id"]}
        message = consequence_message(alert, inc, kinds_seen)
        if message is not None:
            changes["message"] = message
        conn.execute(update(db.alerts).where(db.alerts.c.id == alert["id"]).values(**changes))
        return {**alert, **changes}, inc

    def extend(self, conn, alert: dict, now: float) -> None:
        """An alert's episode went on: its incident's span follows it."""
        for inc in self.rows:
            if inc["id"] == alert.get("incident_id"):
                changes = _span(inc, alert.get("last_step"))
                if inc["status"] == "resolved":
                    changes["status"] = "open"  # the problem came back
                if changes:
                    changes["updated_at"] = now
                    conn.execute(update(db.incidents).where(db.incidents.c.id == inc["id"]).values(**changes))
                    inc.update(changes)
                return


def _span(inc: dict, step) -> dict:
    """The incident's first/last step changes a step brings."""
    out = {}
    if step is None:
        return out
    if inc["first_step"] is None or step < inc["first_step"]:
        out["first_step"] = step
    if inc["last_step"] is None or step > inc["last_step"]:
        out["last_step"] = step
    return out


def consequence_message(alert: dict, inc: dict, kinds_seen: set) -> str | None:
    """A consequence's message in the incident's light, or None to keep the rule's own."""
    if alert["kind"] != "zero_gradients" or alert["id"] == inc["root_alert_id"]:
        return None
    diverged = [k for k in DIVERGED if k in kinds_seen]
    if not diverged:
        return None
    return (
        f"Gradients went exactly zero at step {alert['step']}{' in ' + alert['layer'] if alert.get('layer') else ''}: "
        f"the network saturated after diverging (incident from step {inc['first_step']}, {inc['kind']}). "
        "Activations pinned at their limits (dead ReLUs, saturated tanh/sigmoid) pass no gradient; this is a "
        "consequence of the divergence, not a cut graph. Fix the root: a lower learning rate, warmup, clipping."
    )


def lr_key(conn, run_id: int):
    """The run's learning-rate key row (``lr``, or the first of ``lr/<group>``), or None."""
    rows = conn.execute(
        select(db.metric_keys.c.id, db.metric_keys.c.key).where(
            db.metric_keys.c.run_id == run_id, db.metric_keys.c.layers.is_(None)
        )
    ).all()
    keys = {r.key: r.id for r in rows}
    if vocab.LR in keys:
        return keys[vocab.LR]
    groups = sorted(k for k in keys if vocab.is_lr_key(k))
    return keys[groups[0]] if groups else None


def root_cause(conn, run_id: int, alert: dict) -> str | None:
    """What caused the root alert, when the data shows it: the learning rate, or the layer where NaN began."""
    if family(alert["kind"]) == "divergence":
        cause = lr_cause(conn, run_id, alert)
        if cause:
            return cause
    if alert["kind"] == "nonfinite_gradients" and alert.get("layer"):
        return f"NaN/inf started in {alert['layer']} (the parameter nearest the input)"
    return None


def falling_fastest(steps: np.ndarray, values: np.ndarray) -> int | None:
    """The step where a (smoothed) loss fell fastest: where training was working."""
    keep = np.isfinite(values)
    steps, values = steps[keep], values[keep]
    if len(values) < 2:
        return int(steps[0]) if len(steps) else None
    w = max(1, len(values) // 20)
    smooth = np.convolve(values, np.ones(w) / w, mode="valid")
    if len(smooth) < 2:
        return int(steps[0])
    return int(steps[int(np.argmin(np.diff(smooth))) + w // 2])


def lr_cause(conn, run_id: int, alert: dict) -> str | None:
    """The LR at onset against the LR where the loss was falling fastest before onset (a ramp that went too far,
    a jump): "learning rate 0.18 at onset (step 344), 18x the 0.01 at step 40 where the loss was still falling"."""
    onset = alert["step"]
    key_id = lr_key(conn, run_id)
    if onset is None or key_id is None:
        return None
    lr = chunks.read(conn, key_id, -(2**62), onset, 1)
    if not len(lr.steps):
        return None
    lr_steps, lr_vals = lr.steps, lr.values[:, 0]
    at_onset = float(lr_vals[-1])
    loss_id = conn.execute(
        select(db.metric_keys.c.id).where(db.metric_keys.c.run_id == run_id, db.metric_keys.c.key == "loss")
    ).scalar()
    best_step = None
    if loss_id is not None:
        loss = chunks.read(conn, loss_id, -(2**62), onset - 1, 1)
        best_step = falling_fastest(loss.steps, loss.values[:, 0] if len(loss.steps) else np.empty(0))
    if best_step is not None:
        i = max(0, int(np.searchsorted(lr_steps, best_step, side="right")) - 1)
        then = float(lr_vals[i])
        if then > 0 and at_onset / then >= 2:
            return (
                f"learning rate {at_onset:.3g} at onset (step {onset}), {at_onset / then:.0f}× the {then:.3g} "
                f"at step {best_step} where the loss was still falling"
            )
    if float(np.min(lr_vals)) == float(np.max(lr_vals)):
        return f"learning rate {at_onset:.3g} from the start (constant): too high for this model from step {onset}"
    return f"learning rate {at_onset:.3g} at onset (step {onset})"


def incident_dict(inc, alerts: list[dict], now: float | None = None) -> dict:
    """An incident in API form: its root, every alert in step order and the one-line story (snoozes end at ``now``)."""
    get = inc.get if isinstance(inc, dict) else lambda name: getattr(inc, name)
    ordered = sorted(alerts, key=_order)
    root = next((a for a in alerts if a["id"] == get("root_alert_id")), ordered[0] if ordered else None)
    status = get("status")
    until = get("snoozed_until")
    if status == "snoozed" and until is not None and until <= (time.time() if now is None else now):
        status = "open"  # a snooze that ran out
    return {
        "id": get("id"),
        "run_id": get("run_id"),
        "kind": get("kind"),
        "root": root,
        "alerts": ordered,
        "cause": get("cause"),
        "story": story(ordered),
        "first_step": get("first_step"),
        "last_step": get("last_step"),
        "severity": get("severity"),
        "status": status,
        "snoozed_until": until if status == "snoozed" else None,
        "status_by": get("status_by"),
        "created_at": get("created_at"),
        "updated_at": get("updated_at"),
    }


# -- reads and status changes (the API's) -------------------------------------------------------------------
def _standalone(alert: dict) -> dict:
    """An alert stored before incidents existed: its own incident, with a negative id and no status changes."""
    inc = {
        "id": -alert["id"],
        "run_id": alert["run_id"],
        "root_alert_id": alert["id"],
        "kind": alert["kind"],
        "cause": None,
        "first_step": alert["step"],
        "last_step": alert["last_step"],
        "severity": alert["severity"],
        "status": "open",
        "snoozed_until": None,
        "status_by": None,
        "created_at": alert["created_at"],
        "updated_at": alert["updated_at"],
    }
    return incident_dict(inc, [alert])


def _rank(inc: dict):
    """Open first, then acknowledged, snoozed, resolved; newest first within each."""
    return (STATUSES.index(inc["status"]), -(inc["updated_at"] or 0))


def list_incidents(conn, run_id: int) -> list[dict]:
    """A run's incidents in order of their first step (``store.NotFound`` for an unknown run)."""
    alerts = store.get_alerts(conn, run_id)
    rows = conn.execute(select(db.incidents).where(db.incidents.c.run_id == run_id).order_by(db.incidents.c.id))
    by: dict = {}
    for a in alerts:
        by.setdefault(a["incident_id"], []).append(a)
    out = [incident_dict(r, by.get(r.id, [])) for r in rows]
    out += [_standalone(a) for a in by.get(None, [])]
    return sorted(out, key=lambda i: (i["first_step"] if i["first_step"] is not None else math.inf, i["id"]))


def inbox(conn, project: str | None = None, status: str | None = None, limit: int = 200) -> list[dict]:
    """Incidents across runs, open first, each with its run's name and project (at most ``limit``)."""
    now = time.time()
    inc = db.incidents.c
    shown = case((store.needs_look(now), "open"), else_=inc.status)  # what incident_dict will say the status is
    # the status and the order are SQL's, before the LIMIT: old open incidents are never cut off by newer ones
    query = (
        select(db.incidents, db.runs.c.name.label("run_name"), db.runs.c.project)
        .join(db.runs, db.runs.c.id == inc.run_id)
        .order_by(case(*((shown == s, i) for i, s in enumerate(STATUSES)), else_=len(STATUSES)), inc.updated_at.desc())
        .limit(limit)
    )
    if project:
        query = query.where(db.runs.c.project == project)
    if status is not None:
        query = query.where(shown == status)
    rows = conn.execute(query).all()
    ids = [r.id for r in rows]
    alerts: dict = {}
    if ids:
        for a in conn.execute(select(db.alerts).where(db.alerts.c.incident_id.in_(ids))):
            alerts.setdefault(a.incident_id, []).append(store.alert_dict(a))
    out = []
    for r in rows:
        found = incident_dict(r, alerts.get(r.id, []), now)
        found["run_name"], found["project"] = r.run_name, r.project
        out.append(found)
    return sorted(out, key=_rank)


def check_status(body: dict) -> tuple[str, float | None, str | None]:
    """(status, snoozed_until, by) from a request body, or ValueError saying what is wrong."""
    status = body.get("status")
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    until = None
    if status == "snoozed":
        minutes = body.get("minutes", 60)
        if minutes is not None and (
            isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 0 < minutes <= 525600
        ):
            raise ValueError("minutes must be a number from 0 to 525600 (a year), or null: snoozed until changed")
        until = None if minutes is None else time.time() + 60.0 * minutes
    by = body.get("by")
    if by is not None and (not isinstance(by, str) or len(by) > 200):
        raise ValueError("by must be a string of at most 200 characters")
    return status, until, by


def incident_run(conn, incident_id: int) -> int:
    """The run an incident belongs to (``store.NotFound`` when there is none)."""
    run_id = conn.execute(select(db.incidents.c.run_id).where(db.incidents.c.id == incident_id)).scalar()
    if run_id is None:
        raise store.NotFound(f"incident {incident_id} not found")
    return run_id


def set_status(conn, run_id: int, incident_id: int | None, status: str, until: float | None, by: str | None) -> int:
    """Change one incident's status (or, with ``incident_id`` None, every incident of the run); returns how many."""
    where = db.incidents.c.run_id == run_id
    if incident_id is not None:
        where = where & (db.incidents.c.id == incident_id)
    values = {"status": status, "snoozed_until": until, "status_by": by, "updated_at": time.time()}
    return conn.execute(update(db.incidents).where(where).values(**values)).rowcount
