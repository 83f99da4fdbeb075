"""Issue #9: each attack done for real against a running server (raw sockets, websockets, Chromium)."""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from gradwatch import metadata
from gradwatch_server.serve import BackgroundServer
from gradwatch_server.settings import Settings
from gradwatch_server.web.security import Refusal, check_host

TOKEN = "tok-Secret-0123456789abcdef"
EVIL = "http://evil.example"
WS_PATHS = ("/ws/ingest", "/ws/runs", "/ws/runs/1")


def raw(url: str, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    """One HTTP request with exactly these headers (Host included; None leaves one out)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    headers = {"Host": parts.netloc, **(headers or {})}
    if body is not None:
        headers["Content-Length"] = str(len(body))
    for name, value in headers.items():
        if value is not None:
            conn.putheader(name, value)
    conn.endheaders(body)
    resp = conn.getresponse()
    data = b"" if resp.status == 101 else resp.read()
    conn.close()
    return resp.status, resp.headers, data


def upgrade(url: str, path: str, headers: dict | None = None):
    """A websocket upgrade request by hand (to control Host); 101 means it was accepted."""
    key = base64.b64encode(os.urandom(16)).decode()
    return raw(
        url,
        "GET",
        path,
        {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Key": key,
            "Sec-WebSocket-Version": "13",
            **(headers or {}),
        },
    )


def ws_status(url: str, path: str, **kwargs) -> tuple[int, str]:
    """Open a websocket the way the Python client does: 101 or the refusal's status and body."""
    try:
        with connect(url.replace("http://", "ws://") + path, open_timeout=10, **kwargs):
            return 101, ""
    except InvalidStatus as exc:
        return exc.response.status_code, bytes(exc.response.body or b"").decode()


def error_of(data: bytes) -> str:
    return json.loads(data)["error"]


@pytest.fixture
def token_server(settings):
    srv = BackgroundServer(dataclasses.replace(settings, token=TOKEN)).start()
    yield srv
    srv.stop()


# --- cross-site websockets and writes (always on) ---------------------------------------------


@pytest.mark.parametrize("path", WS_PATHS)
def test_websocket_with_a_foreign_origin_is_refused(server, path):
    status, body = ws_status(server.url, path, origin=EVIL)
    assert status == 403 and "cross-site" in body and EVIL in body
    assert ws_status(server.url, path)[0] == 101  # a training client sends no Origin
    assert ws_status(server.url, path, origin=server.url)[0] == 101  # the dashboard's own pages


def test_origin_null_and_other_port_are_foreign(server):
    port = urlsplit(server.url).port
    for origin in ("null", f"http://127.0.0.1:{port + 1}", f"http://localhost:{port}"):
        assert ws_status(server.url, "/ws/runs", origin=origin)[0] == 403, origin


def test_cross_site_writes_are_refused(server, api):
    status, _, data = raw(server.url, "DELETE", "/api/runs/1", {"Origin": EVIL})
    assert status == 403 and "cross-site" in error_of(data)
    assert raw(server.url, "DELETE", "/api/runs/1")[0] == 404  # no Origin: reaches the route


def test_foreign_page_in_chromium_cannot_open_the_websocket(server, page):
    page.route("http://evil.example/**", lambda route: route.fulfill(body="<p>evil</p>", content_type="text/html"))
    page.goto("http://evil.example/")
    result = page.evaluate(
        """url => new Promise(done => {
        const ws = new WebSocket(url);
        ws.onmessage = e => done("read: " + e.data); ws.onerror = () => done("refused");
    })""",
        server.url.replace("http://", "ws://") + "/ws/runs",
    )
    assert result == "refused"


# --- DNS rebinding ---------------------------------------------------------------------------


def test_rebinding_host_is_refused_on_loopback(server):
    port = urlsplit(server.url).port
    status, _, data = raw(server.url, "GET", "/api/runs", {"Host": f"evil.example:{port}"})
    assert status == 403 and "--allowed-hosts evil.example" in error_of(data)
    assert upgrade(server.url, "/ws/runs", {"Host": f"evil.example:{port}"})[0] == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert raw(server.url, "GET", "/api/runs", {"Host": host})[0] == 200, host
    assert upgrade(server.url, "/ws/runs", {"Host": f"localhost:{port}"})[0] == 101
    status, _, data = raw(server.url, "GET", "/api/runs", {"Host": None})
    assert status == 400 and "Host" in error_of(data)


def test_allowed_hosts_adds_names(settings):
    srv = BackgroundServer(dataclasses.replace(settings, allowed_hosts="box.lan, gw.example.org")).start()
    try:
        assert raw(srv.url, "GET", "/api/runs", {"Host": "gw.example.org:8765"})[0] == 200
        assert raw(srv.url, "GET", "/api/runs", {"Host": "box.lan"})[0] == 200
        assert raw(srv.url, "GET", "/api/runs", {"Host": "other.lan"})[0] == 403
    finally:
        srv.stop()


def test_host_check_off_the_loopback_only_with_allowed_hosts():
    check_host(Settings(host="0.0.0.0"), {"host": "anything.example"})  # the token is the guard there
    check_host(Settings(host="127.0.0.1", allowed_hosts="*"), {"host": "anything.example"})
    with pytest.raises(Refusal) as refused:
        check_host(Settings(host="0.0.0.0", allowed_hosts="gw.lan"), {"host": "anything.example"})
    assert refused.value.status == 403


# --- the token: API, both websockets, pages ----------------------------------------------------


def test_api_needs_the_token(token_server):
    url = token_server.url
    status, headers, data = raw(url, "GET", "/api/runs")
    assert status == 401 and "Authorization: Bearer" in error_of(data)
    assert headers["WWW-Authenticate"].startswith("Bearer")
    for wrong in (f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN, "Bearer "):
        assert raw(url, "GET", "/api/runs", {"Authorization": wrong})[0] == 401, wrong
    status, _, data = raw(url, "GET", "/api/runs", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and json.loads(data) == []
    assert raw(url, "GET", "/openapi.json")[0] == 401
    assert raw(url, "GET", "/static/lib/dom.js")[0] == 401
    # a forged cookie (the raw token) is not a session
    assert raw(url, "GET", "/api/runs", {"Cookie": f"gradwatch_session={TOKEN}"})[0] == 401


def test_healthz_stays_open(token_server):
    status, _, data = raw(token_server.url, "GET", "/healthz")
    assert status == 200 and json.loads(data) == {"status": "ok"}


@pytest.mark.parametrize("path", WS_PATHS)
def test_websockets_need_the_token(token_server, path):
    status, body = ws_status(token_server.url, path)
    assert status == 401 and "Bearer" in body
    assert ws_status(token_server.url, path, additional_headers={"Authorization": "Bearer nope"})[0] == 401
    assert ws_status(token_server.url, path, additional_headers={"Authorization": f"Bearer {TOKEN}"})[0] == 101


def test_runs_feed_with_the_token_streams(token_server):
    url = token_server.url.replace("http://", "ws://") + "/ws/runs"
    with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "subscribed"


def test_a_page_without_a_session_goes_to_the_login_form(token_server):
    status, headers, _ = raw(token_server.url, "GET", "/runs/3", {"Accept": "text/html"})
    assert status == 303 and headers["Location"] == "/login?next=/runs/3"
    status, headers, _ = raw(token_server.url, "GET", "/compare?ids=1,2", {"Accept": "text/html"})
    assert status == 303 and headers["Location"] == "/login?next=/compare%3Fids%3D1%2C2"


def test_pages_in_chromium_log_in_with_the_form(token_server, page):
    page.goto(token_server.url + "/compare?ids=1")
    assert urlsplit(page.url).path == "/login"
    page.fill("#token", "wrong-token")
    with page.expect_navigation():
        page.click("#login")
    assert "not right" in page.text_content("#message")
    page.fill("#token", TOKEN)
    with page.expect_navigation():
        page.click("#login")
    assert urlsplit(page.url).path == "/compare" and urlsplit(page.url).query == "ids=1"
    (cookie,) = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
    page.goto(token_server.url + "/")
    page.wait_for_selector("#runs")
    assert page.evaluate("fetch('/api/runs').then(r => r.status)") == 200
    assert _page_websocket(page, token_server) == "subscribed"
    assert TOKEN not in page.content()
    # Back on the login page while logged in: it goes straight on.
    page.goto(token_server.url + "/login?next=/compare")
    page.wait_for_url(re.compile(r".*/compare$"))


def test_one_time_link_works_once(token_server, browser):
    link = token_server.login_link()
    assert TOKEN not in link
    first = browser.new_context()
    try:
        pg = first.new_page()
        pg.goto(link)
        assert urlsplit(pg.url).path == "/" and pg.evaluate("fetch('/api/runs').then(r => r.status)") == 200
        assert _page_websocket(pg, token_server) == "subscribed"
    finally:
        first.close()
    second = browser.new_context()
    try:
        pg = second.new_page()
        response = pg.goto(link)
        assert response.status == 401 and "already used" in pg.text_content("#message")
        assert pg.evaluate("fetch('/api/runs').then(r => r.status)") == 401
        assert _page_websocket(pg, token_server) == "refused"
    finally:
        second.close()


def _page_websocket(pg, srv) -> str:
    """Open /ws/runs from the page (the browser sends its cookie, never a header)."""
    return pg.evaluate(
        """url => new Promise(done => {
        const ws = new WebSocket(url);
        ws.onmessage = e => { done(JSON.parse(e.data).type); ws.close(); }; ws.onerror = () => done("refused");
    })""",
        srv.url.replace("http://", "ws://") + "/ws/runs",
    )


def test_login_refuses_cross_site_posts_and_open_redirects(token_server):
    body = f"token={TOKEN}&next=//evil.example/x".encode()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert raw(token_server.url, "POST", "/login", {**form, "Origin": EVIL}, body)[0] == 403
    status, headers, _ = raw(token_server.url, "POST", "/login", form, body)
    assert status == 303 and headers["Location"] == "/"
    assert "HttpOnly" in headers["Set-Cookie"] and "SameSite=strict" in headers["Set-Cookie"]
    assert TOKEN not in headers["Set-Cookie"]


# --- limits ---------------------------------------------------------------------------------


def test_connection_cap_refuses_with_a_reason(settings):
    srv = BackgroundServer(dataclasses.replace(settings, max_connections=2)).start()
    url = srv.url.replace("http://", "ws://") + "/ws/runs"
    try:
        with connect(url) as a, connect(url):
            a.recv(timeout=10)
            status, body = ws_status(srv.url, "/ws/runs")
            assert status == 503 and "max_connections=2" in body
            assert raw(srv.url, "GET", "/api/runs")[0] == 503
        for _ in range(100):  # the server notices the closed sockets
            if raw(srv.url, "GET", "/api/runs")[0] == 200:
                break
            time.sleep(0.05)
        assert ws_status(srv.url, "/ws/runs")[0] == 101
    finally:
        srv.stop()


def test_oversized_body_is_refused_before_it_is_read(settings):
    srv = BackgroundServer(dataclasses.replace(settings, max_frame_bytes=1000)).start()
    try:
        status, _, data = raw(
            srv.url,
            "PATCH",
            "/api/runs/1",
            {"Content-Type": "application/json"},
            json.dumps({"notes": "x" * 2000}).encode(),
        )
        assert status == 413 and "max_frame_bytes" in error_of(data)
    finally:
        srv.stop()


# --- the command line: printed link, warning, no token anywhere ------------------------------


def _serve(tmp_path, *args, env=None):
    """``gradwatch serve`` as a real process, answering; returns it and the lines it printed up to the URL."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gradwatch_server.cli",
            "serve",
            "--port",
            "0",
            "--db",
            f"sqlite:///{tmp_path / 'cli.db'}",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    lines = []
    while not any("dashboard at" in line for line in lines):
        line = proc.stdout.readline()
        assert line, f"server exited: {proc.stderr.read()}"
        lines.append(line)
    base = re.search(r"dashboard at (\S+)", lines[-1]).group(1)
    for _ in range(200):  # printed before uvicorn listens
        try:
            raw(base, "GET", "/healthz")
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
    return proc, lines


def _stop(proc) -> str:
    proc.terminate()
    out, err = proc.communicate(timeout=20)
    return out + err


def test_token_never_printed_and_one_time_link_printed(tmp_path):
    proc, lines = _serve(tmp_path, "--log-level", "debug", env={"GRADWATCH_TOKEN": TOKEN})
    try:
        link_line = proc.stdout.readline()
        link = re.search(r"(http://\S+/login\?once=\S+)", link_line).group(1)
        parts = urlsplit(link)
        base = f"http://{parts.netloc}"
        assert raw(base, "GET", "/api/runs")[0] == 401
        assert raw(base, "GET", "/api/runs", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert ws_status(base, "/ws/runs", additional_headers={"Authorization": f"Bearer {TOKEN}"})[0] == 101
        status, headers, _ = raw(base, "GET", f"{parts.path}?{parts.query}")
        assert status == 303 and "gradwatch_session=" in headers["Set-Cookie"]
        assert raw(base, "GET", f"{parts.path}?{parts.query}")[0] == 401  # once only
        assert raw(base, "GET", "/", {"Cookie": headers["Set-Cookie"].split(";")[0]})[0] == 200
    finally:
        logs = _stop(proc)
    assert TOKEN not in "".join(lines) + link_line + logs
    assert "authorization: ***" in logs  # debug logging showed the headers, so the absence above means something
    assert parts.query.split("=", 1)[1] not in logs and "once=***" in logs


def test_help_never_shows_the_token():
    out = subprocess.run(
        [sys.executable, "-m", "gradwatch_server.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "GRADWATCH_TOKEN": TOKEN},
        check=True,
    ).stdout
    assert "--token" in out and TOKEN not in out


def test_exposed_without_a_token_warns_loudly(tmp_path):
    proc, _ = _serve(tmp_path, "--host", "0.0.0.0")
    err = _stop(proc)
    assert "WARNING" in err and "NO TOKEN" in err and "--token" in err


# --- what the training process records about itself -----------------------------------------


def test_secrets_in_the_command_line_are_redacted():
    argv = [
        "train.py",
        "--token",
        "s1",
        "--hf-token=s2",
        "--lr",
        "0.1",
        "db.password=s3",
        "--api_key",
        "s4",
        "--DB_PASSWORD",
        "s5",
        "postgresql://u:s6@db/x",
        "--steps",
        "10",
        "--verbose",
    ]
    out = metadata.redact_argv(argv)
    assert not any(s in " ".join(out) for s in ("s1", "s2", "s3", "s4", "s5", "s6"))
    assert out[:3] == ["train.py", "--token", "***"] and "--hf-token=***" in out
    assert out[-3:] == ["--steps", "10", "--verbose"] and "0.1" in out


def test_recorded_run_metadata_has_no_secrets(tmp_path):
    code = "import json, gradwatch.metadata as m; print(json.dumps(m.collect()))"
    env = {**os.environ, "GRADWATCH_TOKEN": "env-secret-1", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code, "--password", "argv-secret-2", "--key=argv-secret-3"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=tmp_path,
    ).stdout
    meta = json.loads(out)
    assert "secret" not in out
    assert meta["env"]["GRADWATCH_TOKEN"] == "***" and meta["env"]["RANK"] == "3"
    assert (meta["world_size"], meta["rank"], meta["local_rank"]) == (8, 3, 1)


class _FakeCuda:
    """torch.cuda as seen before the script called set_device: records every call."""

    def __init__(self, initialized: bool):
        self.initialized, self.calls = initialized, []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append(name)
            return {
                "is_available": True,
                "device_count": 4,
                "is_initialized": self.initialized,
                "current_device": 2,
            }.get(name, type("Props", (), {"name": "H200", "total_memory": 1 << 30}))

        return call


@pytest.mark.parametrize("initialized", [False, True])
def test_device_info_creates_no_cuda_context(initialized):
    cuda = _FakeCuda(initialized)
    fake_torch = type("Torch", (), {"cuda": cuda, "version": type("V", (), {"cuda": "12.8"})})
    info = metadata.device_info(fake_torch)
    assert info["cuda_device_count"] == 4 and info["cuda_version"] == "12.8"
    if initialized:  # the script made its context already: reading its properties costs nothing
        assert info["device"] == "cuda:2 H200"
    else:
        assert info["device"] == "cuda"
        assert set(cuda.calls) <= {"is_available", "device_count", "is_initialized"}


# --- issue #18: sessions, redirects, API docs --------------------------------------------------


def _login(url: str, headers: dict | None = None) -> tuple[str, str]:
    """POST the token to /login; returns (the 'gradwatch_session=...' pair, the whole Set-Cookie)."""
    form = {"Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
    status, got, _ = raw(url, "POST", "/login", form, f"token={TOKEN}&next=/".encode())
    assert status == 303
    return got["Set-Cookie"].split(";")[0], got["Set-Cookie"]


def test_sessions_are_random_and_logout_ends_only_its_own(token_server):
    url = token_server.url
    first, second = _login(url)[0], _login(url)[0]
    assert first != second and TOKEN not in first
    for cookie in (first, second):
        assert raw(url, "GET", "/api/runs", {"Cookie": cookie})[0] == 200
    status, headers, _ = raw(url, "POST", "/logout", {"Cookie": first}, b"")
    assert status == 303 and headers["Location"] == "/login" and 'gradwatch_session=""' in headers["Set-Cookie"]
    assert raw(url, "GET", "/api/runs", {"Cookie": first})[0] == 401
    assert raw(url, "GET", "/api/runs", {"Cookie": second})[0] == 200
    assert raw(url, "POST", "/logout", {"Cookie": second, "Origin": EVIL}, b"")[0] == 403  # no cross-site logout


def test_a_session_expires(settings):
    srv = BackgroundServer(dataclasses.replace(settings, token=TOKEN, session_days=1.5 / 86400)).start()
    try:
        cookie, set_cookie = _login(srv.url)
        assert "Max-Age=1" in set_cookie
        assert raw(srv.url, "GET", "/api/runs", {"Cookie": cookie})[0] == 200
        time.sleep(1.8)
        assert raw(srv.url, "GET", "/api/runs", {"Cookie": cookie})[0] == 401
    finally:
        srv.stop()


def test_a_malformed_cookie_of_another_app_does_not_hide_the_session(token_server):
    cookie = _login(token_server.url)[0]
    mixed = f'other="unterminated; x=[1,2]; {cookie}; {{bad}}'
    assert raw(token_server.url, "GET", "/api/runs", {"Cookie": mixed})[0] == 200


def test_secure_cookie_only_through_a_trusted_proxy(settings):
    https = {"X-Forwarded-Proto": "https"}
    srv = BackgroundServer(dataclasses.replace(settings, token=TOKEN, trusted_proxy="10.1.2.3")).start()
    try:
        assert "Secure" not in _login(srv.url, https)[1]  # 127.0.0.1 is not the trusted proxy here
    finally:
        srv.stop()
    srv = BackgroundServer(dataclasses.replace(settings, token=TOKEN)).start()
    try:
        assert "Secure" not in _login(srv.url, https)[1]  # no --trusted-proxy: not even 127.0.0.1 is believed
    finally:
        srv.stop()
    srv = BackgroundServer(dataclasses.replace(settings, token=TOKEN, trusted_proxy="127.0.0.1")).start()
    try:
        assert "Secure" in _login(srv.url, https)[1]
        assert "Secure" not in _login(srv.url)[1]
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "target", ["/%09/evil.example", "/\t/evil.example", "/\n/evil.example", "//evil.example", "/\\evil", "http://x"]
)
def test_login_next_is_only_a_same_origin_path(token_server, target):
    from urllib.parse import quote

    from gradwatch_server.web.routes.auth import safe_next

    assert safe_next(target.replace("%09", "\t")) == "/"
    status, headers, _ = raw(
        token_server.url,
        "POST",
        "/login",
        {"Content-Type": "application/x-www-form-urlencoded"},
        f"token={TOKEN}&next={quote(target.replace('%09', chr(9)))}".encode(),
    )
    assert status == 303 and headers["Location"] == "/"
    assert safe_next("/runs/3?tab=alerts") == "/runs/3?tab=alerts"


def test_api_docs_are_off_unless_asked_for(settings):
    srv = BackgroundServer(settings).start()
    try:
        assert raw(srv.url, "GET", "/docs")[0] == 404 and raw(srv.url, "GET", "/redoc")[0] == 404
        assert raw(srv.url, "GET", "/openapi.json")[0] == 200
    finally:
        srv.stop()
    srv = BackgroundServer(dataclasses.replace(settings, api_docs=True)).start()
    try:
        assert raw(srv.url, "GET", "/docs")[0] == 200
    finally:
        srv.stop()


def test_the_runs_language_has_depth_and_width_limits_answered_as_400s(server, api):
    """400-deep parentheses and 70 summary keys were a 500 with a traceback; now one line each, a 400."""
    from urllib.parse import quote

    deep = "(" * 400 + "config.lr < 1" + ")" * 400
    status, body = api.request("GET", "/api/runs?where=" + quote(deep))
    assert status == 400 and "nests parentheses 400 deep" in body["error"]
    wide = " or ".join(f"summary.k{i}.min < 1" for i in range(70))
    status, body = api.request("GET", "/api/runs?where=" + quote(wide))
    assert status == 400 and "70 config/summary fields" in body["error"]
    ok = " or ".join(f"summary.k{i}.min < 1" for i in range(30))
    assert api.request("GET", "/api/runs?where=" + quote(ok))[0] == 200


def test_a_trickling_request_body_is_cut_off(settings):
    """A slow POST (headers in time, then a byte now and then) no longer holds its slot forever: a 408."""
    srv = BackgroundServer(dataclasses.replace(settings, header_timeout=1.0)).start()
    try:
        port = int(srv.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
            head = f"PUT /api/projects/p/rules HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 100000\r\n"
            sock.sendall((head + "Content-Type: application/json\r\n\r\n{").encode())
            t0 = time.monotonic()
            answer = sock.recv(4096).decode()
            assert answer.startswith("HTTP/1.1 408") and time.monotonic() - t0 < 10
    finally:
        srv.stop()
