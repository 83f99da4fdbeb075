"""Named tokens with roles against a real server: what each role may do, identity from the token (never from
the caller), the audit log, sessions that end with their token, and the token / audit commands."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from sqlalchemy import create_engine, select
from websockets.sync.client import connect

import gradwatch
from gradwatch import protocol
from gradwatch_server.serve import BackgroundServer
from gradwatch_server.storage import db

TOKEN = "tok-Secret-0123456789abcdef"


def call(base: str, method: str, path: str, token: str | None = None, body=None, cookie: str | None = None):
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if cookie:
        headers["Cookie"] = cookie
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


@pytest.fixture
def team(settings):
    """A server with the admin --token and four named tokens (their secrets by name)."""
    srv = BackgroundServer(dataclasses.replace(settings, token=TOKEN)).start()
    secrets = {}
    for name, role, projects in (
        ("box-12", "ingest", ["nlp"]),
        ("vic", "viewer", None),
        ("ed", "editor", None),
        ("ana", "admin", None),
        ("nlp-viewer", "viewer", ["nlp"]),
    ):
        status, body = call(srv.url, "POST", "/api/tokens", TOKEN, {"name": name, "role": role, "projects": projects})
        assert status == 200, body
        secrets[name] = body["secret"]
    yield srv, secrets
    srv.stop()


def stream(url: str, project: str, token: str, steps: int = 5):
    run = gradwatch.init(project=project, name=f"{project}-run", server=url, token=token, flush_interval=0.05)
    for step in range(steps):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    run.finish()
    return run


def ws_refusal(url: str, token: str, project: str) -> dict:
    """The first answer to a hello for ``project`` (an error when the token may not write there)."""
    hello = {"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "run": {"uid": "u-" + project, "project": project}}
    with connect(
        url.replace("http://", "ws://") + "/ws/ingest", additional_headers={"Authorization": f"Bearer {token}"}
    ) as ws:
        ws.send(json.dumps(hello))
        return json.loads(ws.recv(timeout=10))


def test_an_ingest_token_streams_its_project_and_nothing_else(team):
    srv, s = team
    stream(srv.url, "nlp", s["box-12"])
    status, runs = call(srv.url, "GET", "/api/runs", TOKEN)
    assert status == 200 and [r["project"] for r in runs] == ["nlp"] and runs[0]["last_step"] == 4
    engine = create_engine(srv.settings.db_url)
    with engine.connect() as conn:
        assert conn.execute(select(db.runs.c.created_by)).scalar() == "box-12"
    engine.dispose()
    assert call(srv.url, "GET", "/api/runs/1", TOKEN)[1]["created_by"] == "box-12"  # the token it was written with
    for method, path, body in (
        ("GET", "/api/runs", None),
        ("DELETE", "/api/runs/1", None),
        ("PATCH", "/api/runs/1", {"name": "x"}),
        ("PUT", "/api/projects/nlp/rules", {}),
        ("GET", "/api/projects/nlp/channels", None),
        ("PUT", "/api/projects/nlp/channels", {"channels": []}),
        ("GET", "/api/tokens", None),
    ):
        status, answer = call(srv.url, method, path, s["box-12"], body)
        assert status == 403 and "box-12" in answer["error"], (method, path, answer)
    assert ws_refusal(srv.url, s["box-12"], "cv")["type"] == "error"  # another project
    assert "may not write to the project 'cv'" in ws_refusal(srv.url, s["box-12"], "cv")["message"]
    assert call(srv.url, "GET", "/api/me", s["box-12"])[1] == {
        "name": "box-12",
        "role": "ingest",
        "projects": ["nlp"],
        "can": ["ingest"],
    }
    assert call(srv.url, "GET", "/api/runs/1")[0] == 401  # no token at all


def test_viewer_reads_editor_edits_admin_administers_and_by_is_the_token(team):
    srv, s = team
    stream(srv.url, "nlp", TOKEN)
    assert call(srv.url, "GET", "/api/runs", s["vic"])[0] == 200
    assert call(srv.url, "GET", "/api/me", s["vic"])[1]["can"] == ["read"]
    assert call(srv.url, "PATCH", "/api/runs/1", s["vic"], {"name": "renamed"})[0] == 403
    assert call(srv.url, "POST", "/api/runs/1/incidents/status", s["vic"], {"status": "acknowledged"})[0] == 403
    assert call(srv.url, "PATCH", "/api/runs/1", s["ed"], {"name": "renamed"})[0] == 200
    status, body = call(srv.url, "POST", "/api/runs/1/incidents/status", s["ed"], {"status": "resolved", "by": "eve"})
    assert status == 200, body
    assert call(srv.url, "DELETE", "/api/runs/1", s["ed"])[0] == 403
    assert call(srv.url, "PUT", "/api/projects/nlp/rules", s["ed"], {"disabled": ["loss_spike"]})[0] == 403
    status, rules = call(srv.url, "PUT", "/api/projects/nlp/rules", s["ana"], {"disabled": ["loss_spike"], "by": "eve"})
    assert status == 200 and rules["history"][0]["by"] == "ana"  # the token's name, not the claimed one
    # a project-limited viewer reaches its project only
    assert call(srv.url, "GET", "/api/runs?project=nlp", s["nlp-viewer"])[0] == 200
    assert call(srv.url, "GET", "/api/runs/1", s["nlp-viewer"])[0] == 200
    status, body = call(srv.url, "GET", "/api/runs", s["nlp-viewer"])
    assert status == 403 and "?project=" in body["error"]
    assert call(srv.url, "GET", "/api/runs?project=cv", s["nlp-viewer"])[0] == 403
    # the audit log: who did what, refusals too; admins only
    assert call(srv.url, "GET", "/api/audit", s["ed"])[0] == 403
    status, log = call(srv.url, "GET", "/api/audit", s["ana"])
    assert status == 200
    seen = {(e["who"], e["action"], e["status"]) for e in log}
    assert ("ed", "PATCH /api/runs/1", 200) in seen and ("vic", "PATCH /api/runs/1", 403) in seen
    assert ("ana", "PUT /api/projects/nlp/rules", 200) in seen
    assert any(e["action"] == "token create box-12" and e["who"] == "server-token" for e in log)


def _login(url: str, secret: str) -> tuple[int, str]:
    """POST /login with a token; the status and the session cookie (name=value) it set."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    req = urllib.request.Request(url + "/login", data=f"token={secret}&next=/".encode(), method="POST")
    try:
        resp = urllib.request.build_opener(NoRedirect).open(req, timeout=30)
    except urllib.error.HTTPError as err:
        resp = err
    return resp.status, (resp.headers.get("set-cookie") or "").split(";")[0]


def test_revoking_a_token_ends_its_browser_sessions_and_ingest_tokens_cannot_log_in(team):
    srv, s = team
    status, cookie = _login(srv.url, s["vic"])
    assert status == 303 and cookie.startswith("gradwatch_session=")
    assert call(srv.url, "GET", "/api/runs", cookie=cookie)[0] == 200
    assert call(srv.url, "GET", "/api/me", cookie=cookie)[1]["name"] == "vic"
    assert _login(srv.url, s["box-12"])[0] == 403  # an ingest token streams; it does not log in
    assert call(srv.url, "DELETE", "/api/tokens/vic", s["vic"])[0] == 403
    assert call(srv.url, "DELETE", "/api/tokens/vic", s["ana"])[0] == 200
    assert call(srv.url, "GET", "/api/runs", cookie=cookie)[0] == 401
    assert call(srv.url, "GET", "/api/runs", s["vic"])[0] == 401
    assert "vic" not in {t["name"] for t in call(srv.url, "GET", "/api/tokens", TOKEN)[1]}
    assert all("secret" not in t and "digest" not in t for t in call(srv.url, "GET", "/api/tokens", TOKEN)[1])


def test_a_session_of_the_server_token_ends_when_the_token_changes(settings):
    srv = BackgroundServer(dataclasses.replace(settings, token=TOKEN)).start()
    try:
        cookie = _login(srv.url, TOKEN)[1]
        assert call(srv.url, "GET", "/api/runs", cookie=cookie)[0] == 200
    finally:
        srv.stop()
    srv = BackgroundServer(dataclasses.replace(settings, token=TOKEN + "-rotated")).start()
    try:
        assert call(srv.url, "GET", "/api/runs", cookie=cookie)[0] == 401
    finally:
        srv.stop()


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "gradwatch_server.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_token_and_audit_commands(settings):
    dbflag = ["--db", settings.db_url]
    made = _cli("token", "create", "--role", "ingest", "--project", "nlp", "--name", "box-12", *dbflag)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip().splitlines()[-1]
    assert secret.startswith("gw_") and "role ingest, nlp" in made.stdout
    again = _cli("token", "create", "--role", "viewer", "--name", "box-12", *dbflag)
    assert again.returncode == 1 and "exists" in again.stderr
    listed = _cli("token", "ls", *dbflag)
    assert "box-12" in listed.stdout and "ingest" in listed.stdout and secret not in listed.stdout
    srv = BackgroundServer(dataclasses.replace(settings, token=TOKEN)).start()
    try:
        stream(srv.url, "nlp", secret, steps=3)
        assert call(srv.url, "GET", "/api/runs", TOKEN)[1][0]["last_step"] == 2
        revoked = _cli("token", "revoke", "box-12", *dbflag)
        assert revoked.returncode == 0, revoked.stderr
        assert _cli("token", "revoke", "box-12", *dbflag).returncode == 1
        srv.server.config.app.state.auth.forget()  # another process's cache lasts CACHE_SECONDS (30 s); this one's now
        assert call(srv.url, "GET", "/api/me", secret)[0] == 401
    finally:
        srv.stop()
    log = _cli("audit", *dbflag)
    assert log.returncode == 0 and "token create box-12" in log.stdout and "token revoke box-12" in log.stdout
    entries = json.loads(_cli("audit", "--json", *dbflag).stdout)
    assert entries[0]["action"] == "token revoke box-12" and entries[0]["who"] == "cli"


def test_named_tokens_alone_make_a_token_required(settings):
    """A server without --token but with named tokens (made by the CLI) is not open."""
    assert _cli("token", "create", "--role", "viewer", "--name", "v", "--db", settings.db_url).returncode == 0
    srv = BackgroundServer(settings).start()
    try:
        assert call(srv.url, "GET", "/api/runs")[0] == 401
    finally:
        srv.stop()


def test_pages_show_a_viewer_no_delete_and_an_admin_everything(team, browser):
    srv, s = team
    stream(srv.url, "nlp", TOKEN)
    for name, deletes, edits in (("vic", False, False), ("ed", False, True), ("ana", True, True)):
        context = browser.new_context()
        page = context.new_page()
        try:
            page.goto(srv.url + "/login?next=/")
            page.fill("#token", s[name])
            with page.expect_navigation():
                page.click("#login")
            page.wait_for_selector(
                f"body[data-role='{'viewer' if name == 'vic' else 'editor' if name == 'ed' else 'admin'}']"
            )
            page.wait_for_selector("#runs button:text('Delete')", state="attached")
            assert page.locator("#runs button:text('Delete')").first.is_visible() == deletes, name
            assert page.locator("#runs button:text('Rename')").first.is_visible() == edits, name
            page.goto(srv.url + "/rules?project=nlp")
            page.wait_for_selector("body[data-can]")
            assert page.locator("#save-channels").is_visible() == deletes, name  # channels: admins only
        finally:
            context.close()


def test_revocation_reaches_another_server_process_of_the_database(team, monkeypatch):
    """A second server on the same database stops taking a revoked token and its sessions within its cache
    period (30 s; shortened here to show the mechanism, not to wait)."""
    from gradwatch_server.web import sessions, tokens

    monkeypatch.setattr(tokens, "CACHE_SECONDS", 0.5)
    monkeypatch.setattr(sessions, "CACHE_SECONDS", 0.5)
    srv, s = team
    other = BackgroundServer(srv.settings).start()
    try:
        cookie = _login(other.url, s["vic"])[1]
        assert call(other.url, "GET", "/api/runs", s["vic"])[0] == 200
        assert call(other.url, "GET", "/api/runs", cookie=cookie)[0] == 200
        assert call(srv.url, "DELETE", "/api/tokens/vic", TOKEN)[0] == 200  # revoked in the first process
        deadline = time.monotonic() + 10
        while call(other.url, "GET", "/api/runs", cookie=cookie)[0] != 401:
            assert time.monotonic() < deadline, "the other process still takes the revoked token's session"
            time.sleep(0.1)
        assert call(other.url, "GET", "/api/runs", s["vic"])[0] == 401
    finally:
        other.stop()


def test_an_ingest_token_writes_only_the_runs_it_created(team):
    srv, s = team
    assert (
        call(srv.url, "POST", "/api/tokens", TOKEN, {"name": "box-13", "role": "ingest", "projects": ["nlp"]})[0] == 200
    )
    secret13 = call(srv.url, "POST", "/api/tokens", TOKEN, {"name": "box-14", "role": "ingest"})[1]["secret"]
    stream(srv.url, "nlp", s["box-12"])
    uid = call(srv.url, "GET", "/api/runs/1", TOKEN)[1]["uid"]
    hello = {"type": "hello", "protocol": protocol.PROTOCOL_VERSION, "run": {"uid": uid, "project": "nlp"}}
    url = srv.url.replace("http://", "ws://") + "/ws/ingest"
    with connect(url, additional_headers={"Authorization": f"Bearer {secret13}"}) as ws:
        ws.send(json.dumps(hello))
        answer = json.loads(ws.recv(timeout=10))
    assert answer["type"] == "error" and "only the runs it created" in answer["message"]
