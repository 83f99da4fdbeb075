"""A project's alert rules over HTTP: read, change (validated, logged, applied to running runs from their next
batch), and replay proposed rules on the project's recent runs before saving."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Body, HTTPException, Request

from gradwatch.contract import rules as specs
from gradwatch_server.health import registry
from gradwatch_server.rules import backtest, policy
from gradwatch_server.web import pools
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
    out["defaults"] = dict(specs.DEFAULTS)
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

    await services.writer.submit_here(job)
    return await services.aread(_read, project)


REPLAYING: set[str] = set()  # projects with a replay running (one at a time each)


@router.post("/api/projects/{project}/rules/backtest")
async def backtest_rules(request: Request, project: str, body: dict = Body(...)) -> dict:
    """Where the proposed rules (the body) would fire on the project's recent runs, next to the current rules.

    One replay per project at a time (429 while one runs), on the replays' own threads; it stops at its budget
    or deadline (``complete`` false) and as soon as the client leaves."""
    proposed = _valid(body)
    if project in REPLAYING:
        raise HTTPException(429, f"a replay of project {project!r} is running; one at a time per project: retry")
    services, limits = _services(request), backtest.Limits()

    def run():
        with services.engine.connect() as conn:
            stored = policy.load(conn, project)
            current = {k: stored[k] for k in policy.EMPTY}
            return backtest.backtest(conn, project, current, proposed, limits=limits)

    REPLAYING.add(project)
    try:
        job = asyncio.ensure_future(pools.run("replays", run))
        while not job.done():
            await asyncio.wait({job}, timeout=0.25)
            if not job.done() and await request.is_disconnected():
                limits.stop.set()  # the replay ends at its next check; nobody reads the answer
        return job.result()
    except asyncio.CancelledError:
        limits.stop.set()
        raise
    finally:
        REPLAYING.discard(project)
