"""A project's alert rules over HTTP: read, change (validated, logged, applied to running runs from their next
batch), and replay proposed rules on the project's recent runs before saving."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Body, HTTPException, Request

from gradwatch import thresholds
from gradwatch_server.health import registry
from gradwatch_server.rules import backtest, policy
from gradwatch_server.web.roles import identity_of

router = APIRouter()


def _services(request: Request):
    return request.app.state.services


def _valid(body) -> dict:
    try:
        return policy.validate(body)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def _read(conn, project: str) -> dict:
    return {**policy.load(conn, project), "history": policy.history(conn, project)}


@router.get("/api/projects/{project}/rules")
def get_rules(request: Request, project: str) -> dict:
    """The project's rules (disabled, thresholds, severity, custom), who changed them and when, and the defaults."""
    out = _services(request).read(_read, project)
    out["defaults"] = dict(thresholds.DEFAULTS)
    out["kinds"] = list(registry.kinds())
    return out


@router.put("/api/projects/{project}/rules")
async def put_rules(request: Request, project: str, body: dict = Body(...)) -> dict:
    """Replace the project's rules (validated); running runs apply them from their next batch."""
    doc = _valid(body)
    by = identity_of(request).name  # the token's name: never what the caller says (a "by" field is ignored)
    services = _services(request)

    def job(conn):
        saved = policy.save(conn, project, doc, by)
        for run_id in policy.project_runs(conn, project):
            services.pipeline.invalidate(run_id)  # its Monitor is rebuilt with these rules at its next batch
        return saved

    await asyncio.wrap_future(services.writer.submit(job))
    return await services.aread(_read, project)


@router.post("/api/projects/{project}/rules/backtest")
async def backtest_rules(request: Request, project: str, body: dict = Body(...)) -> dict:
    """Where the proposed rules (the body) would fire on the project's recent runs, next to the current rules."""
    proposed = _valid(body)
    services = _services(request)

    def run(conn):
        stored = policy.load(conn, project)
        current = {k: stored[k] for k in policy.EMPTY}
        return backtest.backtest(conn, project, current, proposed)

    return await services.aread(run)
