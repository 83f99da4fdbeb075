"""Channels as a way out of the server (issue #30), against real listeners: under the defaults a channel never
reaches loopback, private or metadata addresses; redirects are not followed; failures say nothing of what
listens where; secrets are write-only; the test button is limited; mail and Discord text stay inert."""

from __future__ import annotations

import dataclasses
import socket
import threading

import pytest
from aiosmtpd.controller import Controller
from conftest import Api
from test_incidents import spirals_run
from test_notify import Mailbox, Receiver, _free_port, _wait

import gradwatch
from gradwatch_server.notify import egress
from gradwatch_server.serve import BackgroundServer


class Listener:
    """A TCP listener that counts connections and answers each with a banner (an SSH-like internal service)."""

    def __init__(self, banner: bytes = b"SSH-2.0-OpenSSH_9.6 internal-secret-banner\r\n"):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port, self.connections, self.banner = self.sock.getsockname()[1], 0, banner
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            try:
                conn.sendall(self.banner)
            finally:
                conn.close()

    def close(self):
        self.sock.close()


def _put(api: Api, project: str, chans: list) -> None:
    status, body = api.request("PUT", f"/api/projects/{project}/channels", {"channels": chans})
    assert status == 200, body


def test_under_the_defaults_a_channel_never_reaches_this_machine(server, api):
    listener = Listener()
    try:
        url = f"http://127.0.0.1:{listener.port}/hook"
        _put(api, "p", [{"kind": "webhook", "url": url, "format": "json"}])
        status, body = api.request("POST", "/api/projects/p/channels/test")
        assert status == 200
        (result,) = body["results"]
        assert result["status"] == "failed" and "--notify-allow-hosts" in result["reason"]
        spirals_run(gradwatch.init(project="p", name="r", server=server.url), 3.0)  # a real incident too
        _wait(lambda: api.get("/api/projects/p/deliveries")[0]["incident_id"] is not None)
        assert listener.connections == 0
    finally:
        listener.close()
    for host in ("169.254.169.254", "10.0.0.1", "[::1]", "localhost", "0.0.0.0"):
        with pytest.raises(egress.Refused):
            egress.post(f"http://{host}/latest/meta-data/", {}, frozenset())


def test_failures_are_generic_and_redirects_are_not_followed(settings):
    banner, closed = Listener(), _free_port()
    rx = Receiver()
    srv = BackgroundServer(dataclasses.replace(settings, notify_allow_hosts="127.0.0.1")).start()
    api = Api(srv.url)
    try:
        chans = [
            {"kind": "webhook", "url": f"http://127.0.0.1:{banner.port}/x", "format": "json"},
            {"kind": "webhook", "url": f"http://127.0.0.1:{closed}/x", "format": "json"},
        ]
        _put(api, "p", chans)
        results = api.request("POST", "/api/projects/p/channels/test")[1]["results"]
        assert banner.connections >= 1  # allowed now: it was reached
        reasons = [r["reason"] for r in results]
        assert reasons[0] == reasons[1] and "OpenSSH" not in reasons[0]  # open and closed ports look alike
        assert all("OpenSSH" not in (d["reason"] or "") for d in api.get("/api/projects/p/deliveries"))
    finally:
        srv.stop()
        banner.close()
    with pytest.raises(OSError, match="302"):
        egress.post(_redirecting(rx.url + "/target"), {}, frozenset({"127.0.0.1"}))
    assert "/target" not in rx.posts
    rx.http.shutdown()


def _redirecting(location: str) -> str:
    """A receiver that answers 302 to ``location``; its URL."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.send_response(302)
            self.send_header("Location", location)
            self.end_headers()

        def log_message(self, *args):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{http.server_address[1]}/hook"


def test_secrets_are_write_only_and_the_test_button_is_limited(settings):
    rx = Receiver()
    srv = BackgroundServer(dataclasses.replace(settings, notify_allow_hosts="127.0.0.1")).start()
    api = Api(srv.url)
    try:
        secret_url = rx.url + "/services/T000/B000/XXXXsecretXXXX"
        _put(api, "p", [{"kind": "webhook", "url": secret_url, "format": "slack"}])
        shown = api.get("/api/projects/p/channels")["channels"]
        assert "secret" not in shown[0]["url"] and shown[0]["url"].endswith("XXXX")
        _put(api, "p", shown)  # sent back as shown (a script editing min_severity): the secret stays
        assert api.request("POST", "/api/projects/p/channels/test")[0] == 200
        assert len(rx.posts["/services/T000/B000/XXXXsecretXXXX"]) == 1
        status, body = api.request("POST", "/api/projects/p/channels/test")
        assert status == 429 and "a minute" in body["error"]
        many = [{"kind": "email", "to": [f"u{i}@example.com" for i in range(30)]} for _ in range(2)]
        status, body = api.request("PUT", "/api/projects/p/channels", {"channels": many})
        assert status == 400 and "recipients" in body["error"]
    finally:
        srv.stop()
        rx.http.shutdown()


def test_a_run_named_with_cr_lf_still_gets_its_mail_on_one_subject_line(settings):
    box = Mailbox()
    smtp = Controller(box, hostname="127.0.0.1", port=_free_port())
    smtp.start()
    srv = BackgroundServer(
        dataclasses.replace(settings, smtp_url=f"smtp://127.0.0.1:{smtp.port}", alert_email="ops@example.com")
    ).start()
    try:
        spirals_run(gradwatch.init(project="p", name="evil\r\nBcc: victim@example.com", server=srv.url), 3.0)
        _wait(lambda: box.messages)
        (to, text), *_ = box.messages
        assert to == ["ops@example.com"] and "victim" not in " ".join(to)
        import email

        mail = email.message_from_string(text)
        assert "evil Bcc: victim@example.com" in " ".join(str(mail["Subject"]).split())  # inert, in one header
        assert mail["Bcc"] is None
    finally:
        srv.stop()
        smtp.stop()


def test_discord_markdown_in_a_run_name_is_shown_as_written():
    from gradwatch_server.notify.kinds import discord

    note = {
        "run": {"name": "[click me](https://evil.example) **x**", "project": "p"},
        "alert": {"kind": "loss_spike", "step": 3, "message": "`code`"},
        "link": "http://gw.example/runs/1",
    }
    content = discord.render(note)["content"]
    assert "[click me](https" not in content and "\\[click me\\]\\(https\\:" in content and "\\*\\*x" in content
    assert content.endswith("\nhttp://gw.example/runs/1")  # the run's own link stays a link
