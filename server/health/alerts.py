"""Storing alerts: one row per problem; a recurrence updates it (count, last step, worst value).

A rule that fires again for the same kind, key and layer does not add a card to the run page:
the existing alert's ``count`` goes up, ``last_step`` moves on and ``value`` keeps the worst value
seen, while ``step`` stays the first bad step, so the start of the problem is always listed.
Every new alert joins its incident (incidents.py): the alerts of one problem, root cause first.
"""

from __future__ import annotations

from sqlalchemy import select, update

from gradwatch.protocol import decode_float
from gradwatch_server.health import monitor as health
from gradwatch_server.health.incidents import IncidentBook
from gradwatch_server.storage import db
from gradwatch_server.storage.store import alert_dict


def insert_alert(conn, run_id: int, alert: health.Alert, now: float) -> dict:
    """Store one new alert row; returns it in API form."""
    row = {
        "run_id": run_id,
        "kind": alert.kind,
        "step": alert.step,
        "key": alert.key,
        "layer": alert.layer,
        "value": None if alert.value is None else db.to_db_float(alert.value),
        "severity": alert.severity,
        "message": alert.message,
        "created_at": now,
        "updated_at": now,
        "count": 1,
        "last_step": alert.step,
        "confirmed_step": getattr(alert, "confirmed_step", None),
    }
    row["id"] = conn.execute(db.alerts.insert().values(**row)).inserted_primary_key[0]
    return alert_dict(row)


class AlertBook:
    """A run's stored alerts by (kind, key, layer), so a recurrence finds its row without a query."""

    def __init__(self, run_id: int, rows: dict, incidents: IncidentBook | None = None):
        self.run_id = run_id
        self.rows = rows  # (kind, key, layer) -> API dict of the stored alert
        self.incidents = incidents or IncidentBook(run_id, [])

    @classmethod
    def load(cls, conn, run_id: int) -> AlertBook:
        rows = conn.execute(select(db.alerts).where(db.alerts.c.run_id == run_id).order_by(db.alerts.c.id))
        return cls(run_id, {(r.kind, r.key, r.layer): alert_dict(r) for r in rows}, IncidentBook.load(conn, run_id))

    def record(self, conn, alert: health.Alert, now: float) -> dict:
        """Store a new alert or fold a recurrence (or an open episode's update) into its row; returns the
        alert as pages should show it."""
        ident = (alert.kind, alert.key, alert.layer)
        if alert.update:  # an open episode's update carries no layer: the episode's alert is the latest of its kind
            ident = next((i for i in reversed(self.rows) if i[:2] == ident[:2]), ident)
        old = self.rows.get(ident)
        if old is None:
            stored = insert_alert(conn, self.run_id, alert, now)
            kinds = {k for k, _, _ in self.rows} | {alert.kind}
            self.rows[ident] = stored = self.incidents.attach(conn, stored, now, kinds)[0]
            return stored
        changes = {"count": old["count"] + (alert.update or 1), "updated_at": now}
        if alert.step is not None:
            changes["last_step"] = max(alert.step, old["last_step"] if old["last_step"] is not None else alert.step)
        old_value = None if old["value"] is None else decode_float(old["value"])
        if health.worse(alert.kind, alert.value, old_value):
            changes["value"] = db.to_db_float(alert.value)
            if alert.severity == "critical":
                changes["severity"] = "critical"
        conn.execute(update(db.alerts).where(db.alerts.c.id == old["id"]).values(**changes))
        merged = {**old, **changes}
        if "value" in changes:
            merged["value"] = alert_dict({**merged, "value": changes["value"]})["value"]
        self.rows[ident] = merged
        self.incidents.extend(conn, merged, now)
        return merged
