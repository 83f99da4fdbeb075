"""Alerts reach a webhook receiver started by the test, with retries; and they arrive fast."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import gradwatch
from gradwatch_server.serve import BackgroundServer


class Receiver:
    """An HTTP server that fails the first ``fail_first`` posts, then records bodies."""

    def __init__(self, fail_first: int = 0):
        self.bodies: list = []
        self.fail_left = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if outer.fail_left > 0:
                    outer.fail_left -= 1
                    self.send_response(503)
                else:
                    outer.bodies.append((time.time(), body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def wait(self, n: int, timeout: float = 20.0) -> list:
        deadline = time.time() + timeout
        while len(self.bodies) < n and time.time() < deadline:
            time.sleep(0.05)
        return self.bodies


def test_alert_is_posted_with_slack_text_after_retries(settings):
    receiver = Receiver(fail_first=2)
    srv = BackgroundServer(dataclasses.replace(settings, webhook=receiver.url)).start()
    try:
        run = gradwatch.init(project="hooks", name="nan-run", server=srv.url, flush_interval=0.05)
        for i in range(10):
            run.log({"loss": 1.0 if i != 6 else float("nan")})
        bad_step_time = time.time()
        run.finish()
        ((received_at, body),) = receiver.wait(1)
        assert body["alert"]["kind"] == "nan_loss" and body["alert"]["step"] == 6
        assert "nan_loss" in body["text"] and "nan-run" in body["text"]
        assert received_at - bad_step_time < 10  # includes two failed attempts with backoff
    finally:
        srv.stop()
        receiver.httpd.shutdown()


def test_bad_step_to_alert_latency_is_sub_second(server, api):
    run = gradwatch.init(project="hooks", name="latency", server=server.url, flush_interval=0.1)
    for _i in range(20):
        run.log({"loss": 1.0})
    time.sleep(0.3)
    t0 = time.time()
    run.log({"loss": float("inf")})
    while not api.get("/api/runs/1/alerts") and time.time() - t0 < 10:
        time.sleep(0.01)
    latency = time.time() - t0
    run.finish()
    assert api.get("/api/runs/1/alerts")[0]["kind"] == "nan_loss"
    print(f"bad step -> alert visible over HTTP: {latency * 1000:.0f} ms")
    assert latency < 1.0


# --- issue #18: Slack markup escaped; one run's flood cannot starve another's alerts -----------


def test_slack_markup_in_names_and_messages_is_escaped():
    from gradwatch_server.live.webhook import payload

    alert = {"run_id": 3, "severity": "warning", "kind": "loss_spike", "step": 5, "message": "<!here> & <http://x|y>"}
    text = payload(alert, {"name": "<!channel> <https://evil.example|click me>"})["text"]
    assert "<!" not in text and "<http" not in text and "|click me>" not in text
    assert "&lt;!channel&gt; &lt;https://evil.example|click me&gt;" in text and "&amp;" in text


def test_webhook_posts_are_rate_limited_per_run_and_taken_in_turns():
    from gradwatch_server.live.webhook import WebhookSender

    receiver = Receiver()
    sender = WebhookSender(receiver.url, per_run=5)
    try:
        for i in range(200):  # one run floods
            sender.send({"text": f"flood {i}", "run": 1}, 1)
        sender.send({"text": "quiet run's alert", "run": 2}, 2)
        bodies = [b for _, b in receiver.wait(6, timeout=10)]
        # the quiet run's alert is not behind the flood: at most the few flood posts ahead of it
        assert [b["text"] for b in bodies].index("quiet run's alert") <= 2
        time.sleep(0.3)
        assert len(receiver.bodies) == 6 and sender.suppressed[1] == 195
    finally:
        receiver.httpd.shutdown()
