"""The inbox filters by status and puts open incidents first before its limit, so none is cut off by newer ones."""

from __future__ import annotations

import time

import pytest

from gradwatch_server.health import incidents
from gradwatch_server.storage import database, db


def _incident(run_id: int, status: str, updated: float, until: float | None = None) -> dict:
    return {
        "run_id": run_id,
        "root_alert_id": None,
        "kind": "loss_nan",
        "family": "loss",
        "first_step": 1,
        "last_step": 1,
        "severity": "critical",
        "status": status,
        "snoozed_until": until,
        "created_at": updated,
        "updated_at": updated,
    }


@pytest.fixture
def engine(tmp_path):
    """A migrated SQLite file with one run: an old open incident, an expired snooze, 250 newer resolved ones."""
    eng = database.make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    now = time.time()
    with eng.begin() as conn:
        run = {"uid": "u1", "project": "p", "name": "r", "status": "finished", "created_at": now, "updated_at": now}
        conn.execute(db.runs.insert().values(**run))
        conn.execute(db.incidents.insert().values(**_incident(1, "open", now - 9000)))
        conn.execute(db.incidents.insert().values(**_incident(1, "snoozed", now - 8000, until=now - 60)))
        conn.execute(db.incidents.insert().values(**_incident(1, "snoozed", now - 7000, until=now + 3600)))
        conn.execute(db.incidents.insert(), [_incident(1, "resolved", now - i) for i in range(250)])
    yield eng
    eng.dispose()


def test_old_open_incidents_come_first_past_the_limit_of_newer_resolved_ones(engine):
    with engine.connect() as conn:
        found = incidents.inbox(conn, limit=200)
    assert len(found) == 200
    assert [i["status"] for i in found[:3]] == ["open", "open", "snoozed"]  # the expired snooze reads as open
    assert {i["id"] for i in found[:2]} == {1, 2}


def test_the_status_filter_applies_before_the_limit_and_knows_an_expired_snooze_is_open(engine):
    with engine.connect() as conn:
        opened = incidents.inbox(conn, status="open", limit=200)
        snoozed = incidents.inbox(conn, status="snoozed", limit=200)
        resolved = incidents.inbox(conn, status="resolved", limit=10)
        other = incidents.inbox(conn, project="elsewhere")
    assert sorted(i["id"] for i in opened) == [1, 2]
    assert [i["id"] for i in snoozed] == [3]
    assert len(resolved) == 10 and {i["status"] for i in resolved} == {"resolved"}
    assert other == []
