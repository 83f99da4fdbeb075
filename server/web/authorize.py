"""Whether an identified request may go on: its role's ability for the route, and its token's projects.

The route table is ``roles.ROUTES``; a project-limited token reaches a project's routes, its runs (looked up by
id) and lists asked for one of its projects; a request across projects (the runs list without ``project``)
is refused with a message that says how to ask.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, unquote

from sqlalchemy import select

from gradwatch_server.storage import db
from gradwatch_server.web import pools, roles

INCIDENT_PATH = re.compile(r"/api/incidents/(\d+)(/.*)?")
IDS_LIMIT = 200


class Denied(Exception):
    """Why an identity may not do this: a status (403) and a message."""


def _projects_of_runs(engine, run_ids: list[int]) -> set:
    with engine.connect() as conn:
        rows = conn.execute(select(db.runs.c.project).where(db.runs.c.id.in_(run_ids[:IDS_LIMIT])))
        return {r.project for r in rows}


def _project_of_incident(engine, incident_id: int) -> set:
    with engine.connect() as conn:
        run_id = conn.execute(select(db.incidents.c.run_id).where(db.incidents.c.id == incident_id)).scalar()
    return set() if run_id is None else _projects_of_runs(engine, [run_id])


async def projects_of(scope, engine) -> set | None:
    """The projects a request reaches (empty: none that exist), or None when it spans every project."""
    path = scope.get("path", "")
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if m := roles.PROJECT_PATH.fullmatch(path):
        return {unquote(m.group(1))}
    if m := roles.RUN_PATH.fullmatch(path):
        return await pools.run("sessions", _projects_of_runs, engine, [int(m.group(1))])
    if m := INCIDENT_PATH.fullmatch(path):
        return await pools.run("sessions", _project_of_incident, engine, int(m.group(1)))
    if "project" in query:
        return set(query["project"])
    if "ids" in query:
        ids = [int(x) for x in re.findall(r"\d+", ",".join(query["ids"]))[:IDS_LIMIT]]
        return await pools.run("sessions", _projects_of_runs, engine, ids)
    if not path.startswith(("/api/", "/ws/")) or path in ("/api/me", "/ws/ingest"):
        return set()  # pages and static files: no data; the ingest hello names its project (checked there)
    return None


async def authorize(identity: roles.Identity, scope, engine) -> None:
    """Raise Denied when ``identity`` may not make this request."""
    method = "WS" if scope["type"] == "websocket" else scope.get("method", "GET")
    path = scope.get("path", "")
    needed = roles.ability(method, path)
    if not identity.can(needed):
        holders = " or ".join(r for r in roles.ROLES if needed in roles.ABILITIES[r])
        raise Denied(
            f"the token {identity.name!r} (role {identity.role}) may not do this: {method} {path} needs a "
            f"token with the role {holders}"
        )
    if identity.projects is None or engine is None:
        return
    reached = await projects_of(scope, engine)
    allowed = ", ".join(sorted(identity.projects))
    if reached is None:
        raise Denied(
            f"the token {identity.name!r} is limited to the project(s) {allowed}: name one with ?project=<name>"
        )
    if not all(identity.sees(p) for p in reached):
        raise Denied(f"the token {identity.name!r} is limited to the project(s) {allowed}")


def project_in(scope) -> str | None:
    """The project a request names in its path or query (what the audit log records), if any."""
    if m := roles.PROJECT_PATH.fullmatch(scope.get("path", "")):
        return unquote(m.group(1))
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return query.get("project", [None])[0]
