"""Who is asking and what they may do (/api/me), the named tokens (admin), the audit log (admin)."""

from __future__ import annotations

from fastapi import APIRouter, Body, HTTPException, Query, Request

from gradwatch_server.web import audit, sessions, tokens
from gradwatch_server.web.roles import identity_of

router = APIRouter()


def _services(request: Request):
    return request.app.state.services


@router.get("/api/me")
def me(request: Request) -> dict:
    """This request's token: its name, role, projects (null: all) and what the role may do (``can``)."""
    return identity_of(request).me()


@router.get("/api/tokens")
def list_tokens(request: Request) -> list[dict]:
    """The named tokens (never their secrets): name, role, projects, created, expiry, last use."""
    return _services(request).read(tokens.listing)


@router.post("/api/tokens")
async def create_token(request: Request, body: dict = Body(...)) -> dict:
    """A new token ``{"name", "role", "projects"?, "expires_at"?}``; the answer holds its ``secret``, once."""
    services, who = _services(request), identity_of(request)
    if not request.app.state.auth.enabled:
        raise HTTPException(
            400,
            "this server runs without a token (everyone is admin): start it with --token-file (or "
            "GRADWATCH_TOKEN) first, or make tokens with `gradwatch token create` and restart it",
        )

    def job(conn):
        return tokens.create(
            conn, body.get("name"), body.get("role"), body.get("projects"), body.get("expires_at"), who.name
        )

    try:
        made = await services.writer.submit_here(job)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    request.app.state.auth.named = True
    audit.note(services.writer, who, f"token create {made['name']}", 200, detail={"role": made["role"]})
    return made


@router.delete("/api/tokens/{name}")
async def revoke_token(request: Request, name: str) -> dict:
    """Revoke a token: it stops working at once here, in other server processes within 30 s; its sessions end."""
    services, auth = _services(request), request.app.state.auth

    def job(conn):
        row = conn.execute(tokens.select_digest(name)).scalar()
        if row is None:
            raise KeyError(name)
        sessions.end_of_token(conn, row)
        return row, tokens.revoke(conn, name)

    try:
        key, gone = await services.writer.submit_here(job)
    except KeyError:
        raise HTTPException(404, f"no token named {name!r}") from None
    auth.forget(key)
    audit.note(services.writer, identity_of(request), f"token revoke {name}", 200)
    return gone


@router.get("/api/audit")
def read_audit(
    request: Request,
    limit: int = Query(200, ge=1, le=audit.MAX_ROWS),
    who: str | None = None,
    project: str | None = None,
) -> list[dict]:
    """The audit log, newest first: who (token name and role), what, the answer's status, when."""
    return _services(request).read(audit.listing, limit, who, project)
