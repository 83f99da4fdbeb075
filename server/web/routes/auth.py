"""The login page: a person exchanges the token (or a one-time link) for a session cookie."""

from __future__ import annotations

import html
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from gradwatch_server.web import audit
from gradwatch_server.web.identify import COOKIE, Auth, cookie_values
from gradwatch_server.web.routes.pages import frontend_dir

router = APIRouter()

MESSAGES = {
    "": "",
    "wrong": "That token is not right.",
    "ingest": "That token is for training machines (role ingest): it streams runs but cannot log in.",
    "used": "That one-time link was already used or is not valid; enter the token instead.",
}


def _auth(request: Request) -> Auth:
    return request.app.state.auth


def safe_next(target: str | None) -> str:
    """Only a path on this server: no //other.site, /\\other.site or /<tab>/other.site open redirects
    (browsers drop tabs and newlines from a URL and read a backslash as a slash)."""
    if not target or not target.startswith("/") or "\\" in target or any(c < " " or c == "\x7f" for c in target):
        return "/"
    parts = urlsplit(target)
    if target.startswith("//") or parts.scheme or parts.netloc:
        return "/"
    return target


def _form(next_path: str, message: str = "", status: int = 200) -> HTMLResponse:
    text = (frontend_dir() / "login.html").read_text()
    text = text.replace("{{next}}", html.escape(next_path, quote=True))
    text = text.replace("{{message}}", html.escape(MESSAGES[message]))
    return HTMLResponse(text, status_code=status, headers={"Cache-Control": "no-store"})


async def _logged_in(request: Request, next_path: str, identity) -> RedirectResponse:
    """Redirect to ``next_path`` with a new session (bound to ``identity``'s token) in its cookie."""
    audit.note(request.app.state.services.writer, identity, "login", 303)
    response = RedirectResponse(next_path, status_code=303)
    response.set_cookie(
        COOKIE,
        await _auth(request).sessions.create(identity.digest),
        max_age=int(request.app.state.services.settings.session_days * 86400),
        path="/",
        httponly=True,
        samesite="strict",
        # https to this server, or from a trusted_proxy that says so (uvicorn's forwarded_allow_ips)
        secure=request.url.scheme == "https",
    )
    return response


@router.get("/login", include_in_schema=False)
async def login_page(request: Request, next: str | None = None, once: str | None = None):
    """The form; with ?once=<code> a one-time link that logs in without typing the token."""
    target = safe_next(next)
    if not _auth(request).enabled:
        return RedirectResponse(target, status_code=303)
    if once is not None:
        auth = _auth(request)
        if auth.token and auth.redeem(once):
            return await _logged_in(request, target, await auth.of_secret(auth.token))
        return _form(target, "used", status=401)
    return _form(target)


@router.post("/login", include_in_schema=False)
async def login(request: Request):
    """The form's post: token=<token>&next=<path>."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    target = safe_next((form.get("next") or ["/"])[0])
    auth = _auth(request)
    if not auth.enabled:
        return RedirectResponse(target, status_code=303)
    identity = await auth.of_secret((form.get("token") or [""])[0].strip())
    if identity is None:
        return _form(target, "wrong", status=401)
    if not identity.can("read"):
        return _form(target, "ingest", status=403)
    return await _logged_in(request, target, identity)


@router.post("/logout", include_in_schema=False)
async def logout(request: Request):
    """End this browser's session (here at once, in other server processes within 30 s); back to /login."""
    auth = _auth(request)
    if auth.sessions is not None:
        for value in cookie_values(request.headers.get("cookie", ""), COOKIE)[:4]:
            await auth.sessions.end(value)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


@router.get("/login/status", include_in_schema=False)
def login_status() -> dict:
    """Reached only with a valid session (the middleware checks): the login page skips itself."""
    return {"logged_in": True}
