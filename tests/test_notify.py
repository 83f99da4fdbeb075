"""Notifications that arrive, against real parts: a real HTTP receiver gets the webhooks (Slack, Discord,
JSON, one that fails twice first), a real SMTP server (aiosmtpd, in this process) gets the mail; one
incident pages once, with its root cause and a link; every delivery is recorded; the test button works."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller
from conftest import Api
from test_incidents import spirals_run
from waiting import wait_until

import gradwatch
from gradwatch_server.serve import BackgroundServer


class Receiver:
    """A real HTTP server recording every POST by path; ``/flaky`` answers 500 twice before it accepts."""

    def __init__(self):
        self.posts: dict[str, list] = {}
        self.failures = {"/flaky": 2}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if outer.failures.get(self.path, 0) > 0:
                    outer.failures[self.path] -= 1
                    self.send_response(500)
                else:
                    outer.posts.setdefault(self.path, []).append(body)
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


class Mailbox:
    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        self.messages.append((envelope.rcpt_tos, envelope.content.decode()))
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def parts(settings):
    receiver, box = Receiver(), Mailbox()
    smtp = Controller(box, hostname="127.0.0.1", port=_free_port())
    smtp.start()
    settings.smtp_url = f"smtp://127.0.0.1:{smtp.port}"
    settings.alert_email = "ops@example.com"
    settings.base_url = "http://gw.example"
    settings.notify_allow_hosts = "127.0.0.1"  # the receivers here are on loopback, which channels refuse by default
    srv = BackgroundServer(settings).start()
    yield srv, Api(srv.url), receiver, box
    srv.stop()
    smtp.stop()
    receiver.http.shutdown()


def _wait(fn, timeout=20.0):
    return wait_until(fn, timeout=timeout, interval=0.1)


def test_an_incident_pages_each_channel_once_with_its_cause_and_a_link(parts):
    srv, api, rx, box = parts
    chans = [
        {"kind": "webhook", "url": rx.url + "/slack", "format": "slack"},
        {"kind": "webhook", "url": rx.url + "/discord", "format": "discord", "min_severity": "critical"},
        {"kind": "webhook", "url": rx.url + "/flaky", "format": "json"},
        {"kind": "webhook", "url": rx.url + "/never", "format": "json", "min_severity": "critical"},
        {"kind": "email", "to": ["team@example.com"], "min_severity": "warning"},
        {"kind": "webhook", "url": "http://127.0.0.1:9/closed", "format": "slack"},
    ]
    rx.failures["/never"] = 99
    status, body = api.request("PUT", "/api/projects/inc/channels", {"channels": chans})
    assert status == 200, body
    assert api.request("PUT", "/api/projects/inc/channels", {"channels": [{"kind": "sms"}]})[0] == 400
    spirals_run(gradwatch.init(project="inc", name="lr3", server=srv.url), 3.0)
    root = _wait(lambda: api.get("/api/runs/1/incidents"))[0]["id"]  # the divergence's incident
    mine = lambda: [d for d in api.get("/api/projects/inc/deliveries") if d["incident_id"] == root]  # noqa: E731
    got = _wait(lambda: len(mine()) >= 7 and mine())
    time.sleep(1.0)  # anything more (a consequence paging again) would show now
    deliveries = mine()  # (a loaded machine may add a throughput_drop incident of its own: not this one)
    assert len(deliveries) == 7, deliveries  # six channels + the server's alert_email, once each
    by = {d["channel"]: d for d in got}
    assert by[f"json {rx.url}/flaky"]["status"] == "delivered" and by[f"json {rx.url}/flaky"]["attempts"] == 3
    assert by[f"json {rx.url}/never"]["status"] == "failed" and "500" in by[f"json {rx.url}/never"]["reason"]
    assert by["slack http://127.0.0.1:9/closed"]["status"] == "failed"
    slack = [p for p in rx.posts["/slack"] if "throughput_drop" not in p["text"]]  # the load's own, if any
    assert len(slack) == 1 and slack[0]["text"].startswith("gradwatch [critical]: ")
    assert "http://gw.example/runs/1" in slack[0]["text"] and "Cause: learning rate" in slack[0]["text"]
    assert "→" in slack[0]["text"]  # the incident's story, not one alert
    assert len(rx.posts["/discord"]) == 1 and "content" in rx.posts["/discord"][0]
    assert rx.posts["/flaky"][0]["incident"]["root"]["step"] == 1
    mails = {tuple(to): text for to, text in box.messages}
    assert set(mails) == {("team@example.com",), ("ops@example.com",)}
    assert "gradwatch [" in mails[("team@example.com",)] and "http://gw.example/runs/1" in mails[("ops@example.com",)]


def test_the_test_button_sends_to_every_channel(parts):
    srv, api, rx, box = parts
    api.request(
        "PUT", "/api/projects/p/channels", {"channels": [{"kind": "webhook", "url": rx.url + "/t", "format": "json"}]}
    )
    status, body = api.request("POST", "/api/projects/p/channels/test")
    assert status == 200 and [r["status"] for r in body["results"]] == ["delivered", "delivered"]  # + alert_email
    assert rx.posts["/t"][0]["test"] is True
    assert any("ops@example.com" in to for to, _ in box.messages)
    _wait(lambda: len(api.get("/api/projects/p/deliveries")) == 2)


def test_channels_page_saves_and_sends_a_test(parts, page):
    srv, api, rx, box = parts
    page.goto(srv.url + "/rules?project=web")
    page.wait_for_selector("#builtin tr[data-kind='loss_spike']")
    page.click("#add-channel")  # the form is built from the kinds the server serves (their option schemas)
    kinds = page.locator("#channels .channel [data-field='channel-kind'] option")
    assert kinds.evaluate_all("os => os.map(o => o.value)") == [
        k["name"] for k in api.get("/api/projects/web/channels")["kinds"]
    ]
    page.locator("#channels .channel [data-field='channel-kind']").select_option("email")
    assert page.locator("#channels .channel [data-option='to']").count() == 1
    page.locator("#channels .channel [data-field='channel-kind']").select_option("discord")
    page.locator("#channels .channel [data-option='url']").fill(rx.url + "/hook")
    page.click("#save-channels")
    page.wait_for_selector("#channel-message:has-text('channels saved')")
    assert api.get("/api/projects/web/channels")["channels"][0]["format"] == "discord"
    page.click("#test-channels")
    page.wait_for_selector("#deliveries .delivery[data-status='delivered']")
    assert "content" in rx.posts["/hook"][0]
    assert page.locator("#deliveries .delivery").count() == 2  # the channel and the server's alert_email
    assert not page.js_errors
