"""Incidents over HTTP: a run's incidents, the inbox across runs, acknowledge / snooze / mute / resolve."""

from __future__ import annotations

from fastapi import APIRouter, Body, HTTPException, Request

from gradwatch import contract
from gradwatch_server.health import incidents
from gradwatch_server.health.pace import contention
from gradwatch_server.storage import store
from gradwatch_server.web.roles import identity_of

router = APIRouter()


def _services(request: Request):
    return request.app.state.services


@router.get("/api/runs/{run_id}/incidents")
def run_incidents(request: Request, run_id: int) -> list[dict]:
    """A run's incidents in step order: id, root, alerts (step order), first_step, last_step, status, cause."""
    services = _services(request)
    services.read(store.get_run, run_id)  # 404 for an unknown run
    return services.read(incidents.list_incidents, run_id)


@router.get("/api/runs/{run_id}/contention")
def run_contention(request: Request, run_id: int) -> list[dict]:
    """Slowdowns that are not the run's own (other processes on the machine): information, not incidents."""
    return _services(request).read(contention.notes, run_id)  # notes() reads the run: 404 for an unknown one


@router.get("/api/incidents")
def inbox(request: Request, project: str | None = None, status: str | None = None) -> list[dict]:
    """Incidents across runs (the inbox): open first, then acknowledged, snoozed, resolved; critical first in each."""
    if status is not None and status not in incidents.STATUSES:
        raise HTTPException(400, f"status must be one of {', '.join(incidents.STATUSES)}")
    found = _services(request).read(incidents.inbox, project, status)
    return sorted(found, key=_worst_first)  # stable: newest first stays within a status and severity


def _worst_first(inc: dict) -> tuple:
    """The inbox order: by status (open first), then severity (critical first; SEVERITIES runs mildest first)."""
    severity = inc.get("severity")
    rank = contract.SEVERITIES.index(severity) if severity in contract.SEVERITIES else -1
    return (incidents.STATUSES.index(inc["status"]), -rank)


def _checked(request: Request, body: dict):
    """(status, until, by): ``by`` is the token's name, never what the caller sends (a "by" field is ignored)."""
    try:
        status, until, _claimed = incidents.check_status({k: v for k, v in body.items() if k != "by"})
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return status, until, identity_of(request).name


@router.post("/api/incidents/{incident_id}/status")
async def incident_status(request: Request, incident_id: int, body: dict = Body(...)) -> dict:
    """Acknowledge, snooze (``minutes``; null = mute), resolve or reopen one incident."""
    status, until, by = _checked(request, body)
    services = _services(request)
    run_id = await services.aread(incidents.incident_run, incident_id)
    await services.write(incidents.set_status, run_id, incident_id, status, until, by)
    found = await services.aread(incidents.list_incidents, run_id)
    return next(i for i in found if i["id"] == incident_id)


@router.post("/api/runs/{run_id}/incidents/status")
async def run_status(request: Request, run_id: int, body: dict = Body(...)) -> dict:
    """The same for every incident of a run (acknowledge all, mute the run with ``minutes`` null)."""
    status, until, by = _checked(request, body)
    services = _services(request)
    await services.aread(store.get_run, run_id)
    changed = await services.write(incidents.set_status, run_id, None, status, until, by)
    return {"run_id": run_id, "changed": changed, "status": status}
